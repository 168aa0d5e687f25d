"""Sweep `--max-running-requests` on the engine model directly (no HTTP) with a real workload file.

The fast loop for a profile or a workload: the requests and arrivals of `loadtest/workloads/seed.yaml`
(or any workload) replayed into the engine (see replay.py), then the very table, shape checks,
recommendation and seed distribution `omnigate loadtest validate-seed` prints (its `+ omnigate` rows
need a real gateway and exist only there). Seconds per sweep instead of minutes.
Usage: `python -m loadtest.sim.shape [--workload FILE] [--caps 8,16,32,48,64,128] [--duration S]`.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import yaml

from loadtest import seed_table
from loadtest.sim.config import SimConfig
from loadtest.sim.profile import load_profile
from loadtest.sim.replay import arrivals, physics, seed_spread, sweep
from loadtest.workload import load_workload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--workload", type=Path, default=seed_table.HERE / "seed.yaml")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--caps", default=",".join(map(str, seed_table.VALUES)))
    ap.add_argument("--duration", type=float, help="measured seconds (default: the workload's)")
    ap.add_argument("--seeds", help="workload seeds for the distribution (default: the file's and next 4)")
    ap.add_argument("--max-total-tokens", type=int)
    ap.add_argument("--mem-fraction-static", type=float)
    ap.add_argument("--max-queued-requests", type=int)
    ap.add_argument("--oom-mode", choices=["retract", "crash"], default="retract")
    ap.add_argument("--open-loop", action="store_true", help="no outer in-flight cap (not the protocol)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=YAML", help="workload override")
    args = ap.parse_args(argv)
    overrides: dict[str, Any] = {} if args.duration is None else {"duration": args.duration}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    w = load_workload(args.workload, overrides)
    profile = load_profile(args.profile)
    config = SimConfig(
        profile=args.profile,
        max_total_tokens=args.max_total_tokens,
        mem_fraction_static=args.mem_fraction_static,
        max_queued_requests=args.max_queued_requests,
        oom_mode=args.oom_mode,
    )
    caps = [c.strip() for c in args.caps.split(",") if c.strip()]
    t0 = time.perf_counter()
    sends = arrivals(w, profile)
    doc = sweep(w, profile, caps, config, sends, args.open_loop)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds else seed_table.seed_list(w)
    doc["seeds"] = seed_spread(w, profile, caps, config, seeds)
    doc["physics"] = physics(profile)
    code = seed_table.report(doc)
    for value, res in zip(caps, doc["points"], strict=True):
        s, peak = res["summary"], res["backend"]["queued"]["peak"]
        e2e = (s["e2e_ms"] or {}).get("p99", 0.0)
        print(
            f"  {value}: sent {s['requests']}, rejected {s['rejected']}, errors {s['errors']}, "
            f"e2e P99 {e2e:.0f} ms, queued peak {peak}, running peak {res['backend']['running']['peak']}"
        )
    print(f"({len(sends)} sends, {time.perf_counter() - t0:.1f} s)")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
