"""A pool's kind adapter probes real backends: health, scrape and capacity as /admin/state shows them."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import ADMIN
from tests.support.processes import Processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


def _state(url: str) -> dict:
    return httpx.get(f"{url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}).json()


def _backend(url: str) -> dict:
    entry: dict = _state(url)["pools"]["interactive"]["backends"][0]
    return entry


def test_sglang_probe_reads_health_metrics_and_server_info(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([backend.url])
    assert wait_for(lambda: _backend(gw.url)["token_usage"] is not None)
    pool = _state(gw.url)["pools"]["interactive"]
    entry = pool["backends"][0]
    assert pool["kind"] == "sglang"
    assert (entry["healthy"], entry["token_usage"], entry["running"], entry["queued"]) == (
        True,
        0.25,
        3,
        None,
    )
    assert entry["stages"] == [{"stage": "engine", "unit": "requests", "limit": 16}]


def test_a_0_5_9_server_is_asked_server_info_once_per_healthy_spell(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([backend.url])
    calls = backend.record.info_calls
    assert wait_for(lambda: _backend(gw.url)["stages"][0]["limit"] == 16)
    ticks = wait_for(lambda: calls.get("/server_info") == 1 and backend.record.metrics_calls >= 4)
    assert ticks and calls == {"/server_info": 1}  # never the deprecated route, not every tick
    backend.behaviour.healthy = False
    assert wait_for(lambda: not _backend(gw.url)["healthy"])
    backend.behaviour.healthy = True
    assert wait_for(lambda: calls.get("/server_info") == 2)  # back from a spell down: maybe restarted
    assert "/get_server_info" not in calls


def test_an_older_server_is_read_from_get_server_info(start_backend, start_gateway):
    backend = start_backend(info_routes=("/get_server_info",))
    gw = start_gateway([backend.url])
    assert wait_for(lambda: _backend(gw.url)["stages"][0]["limit"] == 16)
    calls = backend.record.info_calls
    assert wait_for(lambda: backend.record.metrics_calls >= 4)
    assert calls == {"/server_info": 1, "/get_server_info": 1}


def test_data_parallel_ranks_add_up_and_the_kv_ratio_is_the_fullest_ranks(start_backend, start_gateway):
    backend = start_backend(dp_ranks=2)
    gw = start_gateway([backend.url])
    assert wait_for(lambda: _backend(gw.url)["stages"][0]["limit"] == 32)
    entry = wait_for(lambda: (e := _backend(gw.url))["token_usage"] is not None and e)
    assert (entry["token_usage"], entry["running"]) == (0.75, 3 + 5)


def test_an_unhealthy_backend_is_marked_and_recovers(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([backend.url])

    def healthy() -> bool:
        return bool(_backend(gw.url)["healthy"])

    backend.behaviour.healthy = False
    assert wait_for(lambda: not healthy())
    backend.behaviour.healthy = True
    assert wait_for(healthy)


def test_the_simulated_sglang_server_is_read_from_server_info(tmp_path: Path, start_gateway):
    """The simulator serves SGLang 0.5.9's routes: its settings come from /server_info, and the deprecated
    /get_server_info (a warning in the server's log on every call) is never asked."""
    procs = Processes(tmp_path)
    try:
        sim = procs.sim("--max-running-requests", "24", "--model", "test-model")
        gw = start_gateway([sim.url])
        entry = wait_for(lambda: (e := _backend(gw.url))["token_usage"] is not None and e)
        assert entry["stages"] == [{"stage": "engine", "unit": "requests", "limit": 24}]
        info = httpx.get(sim.url + "/server_info").json()
        assert entry["max_total_tokens"] == info["internal_states"][0]["memory_usage"]["token_capacity"]
        assert entry["token_usage"] == 0.0
        time.sleep(1.0)  # five more probe ticks
        assert "deprecated" not in sim.output()
    finally:
        procs.close()
