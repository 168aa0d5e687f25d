"""A pool's kind adapter probes real backends: health, scrape and capacity as /admin/state shows them."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import ADMIN
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


def _state(url: str) -> dict:
    return httpx.get(f"{url}/admin/state", headers={"authorization": f"Bearer {ADMIN}"}).json()


def test_sglang_probe_reads_health_metrics_and_server_info(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([backend.url])
    assert wait_for(lambda: _state(gw.url)["pools"]["interactive"]["backends"][0]["token_usage"] is not None)
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


def test_an_unhealthy_backend_is_marked_and_recovers(start_backend, start_gateway):
    backend = start_backend()
    gw = start_gateway([backend.url])

    def healthy() -> bool:
        return _state(gw.url)["pools"]["interactive"]["backends"][0]["healthy"]

    backend.behaviour.healthy = False
    assert wait_for(lambda: not healthy())
    backend.behaviour.healthy = True
    assert wait_for(healthy)
