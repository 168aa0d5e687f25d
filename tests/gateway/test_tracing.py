"""OpenTelemetry traces end to end: a real gateway exports over OTLP/HTTP to a receiver on loopback, which
decodes what arrives with the OpenTelemetry protobuf package; the fake backend records the `traceparent`
it was sent."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.gateway.conftest import Backend
from tests.support.servers import ServerThread, serve
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

KEY = "og-trace-test-0123456789"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class Received:
    """What the receiver decoded: every span with its resource's attributes."""

    spans: list[tuple[Span, dict[str, Any]]] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def by_name(self) -> dict[str, Span]:
        with self.lock:
            return {s.name: s for s, _ in self.spans}


@pytest.fixture
def receiver() -> Iterator[tuple[ServerThread, Received]]:
    got = Received()

    async def traces(request: Request) -> Response:
        message = ExportTraceServiceRequest.FromString(await request.body())
        with got.lock:
            got.content_types.append(request.headers.get("content-type", ""))
            for rs in message.resource_spans:
                resource = _attrs(rs.resource.attributes)
                got.spans.extend((s, resource) for ss in rs.scope_spans for s in ss.spans)
        body = ExportTraceServiceResponse().SerializeToString()
        return Response(body, media_type="application/x-protobuf")

    with serve(Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])) as server:
        yield server, got


def _tracing(receiver: ServerThread, **extra: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "endpoint": f"{receiver.url}/v1/traces",
        "service_name": "omnigate-under-test",
        "schedule_delay_s": 0.05,
        **extra,
    }


def _hex(b: bytes) -> str:
    return b.hex()


def test_a_streamed_request_is_one_genai_span_with_its_stages_and_the_backend_joins_the_trace(
    start_backend: Callable[..., Backend],
    start_gateway: Callable[..., ServerThread],
    receiver: tuple[ServerThread, Received],
) -> None:
    server, got = receiver
    backend = start_backend()
    gw = start_gateway(
        [backend.url],
        auth={"required": True},
        tenants=[{"id": "tracer", "keys": [KEY]}],
        tracing=_tracing(server),
    )
    headers = {"authorization": f"Bearer {KEY}", "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers)
    assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
    names = {
        "chat test-model",
        "omnigate.authenticate",
        "omnigate.admit",
        "omnigate.queue",
        "omnigate.upstream",
    }
    spans = wait_for(lambda: got.by_name() if names <= set(got.by_name()) else None)
    assert set(spans) == names
    assert got.content_types == ["application/x-protobuf"] * len(got.content_types)
    root = spans["chat test-model"]
    assert _hex(root.trace_id) == TRACE_ID and _hex(root.parent_span_id) == CLIENT_SPAN
    assert root.kind == Span.SPAN_KIND_SERVER
    attrs = _attrs(root.attributes)
    request_id = answer.headers["x-request-id"]
    assert {k: v for k, v in attrs.items() if k != "omnigate.queue.wait_s" and k != "omnigate.ttft_s"} == {
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "http.response.status_code": 200,
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "test-model",
        "gen_ai.provider.name": "sglang",
        "gen_ai.usage.input_tokens": 7,
        "gen_ai.usage.output_tokens": 6,
        "gen_ai.response.id": f"chatcmpl-{request_id}",
        "omnigate.request.id": request_id,
        "omnigate.tenant.id": "tracer",
        "omnigate.outcome": "ok",
        "omnigate.stream": True,
        "omnigate.pool": "interactive",
        "omnigate.traffic_class": "interactive",
        "omnigate.bucket": answer.headers["x-omnigate-bucket"],
        "omnigate.priority": int(answer.headers["x-omnigate-priority"]),
        "omnigate.priority.band": "normal",
        "omnigate.estimated_tokens": int(answer.headers["x-omnigate-estimated-tokens"]),
        "omnigate.backend": "interactive-0",
    }
    assert 0 <= attrs["omnigate.queue.wait_s"] < attrs["omnigate.ttft_s"]
    assert root.status.code == 0  # unset: a success
    for name in names - {"chat test-model"}:
        child = spans[name]
        assert child.trace_id == root.trace_id and child.parent_span_id == root.span_id, name
        assert root.start_time_unix_nano <= child.start_time_unix_nano <= child.end_time_unix_nano
        assert child.end_time_unix_nano <= root.end_time_unix_nano, name
    order = ["omnigate.authenticate", "omnigate.admit", "omnigate.queue", "omnigate.upstream"]
    starts = [spans[n].start_time_unix_nano for n in order]
    assert starts == sorted(starts)
    upstream = spans["omnigate.upstream"]
    assert upstream.kind == Span.SPAN_KIND_CLIENT
    assert _attrs(upstream.attributes) == {
        "url.full": f"{backend.url}/v1/chat/completions",
        "omnigate.attempt": 1,
        "http.response.status_code": 200,
        "omnigate.backend": "interactive-0",
    }
    assert [e.name for e in upstream.events] == ["omnigate.first_token"]
    assert upstream.start_time_unix_nano <= upstream.events[0].time_unix_nano <= upstream.end_time_unix_nano
    # the backend was sent the trace, with the upstream span as its parent
    sent = backend.record.headers[-1]["traceparent"]
    assert sent == f"00-{TRACE_ID}-{_hex(upstream.span_id)}-01"
    assert "tracestate" not in backend.record.headers[-1]
    resources = {tuple(sorted(r.items())) for _, r in got.spans}
    assert len(resources) == 1 and dict(next(iter(resources)))["service.name"] == "omnigate-under-test"


def test_a_whole_answer_a_refusal_and_sampling(
    start_backend: Callable[..., Backend],
    start_gateway: Callable[..., ServerThread],
    receiver: tuple[ServerThread, Received],
) -> None:
    """Sampling 0: a request without a trace is not exported (and the backend is told so); a client's
    sampled trace is; a refused key is a span whose authentication failed."""
    server, got = receiver
    backend = start_backend()
    gw = start_gateway(
        [backend.url],
        auth={"required": True},
        tenants=[{"id": "tracer", "keys": [KEY]}],
        tracing=_tracing(server, sampling_ratio=0.0),
    )
    auth = {"authorization": f"Bearer {KEY}"}
    unsampled = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=auth)
    assert unsampled.status_code == 200
    unsampled_parent = backend.record.headers[-1]["traceparent"]
    version, _, _, flags = unsampled_parent.split("-")
    assert version == "00" and int(flags, 16) & 1 == 0  # not sampled
    traced = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
    whole = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers={**auth, **traced})
    assert whole.status_code == 200
    refused = httpx.post(
        f"{gw.url}/v1/chat/completions",
        json=CHAT,
        headers={"authorization": "Bearer og-not-a-key-000000000000", **traced},
    )
    assert refused.status_code == 401
    gw.stop()  # the shutdown exports what is left
    spans = [s for s, _ in got.spans]
    assert {_hex(s.trace_id) for s in spans} == {TRACE_ID}
    roots = [s for s in spans if s.kind == Span.SPAN_KIND_SERVER]
    assert sorted(s.name for s in roots) == ["chat", "chat test-model"]
    ok = next(s for s in roots if s.name == "chat test-model")
    ok_attrs = _attrs(ok.attributes)
    assert ok_attrs["gen_ai.response.id"] == f"chatcmpl-{whole.headers['x-request-id']}"
    assert (ok_attrs["gen_ai.usage.input_tokens"], ok_attrs["gen_ai.usage.output_tokens"]) == (7, 6)
    assert ok_attrs["omnigate.stream"] is False and "omnigate.ttft_s" in ok_attrs
    bad = next(s for s in roots if s.name == "chat")
    bad_attrs = _attrs(bad.attributes)
    assert bad_attrs["http.response.status_code"] == 401
    assert bad_attrs["omnigate.outcome"] == "client_error"
    assert bad_attrs["omnigate.error.code"] == "invalid_api_key"
    assert "gen_ai.usage.input_tokens" not in bad_attrs and "omnigate.pool" not in bad_attrs
    assert bad.status.code == 0  # a client's error is not the server's
    children = [s for s in spans if s.parent_span_id == bad.span_id]
    assert [c.name for c in children] == ["omnigate.authenticate"]
    assert children[0].status.code == 2  # error
    assert [e.name for e in children[0].events] == ["exception"]


def test_tracing_off_loads_no_opentelemetry() -> None:
    """Off (the default): the gateway loads neither its tracing module nor OpenTelemetry's trace SDK or
    exporter (redis-py imports OpenTelemetry's metrics API on its own when it is installed)."""
    prefixes = ("gateway.observability.tracing", "opentelemetry.sdk.trace", "opentelemetry.exporter")
    code = (
        f"PREFIXES = {prefixes!r}; "
        "import sys; from gateway.http.app import create_app; "
        "from gateway.settings.config import parse_config; "
        "create_app(parse_config({'store': {'kind': 'memory'}, 'policy_path': 'policies/default.yaml', "
        "'pools': [{'name': 'interactive', 'models': ['m'], 'backends': ['http://127.0.0.1:9']}]}, "
        "environ={})); print(sorted(m for m in sys.modules if m.startswith(PREFIXES)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_a_failed_answer_is_an_error_span_and_so_is_its_upstream_attempt(
    start_backend: Callable[..., Backend],
    start_gateway: Callable[..., ServerThread],
    receiver: tuple[ServerThread, Received],
) -> None:
    """A stream the backend cuts after its first chunk: the client got 200 and an error event, the trace
    shows the failure on the request and on the attempt."""
    server, got = receiver
    backend = start_backend(drop_after=1)
    gw = start_gateway([backend.url], tracing=_tracing(server))
    answer = httpx.post(f"{gw.url}/v1/chat/completions", json={**CHAT, "stream": True})
    assert answer.status_code == 200 and '"error"' in answer.text
    gw.stop()
    spans = got.by_name()
    root, attempt = spans["chat test-model"], spans["omnigate.upstream"]
    attrs = _attrs(root.attributes)
    assert attrs["omnigate.outcome"] == "upstream_error" and attrs["error.type"] == "upstream_error"
    assert attrs["omnigate.tenant.id"] == "anonymous"
    assert root.status.code == 2 and attempt.status.code == 2  # error, both
    assert root.status.message == attempt.status.message != ""
    assert [e.name for e in attempt.events] == ["omnigate.first_token"]
