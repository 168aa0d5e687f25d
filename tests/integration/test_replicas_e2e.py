"""Replicas share each engine's budgets through Redis (gateway/coordination/): real `omnigate serve`
processes, the suite's redis-server and the simulator, whose own `sim:requests_peak` counts what all of
them sent it at once."""

from __future__ import annotations

import asyncio
import json
import re
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
