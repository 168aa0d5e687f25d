"""Replicas share each engine's budgets through Redis (gateway/coordination/): real `omnigate serve`
processes, the suite's redis-server and the simulator, whose own `sim:requests_peak` counts what all of
them sent it at once."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.integration.conftest import ADMIN_TOKEN, MODEL, chat_body, write_config
from tests.support.processes import ManagedProcess, Processes

pytestmark = pytest.mark.e2e

LIMIT = 8
KEY = "sk-replicas-test"


def sim_peak(sim: ManagedProcess) -> int:
    text = httpx.get(sim.url + "/metrics", timeout=5.0, trust_env=False).text
    match = re.search(r"^sim:requests_peak\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert match is not None, "the simulator exports sim:requests_peak"
    return int(float(match.group(1)))


def replicas_config(tmp_path: Path, sim: ManagedProcess, redis_url: str, prefix: str) -> Path:
    """Two replicas' config: one pool on `sim`, a fixed limit of LIMIT, no deadline shedding (every
    stream waits its turn), one tenant."""
    store = {"kind": "redis", "redis_url": redis_url, "redis_prefix": prefix}
    tenants = [{"id": "acme", "keys": [KEY], "max_priority": 10, "quotas": {}}]
    path = write_config(tmp_path / "gateway.yaml", sim.url, store, tenants)
    policy = {
        "version": 1,
        "queue": {
            "classes": {
                "interactive": {
                    "ttft_p99_s": None,
                    "tpot_p99_s": None,
                    "completion_deadline_s": 600,
                    "max_wait_s": 120,
                    "shed_by_deadline": False,
                }
            }
        },
        "controller": {"algorithm": "fixed", "initial": LIMIT, "min": 1, "max": LIMIT},
    }
    path.with_name(path.stem + "-policy.yaml").write_text(yaml.safe_dump(policy))
    return path


async def stream(client: httpx.AsyncClient, url: str, tokens: int) -> int:
    """One streamed completion to its `[DONE]`; the completion tokens its usage chunk reports."""
    body = {**chat_body(tokens), "stream": True, "stream_options": {"include_usage": True}}
    headers = {"authorization": f"Bearer {KEY}"}
    lines = []
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status_code == 200, await resp.aread()
        lines = [line async for line in resp.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    usage = json.loads(lines[-2][len("data: ") :])["usage"]
    return int(usage["completion_tokens"])


def state(url: str) -> dict[str, Any]:
    resp = httpx.get(
        url + "/admin/state", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5.0, trust_env=False
    )
    assert resp.status_code == 200, resp.text
    data: dict[str, Any] = resp.json()
    return data


def shared(url: str) -> dict[str, Any]:
    (backend,) = state(url)["pools"]["interactive"]["backends"]
    info: dict[str, Any] = backend["shared"]
    return info


async def test_two_replicas_never_run_more_than_the_engine_limit(
    procs: Processes, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """The issue's probe: limit 8 per backend, 40 streams split across two replicas → the engine never
    holds more than 8, and every stream is served whole."""
    sim = procs.sim("--time-scale", "10", "--model", MODEL, "--max-running-requests", "64", name="engine")
    config = replicas_config(tmp_path, sim, redis_url, redis_prefix)
    a = procs.gateway(config, name="replica-a")
    b = procs.gateway(config, name="replica-b")
    async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
        counts = await asyncio.gather(*(stream(client, gw.url, 60) for gw in [a, b] * 20))
    assert counts == [60] * 40
    peak = sim_peak(sim)
    print(f"\nengine peak with two replicas: {peak} (limit {LIMIT})")
    assert peak <= LIMIT
    assert peak >= LIMIT - 2  # the engine was really filled: the shares add up to the limit
    views = [shared(a.url), shared(b.url)]
    assert [v["engine_limit"] for v in views] == [LIMIT, LIMIT]
    assert [v["mode"] for v in views] == ["leased", "leased"]
    assert {v["replica"] for v in views} == set(views[0]["replica_shares"])  # each sees both replicas
    assert sum(views[0]["replica_shares"].values()) <= LIMIT


async def poll(
    client: httpx.AsyncClient, url: str, done: Callable[[dict[str, Any]], bool], within_s: float
) -> dict[str, Any]:
    """`url`'s shared-budget view, polled every 50 ms until `done` holds (an outside process's state:
    nothing to await); fails after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    while True:
        resp = await client.get(url + "/admin/state", headers=headers)
        (backend,) = resp.json()["pools"]["interactive"]["backends"]
        view: dict[str, Any] = backend["shared"]
        if done(view):
            return view
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.05)


async def tenants_back(client: httpx.AsyncClient, url: str) -> None:
    """Wait (≤ 10 s) until the tenant store of `url` answers again after an outage: it stays away from
    Redis for its retry interval and reloads the key (tenants README), 503 until then."""
    body, headers = chat_body(1), {"authorization": f"Bearer {KEY}"}
    for _ in range(100):
        resp = await client.post(url + "/v1/chat/completions", json=body, headers=headers)
        if resp.status_code == 200:
            return
        assert resp.status_code == 503, resp.text
        await asyncio.sleep(0.1)
    raise AssertionError("the tenant store did not come back within 10 s")


def replica_names(url: str, want: int, tries: int = 60) -> set[str]:
    """The replicas that answer /admin/state on `url` over fresh connections, until `want` of them have."""
    seen: set[str] = set()
    for _ in range(tries):
        seen.add(shared(url)["replica"])
        if len(seen) >= want:
            break
    return seen


async def test_workers_are_replicas_on_one_port(
    procs: Processes, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """`serve --workers 2`: two processes answer on the one port, each a replica of the shared budget."""
    sim = procs.sim("--time-scale", "10", "--model", MODEL, "--max-running-requests", "64", name="engine")
    gw = procs.gateway(
        replicas_config(tmp_path, sim, redis_url, redis_prefix), args=["--workers", "2"], start_timeout=90.0
    )
    async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
        counts = await asyncio.gather(*(stream(client, gw.url, 40) for _ in range(30)))
    assert counts == [40] * 30
    assert sim_peak(sim) <= LIMIT
    names = replica_names(gw.url, 2)
    assert len(names) == 2
    assert set(shared(gw.url)["replica_shares"]) == names
    assert gw.stop() == 0  # SIGTERM reaches both workers; each drains and exits 0


def test_more_than_one_worker_without_redis_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gateway.yaml", "http://127.0.0.1:9", {"kind": "memory"})
    serve = ["serve", "--config", str(config), "--workers", "2", "--port", "9"]
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", *serve],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "--workers 2 needs a shared Redis store" in run.stderr


async def test_a_killed_replicas_share_returns_within_the_lease_ttl(
    procs: Processes, tmp_path: Path, redis_url: str, redis_prefix: str
) -> None:
    """kill -9 of a replica in the middle of its streams: the other replica's share grows back to the
    whole limit within the lease TTL (3 s), its own streams all finish, the engine never holds more than
    the limit."""
    sim = procs.sim("--time-scale", "2", "--model", MODEL, "--max-running-requests", "64", name="engine")
    config = replicas_config(tmp_path, sim, redis_url, redis_prefix)
    a = procs.gateway(config, name="replica-a")
    b = procs.gateway(config, name="replica-b")
    async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
        doomed = [asyncio.create_task(stream(client, a.url, 400)) for _ in range(12)]
        kept = [asyncio.create_task(stream(client, b.url, 60)) for _ in range(12)]
        before = await poll(client, b.url, lambda v: v["peer_active"] >= 2, 10.0)  # a runs streams
        a.kill()
        killed = time.monotonic()
        view = await poll(client, b.url, lambda v: v["share"] == LIMIT, 3.0 + 1.0)
        returned = time.monotonic() - killed
        assert await asyncio.gather(*kept) == [60] * 12
        for task in doomed:
            with pytest.raises(httpx.HTTPError):
                await task
    print(f"\nb's share before the kill {before['share']}, the whole limit again {returned:.2f} s after it")
    assert before["share"] < LIMIT
    assert set(view["replica_shares"]) == {view["replica"]}
    assert sim_peak(sim) <= LIMIT


async def test_redis_down_each_replica_holds_one_nth_and_takes_its_share_back(
    procs: Processes, tmp_path: Path
) -> None:
    """A private redis-server stopped under two replicas: each falls back to L / N = 4, the engine still
    never holds more than 8 and every stream is served; Redis back, both lease again and a busy replica's
    share grows past 4 again."""
    # append-only: the tenant and its key survive the restart (the shares start over either way)
    redis = procs.redis(tmp_path / "redis-data", "--appendonly", "yes", name="private-redis")
    sim = procs.sim("--time-scale", "10", "--model", MODEL, "--max-running-requests", "64", name="engine")
    config = replicas_config(tmp_path, sim, f"redis://127.0.0.1:{redis.port}/0", "outage:")
    a = procs.gateway(config, name="replica-a")
    b = procs.gateway(config, name="replica-b")
    async with httpx.AsyncClient(timeout=120.0, trust_env=False) as client:
        for gw in (a, b):  # both have the key cached before Redis goes
            assert await stream(client, gw.url, 5) == 5
            await poll(client, gw.url, lambda v: v["live_replicas"] == 2, 10.0)
        redis.kill()
        for gw in (a, b):
            view = await poll(client, gw.url, lambda v: v["mode"] == "fallback" and v["share"] == 4, 10.0)
            assert view["engine_limit"] == LIMIT
        counts = await asyncio.gather(*(stream(client, gw.url, 30) for gw in [a, b] * 12))
        assert counts == [30] * 24
        redis.start()
        for gw in (a, b):
            await poll(client, gw.url, lambda v: v["mode"] == "leased", 15.0)
        await tenants_back(client, a.url)
        # longer than the recovery cap (one TTL, 3 s): each stream runs ~6 s
        busy = [asyncio.create_task(stream(client, a.url, 3000)) for _ in range(8)]
        grown = await poll(client, a.url, lambda v: v["share"] > 4, 3.0 + 3.0)
        assert await asyncio.gather(*busy) == [3000] * 8
    print(f"\nRedis back: a's share {grown['share']} of {grown['engine_limit']}")
    assert sim_peak(sim) <= LIMIT
