"""`omnigate loadtest run | sweep | compare | validate-seed` — argument parsing and output files only."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from loadtest import html, seed, seed_table
from loadtest.compare import Row, compare, compare_rows
from loadtest.report import load_json, markdown
from loadtest.results import build_result
from loadtest.runner import RunOptions, execute
from loadtest.sweep import PointTarget, SweepError, policy_target, run_sweep, sim_target
from loadtest.trace import TraceError
from loadtest.workload import WorkloadError, load_workload

# Shortcut flag → workload field (everything else via --set key=value).
SHORTCUTS = {
    "rate": "arrivals.rate",
    "shape": "arrivals.shape",
    "process": "arrivals.process",
    "burstiness": "arrivals.burstiness",
    "concurrency": "arrivals.concurrency",
    "duration": "duration",
    "count": "count",
    "seed": "seed",
    "model": "model",
    "api_key": "api_key",
    "trace": "trace",
    "time_scale": "time_scale",
    "slo_ttft_ms": "slo.ttft_ms",
    "slo_tpot_ms": "slo.tpot_ms",
    "slo_e2e_ms": "slo.e2e_ms",
    "warmup_s": "warmup.duration",
}


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", "-w", help="workload YAML (loadtest/workloads/*.yaml); defaults otherwise")
    p.add_argument("--url", default="http://127.0.0.1:8080", help="OpenAI-compatible base URL")
    p.add_argument("--rate", type=float, help="requests/s for the constant shape")
    p.add_argument("--shape", choices=["constant", "step", "sawtooth", "burst"])
    p.add_argument("--process", choices=["poisson", "gamma", "constant"])
    p.add_argument("--burstiness", type=float, help="gamma shape: <1 burstier, >1 smoother")
    p.add_argument("--concurrency", type=int, help="closed loop with this many requests in flight")
    p.add_argument("--duration", type=float, help="measured seconds (simulated seconds when time-scaled)")
    p.add_argument("--count", type=int, help="stop after this many measured requests")
    p.add_argument("--warmup-s", type=float, help="warm-up seconds, excluded from results")
    p.add_argument("--seed", type=int)
    p.add_argument("--model")
    p.add_argument("--api-key", help="bearer key when the workload lists no tenants")
    p.add_argument("--trace", help="replay a JSONL trace of {timestamp, request}")
    p.add_argument("--time-scale", type=float, help="the target runs this many times faster (simulator)")
    p.add_argument("--mix", help="bucket shares, e.g. text=5,single_image=3,multi_image=2")
    p.add_argument("--slo-ttft-ms", type=float)
    p.add_argument("--slo-tpot-ms", type=float)
    p.add_argument("--slo-e2e-ms", type=float)
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="any workload field (YAML value)"
    )
    p.add_argument("--workers", type=int, default=1, help="load-generator processes")
    p.add_argument("--scrape", action="append", default=[], help="backend base URL whose /metrics to poll")
    p.add_argument("--gpus", type=float, default=0.0, help="GPU count, for GPU-seconds per success")
    p.add_argument(
        "--cache-dir", type=Path, help="synthetic media cache (default ~/.cache/omnigate/loadtest)"
    )
    p.add_argument("--out", type=Path, help="directory for result.json, report.md, report.html")
    p.add_argument("--no-progress", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnigate loadtest", description="The seed's validation protocol.")
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="one run: warm-up, then the measured phase")
    _workload_args(run)
    sw = sub.add_parser("sweep", help="a ladder of one parameter with knee and recommendation")
    _workload_args(sw)
    sw.add_argument("--values", required=True, help="comma-separated ladder, e.g. 8,16,32,48,64,128")
    sw.add_argument("--sim-flag", help="simulator flag to sweep (a simulator is started per point)")
    sw.add_argument("--sim-arg", action="append", default=[], help="extra simulator argument (repeatable)")
    sw.add_argument("--policy-key", help="dotted gateway policy key to sweep live through the admin API")
    sw.add_argument("--policy-file", type=Path, help="the policy file the gateway reloads")
    sw.add_argument("--admin-url", help="gateway admin base URL (default: --url)")
    sw.add_argument("--admin-token-env", default="OMNIGATE_ADMIN_TOKEN")
    sw.add_argument("--headroom", type=float, default=0.1, help="SLO margin for the recommendation")
    cmp = sub.add_parser("compare", help="differences between two result JSON files")
    cmp.add_argument("a", type=Path)
    cmp.add_argument("b", type=Path)
    cmp.add_argument("--threshold", type=float, default=0.05)
    cmp.add_argument("--out", type=Path, help="also write compare.html here: A and B side by side")
    vs = sub.add_parser("validate-seed", help="reproduce the seed article's batch-cap table on the simulator")
    vs.add_argument("--values", default=",".join(map(str, seed_table.VALUES)))
    vs.add_argument("--duration", type=float, help="simulated seconds per point")
    vs.add_argument("--time-scale", type=float)
    vs.add_argument("--out", type=Path)
    vs.add_argument(
        "--gateway-caps",
        default=",".join(map(str, seed.GATEWAY_CAPS)),
        help="engine caps behind `omnigate serve` (real time, ~4 min each); empty: none",
    )
    vs.add_argument(
        "--gateway-check",
        choices=["report", "enforce"],
        default="report",
        help="whether the `N + omnigate` rows' check decides the exit code",
    )
    vs.add_argument("--gateway-policy", type=Path, default=seed.DEFAULT_POLICY)
    return p


def workload_from(args: argparse.Namespace) -> Any:
    overrides: dict[str, Any] = {}
    for attr, key in SHORTCUTS.items():
        v = getattr(args, attr, None)
        if v is not None:
            overrides[key] = v
    if args.mix:
        try:
            overrides["mix"] = {k: float(v) for k, v in (part.split("=") for part in args.mix.split(","))}
        except ValueError:
            raise WorkloadError(f"--mix: expected bucket=share,…, got {args.mix!r}") from None
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise WorkloadError(f"--set: expected KEY=VALUE, got {item!r}")
        overrides[key] = yaml.safe_load(value)
    return load_workload(args.workload, overrides)


def options_from(args: argparse.Namespace) -> RunOptions:
    return RunOptions(
        url=args.url,
        workload=workload_from(args),
        workers=args.workers,
        scrape_targets=args.scrape,
        gpus=args.gpus,
        progress=not args.no_progress and sys.stderr.isatty(),
        cache_dir=args.cache_dir,
    )


def emit(doc: dict[str, Any], out: Path | None) -> None:
    """Markdown to stdout; with --out also result.json, report.md and the self-contained report.html."""
    md = markdown(doc)
    print(md)
    if out is not None:
        written = html.write_outputs(doc, out, md)
        print(f"wrote {out}/" + ", ".join(written), file=sys.stderr)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    opts = options_from(args)
    records, samples = await execute(opts)
    return build_result(records, samples, opts)


def _target(args: argparse.Namespace, opts: RunOptions) -> PointTarget:
    if bool(args.sim_flag) == bool(args.policy_key):
        raise SweepError("give exactly one of --sim-flag or --policy-key")
    if args.sim_flag:
        return sim_target(args.sim_flag.removeprefix("--"), args.sim_arg, opts.workload.time_scale)
    if args.policy_file is None:
        raise SweepError("--policy-key needs --policy-file")
    token = os.environ.get(args.admin_token_env, "")
    if not token:
        raise SweepError(f"--policy-key needs an admin token in ${args.admin_token_env}")
    return policy_target(
        opts.url, args.admin_url or opts.url, token, args.policy_file, args.policy_key, opts.scrape_targets
    )


async def _sweep(args: argparse.Namespace) -> dict[str, Any]:
    opts = options_from(args)
    values = [v.strip() for v in args.values.split(",") if v.strip()]
    param = args.sim_flag or args.policy_key or "value"
    return await run_sweep(opts, param, values, _target(args, opts), args.headroom, on_point=_announce)


def _announce(value: str, res: dict[str, Any]) -> None:
    s = res["summary"]
    print(
        f"  point {value}: {s['output_throughput']:.0f} tok/s, {s['completed']}/{s['requests']} ok",
        file=sys.stderr,
    )


def _compare(args: argparse.Namespace) -> int:
    a, b = load_json(args.a), load_json(args.b)
    pairs = [("", a, b)]
    if a["kind"] == "sweep" and b["kind"] == "sweep":
        common = [v for v in a["values"] if v in b["values"]]
        pairs = [(v, a["points"][a["values"].index(v)], b["points"][b["values"].index(v)]) for v in common]
    elif a["kind"] != b["kind"]:
        raise ValueError("compare needs two runs or two sweeps")
    total = 0
    sections: list[tuple[str, list[Row]]] = []
    for label, ra, rb in pairs:
        lines, n = compare(ra, rb, args.threshold)
        if label:
            print(f"\n## {a['param']} = {label}")
        print("\n".join(lines))
        sections.append((f"{a['param']} = {label}" if label else "", compare_rows(ra, rb, args.threshold)))
        total += n
    print(f"\n{total} regression(s) beyond {args.threshold:.0%}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        names = (str(args.a), str(args.b))
        path = args.out / "compare.html"
        if html.write_page(path, lambda: html.render_compare(a, b, sections, names)):
            print(f"wrote {path}", file=sys.stderr)
    return 1 if total else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.cmd == "run":
            emit(asyncio.run(_run(args)), args.out)
        elif args.cmd == "sweep":
            emit(asyncio.run(_sweep(args)), args.out)
        elif args.cmd == "compare":
            return _compare(args)
        else:
            return seed.validate(
                args.values,
                args.duration,
                args.time_scale,
                args.out,
                args.gateway_caps,
                args.gateway_check,
                args.gateway_policy,
            )
    except (WorkloadError, TraceError, SweepError, ValueError, OSError) as e:
        print(f"omnigate loadtest: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
