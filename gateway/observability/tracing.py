"""OpenTelemetry traces: one span per request after the GenAI semantic conventions, exported over OTLP/HTTP.

Imported only when `tracing.enabled` (gateway/process/replica.py): a gateway without it loads none of this and
its requests pay nothing. With it, the request's way is instrumented from outside, at start-up, so that
gateway/http/pipeline.py holds no tracing code:

- the completion endpoints are wrapped (`Tracing.serve`): the request span starts there, child of the
  client's `traceparent`, and is the current one for the request's task (a context variable);
- the stages `authenticate` and `admit` (classify, route, price, reserve quota) become child spans;
- each pool's upstream client (`TracedUpstream`) opens one client span per attempt and sends the backend
  its `traceparent`, so the engine's own spans join the trace; the answer's first bytes give
  `gen_ai.response.id`;
- the `finish` stage ends them: the queue span (admitted → first dispatch), the first-token event, the
  GenAI usage and omnigate's attributes (tenant, pool, backend, bucket, priority, queue wait, outcome).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar, cast

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.relay.upstream import Response, Upstream
from gateway.request.ticket import FAILED_OUTCOMES, Ticket
from gateway.settings.config import TracingConfig

Stage = TypeVar("Stage", bound=Callable[..., Awaitable[Any]])

OPERATIONS = {
    "chat": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
    "speech": "speech",
}
"""The route's endpoint → `gen_ai.operation.name` (the conventions' names; speech has none there)."""

_PROPAGATOR = TraceContextTextMapPropagator()
_CONTEXT_HEADERS = (b"traceparent", b"tracestate")
_RESPONSE_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,256})"')
_ID_SCAN = 2048  # the answer's id is its first key; an answer without one in its first bytes has none


class RequestTrace:
    """The spans of one request while it runs: its own, and its open upstream attempt."""

    __slots__ = ("admitted_ns", "attempt", "attempts", "context", "first_dispatch_ns", "response_id", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.context = trace.set_span_in_context(span)
        self.admitted_ns: int | None = None
        self.first_dispatch_ns: int | None = None
        self.attempt: Span | None = None
        self.attempts = 0
        self.response_id: str | None = None

    def first_bytes(self, data: bytes) -> None:
        found = _RESPONSE_ID.search(data, 0, _ID_SCAN)
        if found is not None:
            self.response_id = found.group(1).decode("utf-8", "replace")


_CURRENT: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("omnigate_trace", default=None)


class _FirstBytes(collections.deque[bytes]):
    """A response's body buffer that shows its first bytes to the request's trace (the answer's id)."""

    __slots__ = ("_trace",)

    def __init__(self, chunks: Iterable[bytes], request: RequestTrace) -> None:
        super().__init__(chunks)
        self._trace: RequestTrace | None = request
        if self:  # the first bytes came with the headers
            request.first_bytes(b"".join(self))
            self._trace = None

    def append(self, data: bytes) -> None:
        if self._trace is not None:
            self._trace.first_bytes(data)
            self._trace = None
        super().append(data)


class TracedUpstream(Upstream):
    """The pool's upstream client with one CLIENT span per attempt and the W3C trace context sent along."""

    def __init__(self, max_connections: int, max_keepalive: int, tracer: trace.Tracer) -> None:
        super().__init__(max_connections, max_keepalive)
        self.tracer = tracer

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        connect_timeout: float,
        sent: Callable[[], None] | None = None,
        keep: Callable[[asyncio.Future[Response], Callable[[], None]], None] | None = None,
    ) -> Response:
        request = _CURRENT.get()
        if request is None:
            return await super().post(
                url, body, headers, connect_timeout=connect_timeout, sent=sent, keep=keep
            )
        now = time.time_ns()
        if request.attempt is not None:  # the previous attempt failed after its headers: retried
            request.attempt.set_status(Status(StatusCode.ERROR, "retried on another backend"))
            request.attempt.end(now)
        if request.first_dispatch_ns is None:
            request.first_dispatch_ns = now
        request.attempts += 1
        span = self.tracer.start_span(
            "omnigate.upstream",
            context=request.context,
            kind=SpanKind.CLIENT,
            start_time=now,
            attributes={"url.full": url, "omnigate.attempt": request.attempts},
        )
        request.attempt = span
        headers = dict(headers)
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
        try:
            response = await super().post(
                url, body, headers, connect_timeout=connect_timeout, sent=sent, keep=keep
            )
        except BaseException as e:
            span.record_exception(e)
            span.set_status(Status(StatusCode.ERROR, type(e).__name__))
            span.end()
            request.attempt = None
            raise
        span.set_attribute("http.response.status_code", response.status)
        if span.is_recording():
            response.chunks = _FirstBytes(response.chunks, request)
        return response


class _Served:
    """An endpoint inside its request span (an ASGI app object: starlette routes call it as one)."""

    def __init__(self, app: ASGIApp, tracer: trace.Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        carrier = {
            k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"] if k in _CONTEXT_HEADERS
        }
        span = self.tracer.start_span(
            "omnigate.request",
            context=_PROPAGATOR.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": scope["method"], "url.path": scope["path"]},
        )
        token = _CURRENT.set(RequestTrace(span))
        try:
            await self.app(scope, receive, send)
        finally:
            _CURRENT.reset(token)
            if span.is_recording():  # the finish stage did not run: an error before it
                span.end()


class Tracing:
    """The tracer provider (batching OTLP/HTTP exporter, parent-based ratio sampler) and the wrappers."""

    def __init__(
        self, config: TracingConfig, clock: Callable[[], float], providers: Mapping[str, str]
    ) -> None:
        self.clock = clock  # the gateway's: the ticket's times are on it
        self.providers = providers  # pool → its engines' kind (`gen_ai.provider.name`)
        self.provider = TracerProvider(
            resource=Resource.create({"service.name": config.service_name}),
            sampler=ParentBased(TraceIdRatioBased(config.sampling_ratio)),
        )
        exporter = OTLPSpanExporter(
            endpoint=config.endpoint, headers=dict(config.headers), timeout=config.timeout_s
        )
        self.provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=config.max_queue_size,
                schedule_delay_millis=config.schedule_delay_s * 1000,
            )
        )
        self.tracer = self.provider.get_tracer("omnigate")
        self.upstream = functools.partial(TracedUpstream, tracer=self.tracer)

    def shutdown(self) -> None:
        """Export what is left (blocking: run it off the event loop)."""
        self.provider.shutdown()

    def serve(self, app: ASGIApp) -> ASGIApp:
        """The endpoint with the request's span around it."""
        return _Served(app, self.tracer)

    def stage(self, name: str, stage: Stage) -> Stage:
        """A stage (authenticate, admit) run inside a child span of the request's."""
        tracer = self.tracer

        async def traced(*args: Any, **kwargs: Any) -> Any:
            request = _CURRENT.get()
            if request is None:  # not a completion (the model list authenticates too)
                return await stage(*args, **kwargs)
            span = tracer.start_span(name, context=request.context)  # not made current: nothing nests
            try:
                return await stage(*args, **kwargs)
            except BaseException as e:  # a refusal (bad key, quota) is the stage's error
                span.record_exception(e)
                span.set_status(Status(StatusCode.ERROR, type(e).__name__))
                raise
            finally:
                span.end()

        return cast(Stage, traced)

    def admit(self, admit: Stage) -> Stage:
        """The admit stage in its span; its end is where the queue span starts."""
        traced_admit = self.stage("omnigate.admit", admit)

        async def traced(ticket: Ticket, *args: Any, **kwargs: Any) -> Any:
            request = _CURRENT.get()
            result = await traced_admit(ticket, *args, **kwargs)
            if request is not None:
                request.admitted_ns = time.time_ns()
            return result

        return cast(Stage, traced)

    def finish(self, finish: Stage) -> Stage:
        """The finish stage, then the request's spans ended with what its ticket holds."""
        tracer, clock, providers = self.tracer, self.clock, self.providers

        async def traced(
            ticket: Ticket, ending: object, reservation: object, status: int, error: str | None
        ) -> None:
            await finish(ticket, ending, reservation, status, error)
            request = _CURRENT.get()
            if request is None or not request.span.is_recording():
                return
            now_ns, now = time.time_ns(), clock()

            def wall(t: float) -> int:
                return now_ns - int((now - t) * 1e9)

            if request.admitted_ns is not None:
                queue = tracer.start_span(
                    "omnigate.queue",
                    context=request.context,
                    start_time=request.admitted_ns,
                    attributes={"omnigate.priority.band": ticket.band, "omnigate.pool": ticket.pool},
                )
                queue.end(request.first_dispatch_ns or now_ns)
            attempt = request.attempt
            if attempt is not None:
                if ticket.first_token_at is not None:
                    attempt.add_event("omnigate.first_token", timestamp=wall(ticket.first_token_at))
                if ticket.first_audio_at is not None:
                    attempt.add_event("omnigate.first_audio", timestamp=wall(ticket.first_audio_at))
                if ticket.backend:
                    attempt.set_attribute("omnigate.backend", ticket.backend)
                if ticket.outcome in FAILED_OUTCOMES:  # cut, timed out or answered an error mid-stream
                    attempt.set_status(Status(StatusCode.ERROR, ticket.error or ticket.outcome.value))
                attempt.end(wall(ticket.finished_at) if ticket.finished_at is not None else now_ns)
            _request_attributes(request, ticket, status, providers.get(ticket.pool))
            request.span.end(now_ns)

        return cast(Stage, traced)


def _request_attributes(request: RequestTrace, ticket: Ticket, status: int, provider: str | None) -> None:
    """The GenAI conventions' attributes (gen_ai.*), omnigate's own, the HTTP status and the span's status."""
    span = request.span
    operation = OPERATIONS.get(ticket.endpoint, ticket.endpoint)
    span.update_name(f"{operation} {ticket.model}" if ticket.model else operation)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": operation,
        "http.response.status_code": status,
        "omnigate.request.id": ticket.id,
        "omnigate.tenant.id": ticket.tenant,
        "omnigate.outcome": ticket.outcome.value,
        "omnigate.stream": ticket.stream,
    }
    if ticket.model:
        attributes["gen_ai.request.model"] = ticket.model
    if provider is not None:
        attributes["gen_ai.provider.name"] = provider
    if ticket.pool:
        attributes |= {
            "omnigate.pool": ticket.pool,
            "omnigate.traffic_class": ticket.traffic_class,
            "omnigate.bucket": ticket.bucket,
            "omnigate.priority": ticket.priority,
            "omnigate.priority.band": ticket.band,
            "omnigate.estimated_tokens": ticket.cost.total_tokens,
        }
    if ticket.backend:
        attributes["omnigate.backend"] = ticket.backend
    if ticket.dispatched_at is not None:
        attributes["omnigate.queue.wait_s"] = ticket.queue_seconds
    if ticket.first_token_at is not None:
        attributes["omnigate.ttft_s"] = ticket.first_token_at - ticket.arrival
    if ticket.usage is not None:
        attributes["gen_ai.usage.input_tokens"] = ticket.usage.prompt_tokens
        attributes["gen_ai.usage.output_tokens"] = ticket.usage.completion_tokens
    if request.response_id is not None:
        attributes["gen_ai.response.id"] = request.response_id
    if ticket.error_code:
        attributes["omnigate.error.code"] = ticket.error_code
    failed = ticket.outcome in FAILED_OUTCOMES or status >= 500
    if failed:
        attributes["error.type"] = ticket.error_code or ticket.outcome.value
    span.set_attributes(attributes)
    if failed:
        span.set_status(Status(StatusCode.ERROR, ticket.error or ticket.outcome.value))
