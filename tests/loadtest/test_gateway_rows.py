"""validate-seed's `N + omnigate` rows: a real `omnigate serve` with the default policy in front of a real
simulator subprocess, loaded by the harness, both stopped after the point."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loadtest.results import build_result
from loadtest.runner import RunOptions, execute
from loadtest.seed import DEFAULT_POLICY
from loadtest.sweep import gateway_target
from loadtest.workload import load_workload

pytestmark = pytest.mark.e2e

MODEL = "Qwen/Qwen2.5-Omni-7B"


async def test_gateway_target_runs_the_default_policy_in_front_of_the_engine_at_the_points_cap(
    tmp_path: Path,
) -> None:
    w = load_workload(
        None,
        {
            "model": MODEL,
            "mix": {"text": 1},
            "duration": 2.0,
            "arrivals": {"shape": "constant", "process": "constant", "rate": 3.0},
            "warmup": {"duration": 0},
            "output_tokens": {"dist": "fixed", "value": 20},
            "drain": 30,
        },
    )
    target = gateway_target(DEFAULT_POLICY, ["--profile", "default", "--seed", "1"], MODEL)
    async with target("8") as ep, httpx.AsyncClient(trust_env=False) as client:
        engine = ep.scrape[0]
        assert ep.url != engine
        info = (await client.get(engine + "/server_info")).json()
        opts = RunOptions(url=ep.url, workload=w, scrape_targets=ep.scrape, cache_dir=tmp_path)
        records, samples = await execute(opts)
        served = (await client.get(engine + "/metrics")).text
    assert info["max_running_requests"] == 8 and info["sim_time_scale"] == 1.0
    res = build_result(records, samples, opts)
    s = res["summary"]
    assert (s["requests"], s["completed"], s["errors"]) == (6, 6, 0)
    # every answer passed the gateway (its queue-time header) and reached the engine behind it
    assert all("x-omnigate-queue-ms" in r.headers for r in records) and s["queue_ms"] is not None
    assert "sglang:num_requests_total" in served and res["backend"]["running"]["peak"] <= 8
    assert res["backend"]["memory_bytes"]["peak"] > 17 * (1 << 30)  # weights and context at least
    async with httpx.AsyncClient(trust_env=False, timeout=2) as client:
        for url in (ep.url, engine):  # both processes are gone with the point
            with pytest.raises(httpx.ConnectError):
                await client.get(url + "/health")
