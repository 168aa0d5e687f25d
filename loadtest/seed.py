"""validate-seed: the seed article's batch-cap sweep on the simulator, printed next to the article's table.

The protocol is fixed and is the article's own measurement: each point offers the same open-loop seed
load (workloads/seed.yaml: Poisson arrivals on a sawtooth, 5:3:2 mix) through an outer admission layer
that keeps at most `cap` requests in the engine (the harness's in-flight cap, RunOptions.max_in_flight;
the client holds the rest and reports that time as "outer wait"). TTFT P99 and queue P99 are the
engine's own, from its scraped histograms; TPOT comes from the client; throughput is generated tokens/s;
memory is GPU memory in use (context, weights, CUDA graphs, KV cells holding tokens, activations).

Then the same load, with no harness cap, through a real `omnigate serve` running `policies/default.yaml`
in front of the engine at 64 and at 128 (`N + omnigate` rows, simulator at time scale 1 so the policy's
seconds are the engine's), and the recommendation on five workload seeds (the engine replayed, as
`python -m loadtest.sim.shape` does). The judgement is seed_table.py's: a failed check exits 1; the
gateway rows' check is printed and counts only with `gateway_check="enforce"`.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from loadtest import html
from loadtest.report import markdown
from loadtest.results import build_result
from loadtest.runner import RunOptions, execute
from loadtest.seed_table import HERE, SEED_CHOICE, GatewayCheck, report, seed_list
from loadtest.sim.config import SimConfig
from loadtest.sim.profile import load_profile
from loadtest.sim.replay import HEADROOM, PARAM, physics, seed_spread
from loadtest.sweep import Endpoint, PointTarget, analyse, gateway_target, sim_target
from loadtest.workload import Workload, load_workload

DEFAULT_POLICY = Path(__file__).resolve().parents[1] / "policies" / "default.yaml"
GATEWAY_CAPS = (64, 128)


def seed_workload(duration: float | None = None, time_scale: float | None = None) -> Workload:
    overrides: dict[str, Any] = {}
    if duration is not None:
        overrides["duration"] = duration
    if time_scale is not None:
        overrides["time_scale"] = time_scale
    return load_workload(HERE / "seed.yaml", overrides)


async def _point(target: PointTarget, value: str, w: Workload, cap: int | None) -> dict[str, Any]:
    async with target(value) as ep:
        res = await _measure(ep, w, cap)
    res["meta"].update(param=PARAM, value=value, max_in_flight=cap)
    return res


async def _measure(ep: Endpoint, w: Workload, cap: int | None) -> dict[str, Any]:
    opts = RunOptions(url=ep.url, workload=w, scrape_targets=ep.scrape, max_in_flight=cap)
    records, samples = await execute(opts)
    return build_result(records, samples, opts)


async def sweep(w: Workload, ladder: list[str], gateway_caps: list[str], policy: Path) -> dict[str, Any]:
    """One simulator per point behind the harness's cap, then each gateway row, then the analysis."""
    sim_args = ["--profile", "default", "--seed", str(w.seed)]
    target = sim_target(PARAM, sim_args, w.time_scale)
    results = []
    for value in ladder:
        results.append(await _point(target, value, w, int(value)))
        print(f"  point {value} done", file=sys.stderr)
    doc = analyse(PARAM, ladder, results, w.slo.model_dump(), headroom=HEADROOM)
    real_time = w.model_copy(update={"time_scale": 1.0})  # the policy's seconds are the engine's
    via = gateway_target(policy, sim_args, w.model, time_scale=1.0)
    rows = []
    for cap in gateway_caps:
        rows.append((f"{cap} + omnigate", await _point(via, cap, real_time, None)))
        print(f"  {cap} + omnigate done", file=sys.stderr)
    doc["gateway_rows"] = rows
    return doc


def validate(
    values: str,
    duration: float | None,
    time_scale: float | None,
    out: Path | None,
    gateway_caps: str = ",".join(map(str, GATEWAY_CAPS)),
    gateway_check: GatewayCheck = "report",
    policy: Path = DEFAULT_POLICY,
) -> int:
    w = seed_workload(duration, time_scale)
    ladder = [v.strip() for v in values.split(",") if v.strip()]
    via = [v.strip() for v in gateway_caps.split(",") if v.strip()]
    if via and SEED_CHOICE not in ladder:
        raise ValueError(f"the gateway rows are judged against the {SEED_CHOICE} row: add it to --values")
    per_point = (w.duration + w.warmup.duration) / w.time_scale
    real = (w.duration + w.warmup.duration) * len(via)
    print(f"validate-seed: {len(ladder)} points × ~{per_point:.0f} s, then {len(via)} gateway rows "
          f"in real time (~{real / 60:.0f} min)", file=sys.stderr)  # fmt: skip
    doc = asyncio.run(sweep(w, ladder, via, policy))
    profile = load_profile("default")
    doc["seeds"] = seed_spread(w, profile, ladder, SimConfig(), seed_list(w))
    doc["physics"] = physics(profile)
    code = report(doc, gateway_check)
    if out is not None:
        html.write_outputs(doc, out, markdown(doc))
    return code
