"""A pool of simulated sglang-omni servers (`omnigate sim --api sglang-omni` processes) behind a real gateway:
what the probe reads, and how each failure the server can answer reaches the client and the circuit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway.backends.kinds.sglang_omni_scrape import read_omni_metrics
from gateway.relay.sse import error_event
from tests.gateway.conftest import ADMIN
from tests.support.processes import ManagedProcess, Processes
from tests.support.servers import ServerThread, serve
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

MODEL = "test-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
# ~10 000 tokens of text: over sglang-omni's 8192-token thinker context, well under the gateway's 32 k
LONG = {**CHAT, "messages": [{"role": "user", "content": "word " * 8000}]}


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., ManagedProcess]]:
    group = Processes(tmp_path_factory.mktemp("omni"))

    def start(*args: str) -> ManagedProcess:
        return group.sim("--api", "sglang-omni", "--time-scale", "50", "--model", MODEL, "--seed", "3", *args)

    try:
        yield start
    finally:
        group.close()


def omni_pool(backends: list[str], **server: Any) -> dict[str, Any]:
    return {
        "name": "interactive",
        "kind": "sglang-omni",
        "models": [MODEL],
        "backends": backends,
        "health_interval_s": 0.2,
        "sglang_omni": server,
    }


def omni_gateway(start_gateway: Callable[..., ServerThread], backends: list[str], **server: Any) -> str:
    return start_gateway(backends, pools=[omni_pool(backends, **server)]).url


def admin_state(gw: str) -> dict[str, Any]:
    state: dict[str, Any] = httpx.get(
        f"{gw}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}
    ).json()
    return state


def backends(gw: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = admin_state(gw)["pools"]["interactive"]["backends"]
    return entries


def submitted(sim: ManagedProcess) -> int:
    count: int = httpx.get(sim.url + "/sim/omni/accounting?limit=0").json()["totals"]["submitted"]
    return count


def set_faults(sim: ManagedProcess, **faults: Any) -> None:
    httpx.post(sim.url + "/admin/faults", json=faults).raise_for_status()


def post(gw: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{gw}/v1/chat/completions", json=body, timeout=30)


def _model(stage: dict[str, Any]) -> dict[str, Any]:
    """A stage as the kind's capacity model names it (its budget and use are admission's)."""
    return {k: stage[k] for k in ("stage", "unit", "limit")}


def test_the_probe_reads_the_health_snapshot_and_names_the_missing_signals(sims, start_gateway):
    snapshot, later = sims(), sims("--omni-release", "later", "--text-only")
    gw = omni_gateway(start_gateway, [snapshot.url], version="snapshot")
    gw_later = omni_gateway(start_gateway, [later.url], version="later")
    entry = wait_for(lambda: (e := backends(gw)[0])["running"] is not None and e)
    assert admin_state(gw)["pools"]["interactive"]["kind"] == "sglang-omni"
    assert (entry["healthy"], entry["running"], entry["queued"], entry["token_usage"]) == (
        True,
        0,
        None,
        None,
    )
    assert [_model(s) for s in entry["stages"]] == [
        {"stage": "encoder", "unit": "items_per_batch", "limit": 32},
        {"stage": "thinker", "unit": "requests", "limit": 16},
        {"stage": "talker", "unit": "requests", "limit": 16},
        {"stage": "code2wav", "unit": "audio_seconds_per_s", "limit": None},
    ]
    assert all(s["use"] == 0 and not s["blocks_head"] for s in entry["stages"])
    assert [s["budget"] for s in entry["stages"]][2:] == [16, None]  # the talker's cap; code2wav unmeasured
    assert sorted(entry["missing_signals"]) == ["kv_capacity", "kv_usage", "queued"]
    assert (
        entry["missing_signals"]["kv_capacity"] == "sglang-omni exposes no KV signal: the KV watermark is off"
    )
    text_only = wait_for(lambda: (e := backends(gw_later)[0])["running"] is not None and e)
    assert [_model(s) for s in text_only["stages"]] == [
        {"stage": "encoder", "unit": "items_per_batch", "limit": 32},
        {"stage": "thinker", "unit": "requests", "limit": 64},
    ]
    assert post(gw, CHAT).status_code == 200


def test_a_whole_answers_500_is_the_clients_not_retried_not_counted(sims, start_gateway):
    a, b = sims(), sims()
    gw = omni_gateway(start_gateway, [a.url, b.url])
    assert wait_for(lambda: all(e["running"] is not None for e in backends(gw)))
    for _ in range(4):  # more than the circuit's threshold in a row
        resp = post(gw, LONG)
        assert resp.status_code == 422
        error = resp.json()["error"]
        assert error["code"] == "backend_request_failed"
        assert error["message"].startswith("The backend could not process this request: The input (")
        assert error["message"].endswith("is longer than the model's context length (8192 tokens).")
    assert submitted(a) + submitted(b) == 4  # each tried once, never on the other backend
    assert [(e["healthy"], e["circuit"]) for e in backends(gw)] == [(True, "closed"), (True, "closed")]
    assert post(gw, CHAT).status_code == 200


def test_a_stream_the_server_cuts_ends_with_an_error_event_and_done(sims, start_gateway):
    sim = sims()
    gw = omni_gateway(start_gateway, [sim.url])
    assert wait_for(lambda: backends(gw)[0]["running"] is not None)
    set_faults(sim, disconnect_rate=1.0, disconnect_after_tokens=2)
    try:
        for _ in range(4):
            resp = post(gw, {**CHAT, "stream": True})
            assert resp.status_code == 200
            events = resp.content.split(b"\n\n")
            assert b'"role": "assistant"' in events[0]  # the server's own non-compact chunks pass as sent
            tail = b"\n\n".join(events[2:])
            message = "The backend cut the stream: the request failed there (sglang-omni gives no reason)."
            assert tail == error_event(message, 422)
    finally:
        set_faults(sim, disconnect_rate=0.0)
    assert (backends(gw)[0]["circuit"], backends(gw)[0]["healthy"]) == ("closed", True)


def test_a_stream_that_fails_before_its_first_event_is_answered_as_an_error(sims, start_gateway):
    a, b = sims(), sims()
    gw = omni_gateway(start_gateway, [a.url, b.url])
    assert wait_for(lambda: all(e["running"] is not None for e in backends(gw)))
    before = submitted(a) + submitted(b)
    resp = post(gw, {**LONG, "stream": True})
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "backend_request_failed"
    assert submitted(a) + submitted(b) == before + 1
    assert [e["circuit"] for e in backends(gw)] == ["closed", "closed"]


def test_overload_answers_go_to_another_backend_and_never_open_a_circuit(sims, start_gateway):
    full, free = sims("--omni-release", "later"), sims("--omni-release", "later")
    set_faults(full, error_rate=1.0, error_status=503)
    gw = omni_gateway(start_gateway, [full.url, free.url], version="later")
    assert wait_for(lambda: all(e["running"] is not None for e in backends(gw)))
    served = [post(gw, CHAT) for _ in range(6)]
    assert [r.status_code for r in served] == [200] * 6
    assert {r.headers["x-omnigate-backend"] for r in served} == {"interactive-1"}
    assert [e["circuit"] for e in backends(gw)] == ["closed", "closed"]


def test_the_servers_validation_errors_name_the_field(sims, start_gateway):
    sim = sims()
    gw = omni_gateway(start_gateway, [sim.url])
    resp = post(gw, {**CHAT, "stop": 5})
    assert resp.status_code == 422
    assert resp.json()["error"] == {
        "message": "stop.str: Input should be a valid string; stop.list[str]: Input should be a valid list",
        "type": "invalid_request_error",
        "param": "stop.str",
        "code": "upstream_error",
    }


def test_the_metrics_carry_the_health_snapshot(tmp_path: Path) -> None:
    group = Processes(tmp_path)
    try:
        sim = group.sim("--api", "sglang-omni", "--enable-metrics", "--model", MODEL)
        gauges = read_omni_metrics(httpx.get(sim.url + "/metrics").text)
        health = httpx.get(sim.url + "/health").json()
        assert (gauges.tracked, gauges.pending) == (health["total_requests"], health["pending_completions"])
        assert set(gauges.stages) == set(health["stages"])
    finally:
        group.close()


def _bare_health_server(metrics: str | None) -> tuple[Starlette, dict[str, int]]:
    """An omni server whose /health is a bare 200 (e.g. rewritten by a proxy) and /metrics maybe absent."""
    calls = {"health": 0, "metrics": 0}

    async def health(request: Request) -> Response:
        calls["health"] += 1
        return PlainTextResponse("OK")

    async def prometheus(request: Request) -> Response:
        calls["metrics"] += 1
        if metrics is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return PlainTextResponse(metrics)

    routes = [Route("/health", health), Route("/metrics", prometheus)]
    return Starlette(routes=routes), calls


METRICS = "\n".join(
    [
        "# TYPE sglang_omni_pipeline_tracked_requests gauge",
        'sglang_omni_pipeline_tracked_requests{model_name="m"} 5.0',
        "# TYPE sglang_omni_pipeline_pending_completions gauge",
        'sglang_omni_pipeline_pending_completions{model_name="m"} 4.0',
        "# TYPE sglang_omni_stage_present gauge",
        'sglang_omni_stage_present{model_name="m",stage="thinker"} 1.0',
    ]
)


def test_without_the_snapshot_in_health_the_metrics_give_it(start_gateway):
    app, calls = _bare_health_server(METRICS)
    with serve(app) as server:
        gw = omni_gateway(start_gateway, [server.url])
        entry = wait_for(lambda: (e := backends(gw)[0])["running"] is not None and e)
        assert entry["running"] == 5
        assert wait_for(lambda: calls["health"] >= 3) and calls["metrics"] >= calls["health"] - 1
        assert [s["stage"] for s in entry["stages"]] == ["encoder", "thinker"]  # a text-only pipeline


def test_a_server_without_metrics_is_asked_once_per_healthy_spell(start_gateway):
    app, calls = _bare_health_server(None)
    with serve(app) as server:
        omni_gateway(start_gateway, [server.url])
        assert wait_for(lambda: calls["health"] >= 5)
        assert calls["metrics"] == 1


def test_a_route_the_servers_lack_is_refused_before_it_reaches_them(sims, start_gateway):
    sim = sims()
    gw = omni_gateway(start_gateway, [sim.url])
    before = submitted(sim)
    resp = httpx.post(f"{gw}/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=10)
    assert resp.status_code == 404
    assert resp.json()["error"] == {
        "message": "Model 'test-model' is served by sglang-omni backends, which have no /v1/completions; "
        "they serve /v1/audio/speech, /v1/chat/completions.",
        "type": "not_found_error",
        "param": None,
        "code": "route_not_served",
    }
    assert submitted(sim) == before


def test_a_route_the_servers_lack_takes_no_quota(sims, start_gateway):
    """Refused before admission: a tenant allowed one request a minute still has it afterwards."""
    sim = sims()
    key = "og-route-test-0123456789"
    gw = start_gateway(
        [sim.url],
        pools=[omni_pool([sim.url])],
        auth={"required": True},
        tenants=[{"id": "solo", "keys": [key], "quotas": {"rpm": 1}}],
    ).url
    auth = {"authorization": f"Bearer {key}"}
    refused = httpx.post(
        f"{gw}/v1/completions", json={"model": MODEL, "prompt": "hi"}, headers=auth, timeout=10
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "route_not_served"
    assert "x-ratelimit-remaining-requests" not in refused.headers
    answer = httpx.post(f"{gw}/v1/chat/completions", json=CHAT, headers=auth, timeout=30)
    assert answer.status_code == 200
    assert answer.headers["x-ratelimit-remaining-requests"] == "0"
