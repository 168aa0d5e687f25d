"""A Redis without persistence killed and restarted under traffic (issue 18.5), with real processes: the
gateway (fail-open), the simulated backend, redis-server. The configured key works throughout (no 401
after Redis comes back empty, no 503 at the reconnect), /readyz tells the store's state, every
transition is logged once, and the usage of the outage reaches the restarted Redis's ledger."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import Admin, chat, write_config
from tests.support.processes import ManagedProcess, Processes
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

KEY = "og-forgetful-redis-" + "k" * 24


def _readyz(url: str) -> tuple[int, dict]:
    resp = httpx.get(url + "/readyz", timeout=5.0, trust_env=False)
    return resp.status_code, resp.json()


def test_redis_restarted_empty_under_traffic(sim: ManagedProcess, procs: Processes, tmp_path: Path) -> None:
    server = procs.redis(tmp_path / "redis", "--appendonly", "no")
    store = {"kind": "redis", "redis_url": f"redis://127.0.0.1:{server.port}/0", "redis_failure": "open"}
    tenants = [{"id": "steady", "keys": [KEY]}]
    gw = procs.gateway(write_config(tmp_path / "gw.yaml", sim.url, store, tenants))
    statuses: Counter[int] = Counter()
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            statuses[chat(gw.url, KEY, max_tokens=4).status_code] += 1
            time.sleep(0.02)

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        assert wait_for(lambda: statuses[200] >= 10, timeout=20)
        before_kill = statuses[200]
        server.kill()
        assert wait_for(lambda: _readyz(gw.url)[1]["store"]["state"] == "down", timeout=10)
        assert _readyz(gw.url)[0] == 200  # fail-open: the replica still serves under local limits
        during = statuses[200]
        assert wait_for(lambda: statuses[200] >= during + 10, timeout=20)  # and it does
        server.start()  # no persistence: it comes back empty
        assert wait_for(lambda: _readyz(gw.url)[1]["store"]["state"] == "up", timeout=15)
        assert _readyz(gw.url)[0] == 200
        after = statuses[200]
        assert wait_for(lambda: statuses[200] >= after + 20, timeout=20)
    finally:
        stop.set()
        worker.join()
    assert set(statuses) == {200}, statuses  # not one 401 or 503 through it all
    log = gw.output()
    assert log.count("tenant change subscription lost") == 1
    assert log.count("tenant store redis unreachable") == 1
    assert log.count("lost its data") == 1
    # the new Redis's ledger holds every request since the kill: the outage's, replayed, and the later
    # ones (what the old Redis held went with it; the one in flight at the kill may have gone too)
    since_kill = statuses[200] - before_kill
    with Admin(gw.url) as admin:
        wait_for(lambda: admin.usage("steady")["today"]["requests"] >= since_kill, timeout=10)
        assert since_kill - 1 <= admin.usage("steady")["today"]["requests"] <= since_kill
