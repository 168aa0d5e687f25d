"""The request's way for /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/audio/speech, as one
straight line.

read + validate → route to pool → (admission stages) → acquire a backend → open upstream (retry once before
the first byte) → relay → end of the relay: its one result (`Relayed`, gateway/request/ticket.py) sets the
ticket, the usage, the learners and releases the lease → finish: the outcome, the charge, the measures. A
client disconnect at any point cancels the line; the `finally` releases whatever the request held.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import orjson
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from gateway.http import disconnect
from gateway.http.asgi import IndexedRequest, send_error, send_json
from gateway.http.stream_end import read_to_usage, reported_usage
from gateway.observability import metrics, record
from gateway.observability.record import latencies
from gateway.relay.proxy import (
    Deadlines,
    OpenUpstream,
    TruncatedStream,
    UpstreamConnectError,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
    open_upstream,
)
from gateway.relay.sse import SSERelay, error_event, leading_error, whole_answer_tokens
from gateway.relay.upstream import Response
from gateway.request.errors import ApiError, ErrorCode
from gateway.request.openai_api import Endpoint, ParsedRequest, parse_request, read_body
from gateway.request.ticket import Ending, Outcome, Relayed, Ticket, Usage
from gateway.speech.events import SPEECH_FORMAT_HEADERS, SPEECH_HEADERS, read_json, speech_seconds
from gateway.speech.meter import SpeechMeter
from gateway.speech.pcm import PcmFormat
from gateway.tenants.charge import infer, left_waiting

if TYPE_CHECKING:
    from gateway.admission.scheduler import Lease
    from gateway.backends.pool import Pool
    from gateway.backends.state import BackendState
    from gateway.process.replica import Gateway
    from gateway.tenants.service import Reservation

log = logging.getLogger("omnigate.pipeline")

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


_NOT_REVOCABLE = contextlib.nullcontext()


def engine_latencies(ticket: Ticket) -> tuple[float | None, float | None]:
    """(TTFT from dispatch, TPOT) for the concurrency controller and the prefill-rate estimate. A whole
    (non-streamed) answer shows no first token — it all arrives at once — so it gives no TTFT (taking
    the whole generation for one would read as a huge prefill and a missed TTFT SLO, and shrink the
    limit to its minimum under non-streaming traffic) and, as its TPOT, the time from dispatch per output
    token: an upper bound (prefill and engine queueing included) that still rises with the batch. An answer
    that speaks gives no TPOT: its end is the talker's pace (its real-time factor,
    gateway/admission/engine_stages.py reads it), not the thinker's decode."""
    if ticket.voice is not None:
        ttft = None
        if ticket.stream and ticket.first_token_at is not None and ticket.dispatched_at is not None:
            ttft = ticket.first_token_at - ticket.dispatched_at
        return ttft, None
    dispatched, tokens = ticket.dispatched_at, ticket.usage.completion_tokens if ticket.usage else 0
    if not ticket.stream:
        done = ticket.finished_at
        if done is None or dispatched is None or not tokens:
            return None, None
        return None, (done - dispatched) / tokens
    ttft = None
    if ticket.first_token_at is not None and dispatched is not None:
        ttft = ticket.first_token_at - dispatched
    return ttft, latencies(ticket).tpot


def client_headers(ticket: Ticket) -> dict[str, str]:
    """What a completion's response tells the client about its way through the gateway, and its tenant's
    rate limits as OpenAI states them."""
    return {
        "x-omnigate-pool": ticket.pool,
        "x-omnigate-backend": ticket.backend or "",
        "x-omnigate-queue-ms": f"{ticket.queue_seconds * 1000:.1f}",
        "x-omnigate-bucket": ticket.bucket,
        "x-omnigate-priority": str(ticket.priority),
        "x-omnigate-estimated-tokens": str(ticket.cost.total_tokens),
        **_predicted_ttft(ticket),
        **(ticket.rate_limits or {}),
    }


def _predicted_ttft(ticket: Ticket) -> dict[str, str]:
    """The first token admission predicted, from arrival: what a client or a benchmark checks the early
    rejection's predictor against (absent for a class that does not shed by deadline)."""
    if ticket.predicted_first_token is None:
        return {}
    return {"x-omnigate-predicted-ttft-ms": f"{(ticket.predicted_first_token - ticket.arrival) * 1000:.1f}"}


def _pace(backend: BackendState, ticket: Ticket) -> None:
    """Teach the backend's decode pace from an answer with the engine's usage: a stream's time between its
    tokens, a whole answer's time after its predicted prefill per token."""
    tokens = ticket.usage.completion_tokens if ticket.usage is not None else 0
    if ticket.stream:
        first, last = ticket.first_token_at, ticket.last_token_at
        if tokens >= 2 and first is not None and last is not None:
            backend.progress.answered((last - first) / (tokens - 1))
    elif tokens and ticket.prefill is not None and ticket.finished_at is not None:
        prefilled = ticket.prefill.at + ticket.prefill.seconds
        backend.progress.answered((ticket.finished_at - prefilled) / tokens)


_ANSWERED = Ending(Outcome.OK)


class Unanswered(Exception):
    """No backend answered the request (before the first byte, retries spent or not allowed): the error
    the client gets and the outcome its backend's kind judged."""

    def __init__(self, error: ApiError, outcome: Outcome) -> None:
        super().__init__(error.message)
        self.error = error
        self.outcome = outcome


def _refused(e: ApiError) -> Outcome:
    """A refusal's outcome: the gateway's for load (429, 503), else the request's own fault."""
    return Outcome.REJECTED if e.status in (429, 503) else Outcome.CLIENT_ERROR


def _relay_ending(handed: list[Relayed]) -> Ending:
    """How the relay ended (PENDING: none ran)."""
    return handed[0].ending if handed else Ending()


def _cut_event(ending: Ending) -> bytes:
    """The SSE error event a stream cut short ends with."""
    assert ending.error is not None and ending.error_status is not None  # _failed sets both
    return error_event(ending.error, ending.error_status)


def _metered(
    ending: Ending,
    usage: Usage | None,
    answer_tokens: int,
    meter: SpeechMeter,
    first_token_at: float | None,
    last_token_at: float | None,
    finished_at: float,
) -> Relayed:
    """A streamed relay's result: its audio as `meter` measured it."""
    return Relayed(
        ending,
        usage,
        answer_tokens,
        first_token_at,
        last_token_at,
        meter.first_at,
        meter.seconds,
        meter.rtf,
        meter.stalls,
        finished_at,
    )


Kept = list[tuple["asyncio.Future[Response]", Callable[[], None]]]


def _keeper(into: Kept) -> Callable[[asyncio.Future[Response], Callable[[], None]], None]:
    """Where open_upstream hands an exchange its client left: the request is ended and read on."""

    def keep(pending: asyncio.Future[Response], drop: Callable[[], None]) -> None:
        into.append((pending, drop))

    return keep


def _int(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0


class Exchange:
    """One client exchange: tracks whether headers went out and whether the client left."""

    __slots__ = ("complete", "disconnected", "send", "serving", "started", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.serving: anyio.CancelScope | None = None  # what the client's leaving (or a drain) cancels
        self.status = 0
        self.started = False
        self.complete = False
        self.disconnected = False

    async def finish(self, body: bytes) -> None:
        """Send the last bytes; servers report a disconnect once a response completes, so mark it first."""
        self.complete = True
        await self.send({"type": "http.response.body", "body": body, "more_body": False})

    def left(self) -> None:
        """The client disconnected (gateway/http/disconnect.py)."""
        if not self.complete:
            self.disconnected = True
            assert self.serving is not None  # watched only while serving
            self.serving.cancel()


class CompletionEndpoint:
    """ASGI endpoint for one OpenAI route; owns the whole exchange so it can stream, retry and cancel."""

    def __init__(self, gateway: Gateway, endpoint: Endpoint, upstream_path: str) -> None:
        self.gw = gateway
        self.endpoint = endpoint
        self.path = upstream_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self.gw.drain.request():
            await self._exchange(scope, receive, send)

    async def _exchange(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = IndexedRequest(scope, receive)
        ex = Exchange(send)
        ticket = Ticket(id=scope["state"]["request_id"], model="", stream=False, arrival=self.gw.clock())
        reservation: Reservation | None = None
        policy = self.gw.policy.current  # this request keeps this policy object to the end
        error: str | None = None
        handed: list[Relayed] = []  # the relay's one result, however it ended (none before it began)
        ending: Ending | None = None  # how it ended, when not by its relay alone
        try:
            self.gw.drain.refuse_if_draining()
            tenant = await self.gw.authenticate(request)
            ticket.tenant, ticket.max_queued = tenant.id, tenant.quotas.max_queued
            raw = await read_body(request, self.gw.config.limits.max_body_bytes)
            parsed = parse_request(raw, self.endpoint)
            ticket.model, ticket.stream, ticket.endpoint = parsed.model, parsed.stream, parsed.endpoint
            pool, reservation = await self.gw.admit(ticket, parsed, request, policy, tenant, self.path)
            # One scope the disconnect (or a drain, while queued) cancels, not a task group (decision 0005).
            with anyio.CancelScope() as ex.serving:
                stop_watching = disconnect.watch(scope, receive, ex.left)
                try:
                    await self._serve(ex, ticket, parsed, pool, policy, handed)
                finally:
                    stop_watching()
        except (ApiError, Unanswered) as e:
            err = e.error if isinstance(e, Unanswered) else e
            error = err.message
            outcome = e.outcome if isinstance(e, Unanswered) else _refused(err)
            ending = Ending(outcome, error_code=err.code)
            if not ex.started and not ex.disconnected:
                ex.status = err.status
                await send_error(send, err, ticket.rate_limits)  # refused after admission: the limits too
        except ClientDisconnect:  # the client left while sending its body: nothing was admitted
            ex.disconnected = True
            ending = Ending(Outcome.CANCELLED)
        except Exception:
            log.exception("request %s failed", ticket.id)
            ending = replace(_relay_ending(handed), outcome=Outcome.INTERNAL_ERROR)
            error = "internal gateway error"
            if not ex.started and not ex.disconnected:
                ex.status = 500
                await send_error(
                    send, ApiError(500, "Internal gateway error.", code=ErrorCode.INTERNAL_ERROR)
                )
        finally:
            if ending is None:
                ending = _relay_ending(handed)
            if ex.disconnected and ending.outcome in (Outcome.PENDING, Outcome.OK):
                ending = replace(ending, outcome=Outcome.CANCELLED)
            scope["state"]["access_logged"] = self.gw.access is not None
            await self.gw.finish(ticket, ending, reservation, ex.status, error or ending.error)

    async def _serve(
        self,
        ex: Exchange,
        ticket: Ticket,
        parsed: ParsedRequest,
        pool: Pool,
        policy: Any,
        handed: list[Relayed],
    ) -> None:
        """Open, relay, end the relay: the relay appends its one result to `handed` however it ends."""
        body = parsed.body
        strip_usage = parsed.stream and not parsed.include_usage and parsed.endpoint != "speech"
        if strip_usage:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        headers = {"content-type": "application/json", "x-request-id": ticket.id}
        pool_policy = policy.pool(pool.name)
        t = pool_policy.timeouts
        deadlines = Deadlines(t.connect, t.first_byte, t.idle, t.total)
        assert ex.serving is not None
        retries = pool_policy.retries
        upstream, lease = await self._open(ticket, pool, body, headers, deadlines, retries, ex.serving)
        hand = handed.append
        try:
            if parsed.stream:
                await self._relay_stream(ex, ticket, pool, lease, upstream, strip_usage, deadlines, hand)
            else:
                await self._send_whole(ex, ticket, upstream, hand)
        finally:
            upstream.close()
            self._end_relay(ticket, lease, deadlines, handed[0] if handed else None)

    def _end_relay(self, ticket: Ticket, lease: Lease, deadlines: Deadlines, relayed: Relayed | None) -> None:
        """The attempt's one end: the ticket takes what the relay delivered and saw (its timings, its audio,
        the engine's usage or, without it, the inferred charge), the backend learns its decode pace, its
        prompt counts and its audio, and the lease goes back, feeding the controller and the prefill-rate
        estimate. An answer the gateway left unfinished (the client left, a deadline passed) may still run
        there. `relayed` None: the relay never began (the client left as its headers went out)."""
        ending = Ending() if relayed is None else relayed.ending
        if relayed is not None:
            ticket.relayed, ticket.finished_at = relayed, relayed.finished_at
            if relayed.usage is not None:
                ticket.usage = relayed.usage
            else:  # cut short, or the engine did not say in time: what was relayed, no more
                infer(ticket, relayed.answer_tokens, ending.outcome)
        ttft, tpot = engine_latencies(ticket)
        answered = ticket.usage is not None and ticket.usage_inferred is None and ending.outcome == Outcome.OK
        if answered and ticket.voice is None:
            _pace(lease.backend, ticket)
        if answered and ticket.usage is not None:
            lease.backend.progress.counted(
                ticket.bucket, ticket.cost.prompt_tokens, ticket.usage.prompt_tokens
            )
            if ticket.usage.cached_tokens is not None:
                lease.backend.prefix.reported(ticket.usage.prompt_tokens, ticket.usage.cached_tokens)
        left = ending.outcome in (Outcome.PENDING, Outcome.TIMEOUT)
        ended = Outcome.OVERLOADED if ending.overloaded else ending.outcome  # a drop for the limit
        if ticket.first_audio_at is not None and ticket.dispatched_at is not None:
            audio = ticket.first_audio_at - ticket.dispatched_at, ticket.audio_seconds, ticket.rtf
            lease.backend.audio.add(*audio)
        self._end(lease, deadlines, left, ticket.usage, ended, ttft, tpot)

    def _end(
        self,
        lease: Lease,
        deadlines: Deadlines,
        left: bool,
        usage: Usage | None,
        outcome: Outcome,
        ttft: float | None = None,
        tpot: float | None = None,
    ) -> None:
        """Give the lease back — unless the gateway `left` a request whose server runs on without it (its
        kind says so): the owner pool then holds the release until the server shows the request finished or
        its predicted end passes (gateway/backends/holds.py)."""
        owner = self.gw.pools[lease.backend.pool]
        release = functools.partial(lease.release, usage, outcome, ttft, tpot)
        if not (left and owner.hold(lease.backend, lease.ticket, release, deadlines.total)):
            release()

    async def _open(
        self,
        ticket: Ticket,
        pool: Pool,
        body: dict[str, Any],
        headers: dict[str, str],
        deadlines: Deadlines,
        retries: int,
        serving: anyio.CancelScope,
    ) -> tuple[OpenUpstream, Lease]:
        """Wait for a lease and open the upstream; before the first byte, retry on another backend. The
        body is shaped and serialised per attempt by the backend's kind (a backend that schedules by
        priority gets the dispatch's engine priority, `Standing.engine_priority`); a failure is judged
        by it too: whether another backend may serve, whether the circuit counts it, what the client gets."""
        exclude: set[str] = set()
        scheduler = self.gw.schedulers[pool.name]
        requeued = False
        while True:
            with self.gw.drain.waiting(serving):  # a drain answers the queued at once: 503 shutting_down
                lease = await scheduler.acquire(ticket, exclude=exclude, requeued=requeued)
            backend = lease.backend
            owner = self.gw.pools[backend.pool]  # differs from `pool` when an idle backend is lent
            ticket.engine_rid = owner.kind.name_request(body, ticket)
            payload = owner.kind.payload(body, lease.engine_priority)
            kept: Kept = []  # the exchange, if its client left before the first byte
            ticket.backend = backend.name
            ticket.dispatched_at = self.gw.clock()
            ticket.reached_engine = False  # until its body is out (open_upstream's `sent`): then charged
            ticket.prefill = None
            record.record_dispatch(ticket)
            assert owner.client is not None
            # loans are revocable until the first byte: nothing has reached the client; others pay no
            # cancel scope for it
            revocable = anyio.CancelScope() if lease.revocable else None
            if revocable is not None:
                lease.arm(revocable.cancel)
            try:
                with revocable or _NOT_REVOCABLE:
                    upstream = await open_upstream(
                        owner.client,
                        backend.url + self.path,
                        payload,
                        headers,
                        deadlines,
                        stream=ticket.stream,
                        sent=functools.partial(self._sent, ticket, backend),
                        keep=_keeper(kept) if ticket.engine_rid is not None else None,
                    )
                    refused = leading_error(upstream.first) if ticket.stream else None
                    if refused is not None:  # refused inside its 200 before any output: as if before it
                        upstream.close()
                        raise UpstreamStatusError(*refused)
            except UpstreamError as e:
                if isinstance(e, (UpstreamConnectError, UpstreamStatusError)):
                    ticket.reached_engine = False  # refused or never connected: the engine did nothing
                    backend.progress.dropped(ticket, self.gw.clock())
                verdict = owner.kind.judge(e, backend)
                if verdict.backend_fault:  # verdicts come before the release (gateway/backends/circuit.py)
                    owner.record_failure(backend, ticket.dispatched_at)
                else:
                    owner.record_no_verdict(backend, ticket.dispatched_at)
                ended = Outcome.OVERLOADED if verdict.overloaded else Outcome.UPSTREAM_ERROR
                if verdict.overloaded:
                    metrics.BACKEND_OVERLOADS.labels(owner.name, backend.name, "before_output").inc()
                self._end(lease, deadlines, isinstance(e, UpstreamTimeout), Usage(0, 0), ended)
                metrics.UPSTREAM_ERRORS.labels(pool.name, ticket.backend, e.label).inc()
                exclude.add(backend.url)
                if (
                    verdict.retry
                    and len(exclude) <= retries
                    and any(b.available and b.url not in exclude for b in pool.backends)
                ):
                    metrics.UPSTREAM_RETRIES.labels(pool.name).inc()
                    requeued = True  # admitted work that lost its backend keeps its place: not new work
                    log.warning(
                        "request %s: %s on %s; retrying on another backend",
                        ticket.id,
                        e.message,
                        ticket.backend,
                    )
                    continue
                outcome = Outcome.CLIENT_ERROR if verdict.client_fault else Outcome.UPSTREAM_ERROR
                if isinstance(e, UpstreamTimeout):  # the gateway gave up: charged as a client that left
                    if kept:
                        await self._end_unopened(ticket, owner, backend, *kept.pop())
                    delay = owner.config.abort_delay_s
                    runs_on = owner.kind.runs_on(ticket)
                    left_waiting(ticket, backend.progress, self.gw.clock(), runs_on, delay, outcome)
                raise Unanswered(verdict.error, outcome) from None
            except BaseException as e:
                if isinstance(e, asyncio.CancelledError):  # the client left before the first byte
                    if kept:
                        await self._end_unopened(ticket, owner, backend, *kept.pop())
                    delay = owner.config.abort_delay_s
                    left_waiting(ticket, backend.progress, self.gw.clock(), owner.kind.runs_on(ticket), delay)
                owner.record_no_verdict(backend, ticket.dispatched_at)
                self._end(lease, deadlines, True, Usage(0, 0), Outcome.CANCELLED)
                raise
            finally:
                lease.disarm()
                for _, drop in kept:  # not ended (a retry, a revoked loan): closing aborts it
                    drop()
            if revocable is not None and revocable.cancelled_caught:
                ticket.reached_engine = False  # the gateway took it back: its choice, not the tenant's
                owner.record_no_verdict(backend, ticket.dispatched_at)
                self._end(lease, deadlines, True, Usage(0, 0), Outcome.REVOKED)
                requeued = True  # the lender's own requests wait for the backend: queue in our own pool
                metrics.LOANS_REVOKED.labels(pool.name).inc()
                log.info("request %s: loan of %s revoked; queued again", ticket.id, ticket.backend)
                continue
            owner.record_success(backend, ticket.dispatched_at)
            if ticket.stream:
                lease.started()  # the first byte of a stream comes with the first token
                backend.progress.first_token(ticket, self.gw.clock())  # and ends its prefill
            return upstream, lease

    def _sent(self, ticket: Ticket, backend: BackendState) -> None:
        """The request's body is going out to the engine: from now it is charged, and its prefill is
        predicted (gateway/backends/progress.py) at the fastest plausible rate, so that a wrong prediction
        charges a prefill rather than lets one off."""
        if ticket.reached_engine:  # called for every chunk of the body
            return
        ticket.reached_engine = True
        now = self.gw.clock()
        backend.progress.sent(ticket, now, self.gw.schedulers[backend.pool].rate.nominal(now))

    async def _end_unopened(
        self,
        ticket: Ticket,
        owner: Pool,
        backend: BackendState,
        pending: asyncio.Future[Response],
        drop: Callable[[], None],
    ) -> None:
        """The client left before the answer's first byte: end the request on the engine and charge the
        usage it closes with (none for one it dropped from its queue); none in time: the guess."""
        relay = SSERelay(False)
        try:
            rid, whole = ticket.engine_rid or "", not ticket.stream
            status = await read_to_usage(owner, backend.url, rid, pending, relay, self.gw.clock, whole)
        finally:
            drop()
        if status is not None and status != 200:  # refused by the engine (an error status): it did nothing
            ticket.reached_engine = False
        elif relay.usage is not None:
            ticket.usage = reported_usage(relay.usage)

    def _failed(self, ticket: Ticket, pool: Pool, lease: Lease, e: UpstreamError) -> Ending:
        """A relay that ended without its answer: the outcome and the circuit as the backend's kind judges
        it (a server that cuts a failed request's stream counts against the request, not itself), and the
        error the client's stream ends with."""
        owner = self.gw.pools[lease.backend.pool]
        verdict = owner.kind.judge(e, lease.backend)
        if isinstance(e, UpstreamTimeout):
            outcome = Outcome.TIMEOUT
        else:
            outcome = Outcome.CLIENT_ERROR if verdict.client_fault else Outcome.UPSTREAM_ERROR
        metrics.UPSTREAM_ERRORS.labels(pool.name, ticket.backend or "", e.label).inc()
        if verdict.backend_fault:  # it answered first: that success becomes this one failure
            owner.record_failure(lease.backend, ticket.dispatched_at, answered=True)
        return Ending(outcome, verdict.error.message, verdict.error.status)

    def _error_event(self, ticket: Ticket, pool: Pool, lease: Lease, error: dict[str, Any]) -> Ending:
        """A stream the backend ended with its own error event (relayed as it came): the outcome as its kind
        reads it — its overload (a drop for the limit, counted, never the client's fault), the request's own
        fault, or the backend's failure (its circuit counts it)."""
        owner = self.gw.pools[lease.backend.pool]
        verdict = owner.kind.judge_event(error, lease.backend)
        outcome = Outcome.CLIENT_ERROR if verdict.client_fault else Outcome.UPSTREAM_ERROR
        if verdict.overloaded:
            metrics.BACKEND_OVERLOADS.labels(owner.name, lease.backend.name, "mid_stream").inc()
        elif verdict.backend_fault:
            owner.record_failure(lease.backend, ticket.dispatched_at, answered=True)
        metrics.UPSTREAM_ERRORS.labels(pool.name, ticket.backend or "", "error_event").inc()
        code = ErrorCode.BACKEND_OVERLOADED if verdict.overloaded else None
        return Ending(outcome, verdict.error.message, verdict.error.status, code, verdict.overloaded)

    async def _relay_audio(
        self,
        ex: Exchange,
        ticket: Ticket,
        pool: Pool,
        lease: Lease,
        upstream: OpenUpstream,
        deadlines: Deadlines,
        pcm: PcmFormat | None,
        hand: Callable[[Relayed], None],
    ) -> None:
        """A raw audio stream (sglang-omni's `audio/pcm`) relayed byte for byte under its own content type
        and format headers, measured from its bytes: time to first audio, audio seconds, real-time factor.
        Its usage comes afterwards from the backend (the kind's outcome route). A stream the backend drops
        is dropped for the client too (raw audio has no way to say it failed): the response is left
        unfinished, and the server closes the connection."""
        up = upstream.response.headers
        meter = SpeechMeter()
        ticket.speech = meter
        passed = [(k.encode(), up[k].encode()) for k in ("content-type", *SPEECH_FORMAT_HEADERS) if k in up]
        ex.started = True
        ex.status = 200
        await ex.send(
            {"type": "http.response.start", "status": 200, "headers": passed + self._response_headers(ticket)}
        )
        clock = self.gw.clock
        progress = lease.backend.progress
        owner = self.gw.pools[lease.backend.pool]
        ending, usage = Ending(), None
        try:
            with upstream.guard(deadlines) as dog:
                meter.add(clock(), pcm.seconds(len(upstream.first)) if pcm else 0.0)
                await ex.send({"type": "http.response.body", "body": upstream.first, "more_body": True})
                dog.reading()
                async for chunk in upstream.chunks():
                    dog.relaying()
                    now = clock()
                    progress.output(now)
                    meter.add(now, pcm.seconds(len(chunk)) if pcm else 0.0)
                    await ex.send({"type": "http.response.body", "body": chunk, "more_body": True})
                    dog.reading()
            ending = _ANSWERED
            await ex.finish(b"")
            used = await owner.stream_usage(lease.backend, up)
            if used is not None:
                usage = Usage(*used)
        except UpstreamError as e:  # the response stays unfinished: the client sees the drop
            ending = self._failed(ticket, pool, lease, e)
        finally:
            # no usage told: the estimate's prompt is charged, and no text answer
            hand(_metered(ending, usage, 0, meter, meter.first_at, meter.last_at, clock()))

    def _response_headers(self, ticket: Ticket) -> list[tuple[bytes, bytes]]:
        return [(k.encode(), v.encode()) for k, v in client_headers(ticket).items()]

    async def _send_whole(
        self, ex: Exchange, ticket: Ticket, upstream: OpenUpstream, hand: Callable[[Relayed], None]
    ) -> None:
        """A whole answer, sent as it came; its usage from the body (or the speech server's headers), else
        the tokens of its text."""
        body = upstream.first
        now = self.gw.clock()
        usage, answer_tokens, audio_seconds = None, 0, 0.0
        headers = client_headers(ticket)
        media_type = upstream.response.headers.get("content-type", "application/json")
        if ticket.endpoint == "speech":  # raw audio bytes; the server's token counts in its headers
            up = upstream.response.headers
            headers.update({k: up[k] for k in (*SPEECH_HEADERS, *SPEECH_FORMAT_HEADERS) if k in up})
            usage = Usage(_int(up.get("x-prompt-tokens")), _int(up.get("x-completion-tokens")))
            audio_seconds = speech_seconds(body, up.get("x-sample-rate"))
            if media_type.startswith("application/json"):  # not audio after all: counted as none
                audio_seconds = 0.0
        else:
            media_type = "application/json"
            try:
                rate = self.gw.estimator.profile(ticket.model).speech_sample_rate
                answer, seconds = read_json(body, scan=len(body), pcm_rate=rate)
            except orjson.JSONDecodeError:
                answer, seconds = None, None
            usage = answer.get("usage") if isinstance(answer, dict) else None
            told = answer.get("usage") if isinstance(answer, dict) else None
            if isinstance(told, dict):
                usage = reported_usage(told)
            else:
                answer_tokens = whole_answer_tokens(answer, self.gw.estimator.count_text)
            audio_seconds = seconds or 0.0
        hand(
            Relayed(
                _ANSWERED,
                usage,
                answer_tokens,
                first_token_at=now,
                first_audio_at=now if audio_seconds else None,
                audio_seconds=audio_seconds,
                finished_at=now,
            )
        )
        ex.started = ex.complete = True
        ex.status = 200
        await send_json(ex.send, 200, body, headers, media_type)

    async def _relay_stream(
        self,
        ex: Exchange,
        ticket: Ticket,
        pool: Pool,
        lease: Lease,
        upstream: OpenUpstream,
        strip_usage: bool,
        deadlines: Deadlines,
        hand: Callable[[Relayed], None],
    ) -> None:
        """A stream relayed event by event (or raw audio, `_relay_audio`); a stream the gateway leaves is
        ended on the engine for the usage it closes with."""
        up = upstream.response.headers
        pcm = PcmFormat.of(up)
        if ticket.endpoint == "speech" and not up.get("content-type", "").startswith("text/event-stream"):
            await self._relay_audio(ex, ticket, pool, lease, upstream, deadlines, pcm, hand)
            return
        pcm_rate = pcm.sample_rate if pcm else self.gw.estimator.profile(ticket.model).speech_sample_rate
        relay = SSERelay(strip_usage, self.gw.estimator.count_text, pcm_rate)
        ticket.speech = relay.audio  # its speed is what the backend makes for it now (stage budgets)
        send = ex.send
        ex.started = True
        ex.status = 200
        speech_format = [(k.encode(), up[k].encode()) for k in SPEECH_FORMAT_HEADERS if k in up]
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": _SSE_HEADERS + speech_format + self._response_headers(ticket),
            }
        )
        clock = self.gw.clock
        progress = lease.backend.progress
        ending = Ending()
        try:
            with upstream.guard(deadlines) as dog:
                out = relay.feed(upstream.first, clock())
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                dog.reading()
                async for chunk in upstream.chunks():
                    dog.relaying()
                    now = clock()
                    progress.output(now)  # the engine is between prefills
                    out = relay.feed(chunk, now)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    dog.reading()
            tail = relay.flush()
            if relay.error:  # the server's own error event ends it (a speech stream's without [DONE])
                ending = self._error_event(ticket, pool, lease, relay.error)
            elif not relay.done:
                ending = self._failed(
                    ticket, pool, lease, TruncatedStream("Backend closed the stream before it finished.")
                )
                tail += _cut_event(ending)
            else:
                ending = _ANSWERED
            await ex.finish(tail)
        except UpstreamError as e:
            ending = self._failed(ticket, pool, lease, e)
            await ex.finish(relay.flush() + _cut_event(ending))
        finally:
            owner = self.gw.pools[lease.backend.pool]
            left = ex.disconnected or ending.outcome == Outcome.TIMEOUT
            if left and relay.usage is None and not relay.done and ticket.engine_rid is not None:
                got: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
                got.set_result(upstream.response)
                await read_to_usage(owner, lease.backend.url, ticket.engine_rid, got, relay, clock)
            usage = None if relay.usage is None else reported_usage(relay.usage)
            answer = relay.answer_tokens() if usage is None else 0
            first, last = relay.first_token_at, relay.last_token_at
            hand(_metered(ending, usage, answer, relay.audio, first, last, self.gw.clock()))
