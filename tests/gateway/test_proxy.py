"""Streaming relay, retries, failures and cancellation through a real gateway in front of fake backends."""

from __future__ import annotations

import time

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.relay.sse import error_event
from tests.gateway.conftest import ADMIN, dead_url
from tests.support.fake_sglang import expected_stream
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _post(url: str, body: dict, rid: str = "rid-1", **kw) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"x-request-id": rid}, timeout=10, **kw
    )


def test_stream_passes_bytes_through_exactly_with_client_usage(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([backend.url])
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    resp = _post(gw.url, body, rid="exact-1")
    assert resp.status_code == 200
    assert resp.headers["x-request-id"] == "exact-1"
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.content == expected_stream("chatcmpl-exact-1", "test-model", 4, True, 7)


def test_stream_without_include_usage_strips_the_injected_usage_chunk(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([backend.url])
    resp = _post(gw.url, {**CHAT, "stream": True}, rid="strip-1")
    assert resp.status_code == 200
    assert resp.content == expected_stream("chatcmpl-strip-1", "test-model", 4, False, 7)
    forwarded = backend.record.received[-1]
    assert forwarded["stream_options"] == {"include_usage": True}
    line = 'omnigate_requests_total{bucket="text",outcome="ok",pool="interactive"'
    assert wait_for(lambda: line in httpx.get(f"{gw.url}/metrics").text)


def test_non_streaming_response_unchanged(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([backend.url])
    resp = _post(gw.url, CHAT, rid="ns-1")
    assert resp.status_code == 200
    data = resp.json()
    assert data["id"] == "chatcmpl-ns-1"
    assert data["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}
    assert resp.headers["x-omnigate-pool"] == "interactive"
    assert resp.headers["x-omnigate-backend"] == "interactive-0"


@pytest.mark.parametrize("edge", [False, True], ids=["uvicorn", "edge"])
def test_client_disconnect_cancels_upstream_within_a_second(start_backend, start_gateway, edge):
    """Told by `http.disconnect` (any server) or by the edge protocol's hook (`omnigate serve`)."""
    backend = start_backend(token_delay=0.05)
    gw = start_gateway([backend.url], edge=edge)
    body = {**CHAT, "stream": True, "max_tokens": 400}
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "POST", f"{gw.url}/v1/chat/completions", json=body, headers={"x-request-id": "cut-1"}
        ) as resp,
    ):
        lines = resp.iter_lines()
        got = [next(lines) for _ in range(3)]
        assert got[0].startswith("data: ")
        closed_at = time.monotonic()
    wait_for(lambda: backend.record.aborted, timeout=3)
    assert [rid for rid, _ in backend.record.aborted] == ["cut-1"]
    assert backend.record.aborted[0][1] - closed_at < 1.0
    assert backend.record.ended == [backend.record.received[0]["rid"]]  # ended by its rid, not a hang-up

    def active() -> int:
        state = httpx.get(f"{gw.url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}).json()
        return state["pools"]["interactive"]["backends"][0]["active"]

    assert wait_for(lambda: active() == 0)


def _first_choice_and_other(start_backend):
    """Two backends ordered as the dispatcher breaks ties among idle ones (by URL)."""
    a, b = start_backend(), start_backend()
    return (a, b) if a.url < b.url else (b, a)


def test_retry_before_first_byte_on_5xx(start_backend, start_gateway):
    bad, good = _first_choice_and_other(start_backend)
    bad.behaviour.fail_status = 500
    gw = start_gateway([bad.url, good.url])
    before = _retries(gw.url)  # the registry is per process: earlier tests' gateways may have retried
    resp = _post(gw.url, {**CHAT, "stream": True}, rid="retry-1")
    assert resp.status_code == 200
    assert resp.content == expected_stream("chatcmpl-retry-1", "test-model", 4, False, 7)
    assert len(bad.record.received) == 1 and len(good.record.received) == 1
    assert resp.headers["x-omnigate-backend"] == "interactive-1"
    assert wait_for(lambda: _retries(gw.url) == before + 1)


def _retries(url: str) -> float:
    """omnigate_upstream_retries_total{pool="interactive"} as /metrics shows it (0 before any retry)."""
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name == "omnigate_upstream_retries_total" and sample.labels == {"pool": "interactive"}:
                return sample.value
    return 0.0


def test_retry_on_refused_connection(start_backend, start_gateway, stack):
    first, good = _first_choice_and_other(start_backend)
    gw = start_gateway([first.url, good.url])
    first.server.stop()  # still marked healthy until the next health check
    resp = _post(gw.url, CHAT, rid="refused-1")
    assert resp.status_code == 200
    assert resp.json()["id"] == "chatcmpl-refused-1"
    assert len(good.record.received) == 1


def test_all_backends_failing_maps_to_openai_error(start_backend, start_gateway):
    a = start_backend(fail_status=503)
    b = start_backend(fail_status=503)
    gw = start_gateway([a.url, b.url])
    resp = _post(gw.url, CHAT)
    assert resp.status_code == 503
    assert resp.json() == {
        "error": {"message": "scripted failure", "type": "InternalServerError", "param": None, "code": "503"}
    }
    assert len(a.record.received) + len(b.record.received) == 2


def test_backend_client_error_is_not_retried(start_backend, start_gateway):
    a, b = _first_choice_and_other(start_backend)
    a.behaviour.fail_status = 400
    gw = start_gateway([a.url, b.url])
    resp = _post(gw.url, CHAT)
    assert resp.status_code == 400
    assert resp.json()["error"]["message"] == "scripted failure"
    assert len(b.record.received) == 0


def test_mid_stream_failure_sends_error_event_then_done(start_backend, start_gateway):
    backend = start_backend(drop_after=2)
    gw = start_gateway([backend.url])
    resp = _post(gw.url, {**CHAT, "stream": True}, rid="mid-1")
    assert resp.status_code == 200
    full = expected_stream("chatcmpl-mid-1", "test-model", 4, True, 7)
    prefix = b"".join(e + b"\n\n" for e in full.split(b"\n\n")[:3])
    assert resp.content.startswith(prefix)
    tail = resp.content[len(prefix) :]
    assert tail.endswith(b"data: [DONE]\n\n")
    error = orjson.loads(tail.split(b"\n\n")[0][len(b"data: ") :])
    assert error["error"]["code"] == 502
    assert tail == error_event(error["error"]["message"])


def test_no_healthy_backend_is_503(start_gateway):
    gw = start_gateway([dead_url()])
    wait_for(lambda: httpx.get(f"{gw.url}/readyz").status_code == 503)
    assert httpx.get(f"{gw.url}/readyz").json() == {
        "ready": False,
        "draining": False,
        "pools": {"interactive": False},
        "store": {"state": "up", "failure_mode": "open", "replicas": 1},
    }
    resp = _post(gw.url, CHAT)
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "no_healthy_backend"
    assert resp.headers["retry-after"] == "1"


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v1/models"])
def test_plain_routes(start_backend, start_gateway, path):
    backend = start_backend()
    gw = start_gateway([backend.url])
    resp = httpx.get(gw.url + path)
    assert resp.status_code == 200
    assert resp.headers["x-request-id"]
    if path == "/v1/models":
        assert [m["id"] for m in resp.json()["data"]] == ["test-model"]
