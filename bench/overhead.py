"""What does omnigate add on top of a backend, next to nginx doing the same proxying?

One run starts a zero-latency SGLang-like backend, omnigate (access log off, and once more with it on) and
nginx (one worker, no buffering, keep-alive upstream), each in its own process on loopback, plus a load
generator in another. For non-streaming ("whole") and streaming (100 chunks) chat completions it measures,
per target:

  fixed rate  open loop, Poisson arrivals at --rate req/s   → latency, added p50/p99 vs direct
  max         closed loop, --concurrency connections        → requests/s

and prints a markdown table, the omnigate/nginx ratios and each proxy's CPU time per request (the number a
busy machine disturbs least). Streaming clients do not ask for usage, so omnigate also does its
usage-stripping work. omnigate runs with a policy whose admission stages never hold a request (no batching
window, a fixed concurrency limit above the load): what is measured is the proxy, not the scheduler.

    .venv/bin/python bench/overhead.py [--duration 5] [--warmup 1] [--rate 200] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _load import Load, LoadClient, http_request
from _servers import (
    MODEL,
    PASS_THROUGH_POLICY,
    STREAM_BODY,
    STREAM_CHUNKS,
    WHOLE_BODY,
    Procs,
    cpu_seconds,
    start_backend,
    start_nginx,
    start_omnigate,
)

PATH = "/v1/chat/completions"
KINDS = ("whole", "stream")
MODES = ("fixed rate", "max")
NAN = float("nan")

Result = dict[str, Any]
Results = dict[tuple[str, str, str], Result]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    port: int
    proc: str  # the process whose CPU is the proxying cost; "backend" for direct


def _request(port: int, kind: str) -> bytes:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": STREAM_CHUNKS,
        "stream": kind == "stream",
    }
    return http_request(port, PATH, orjson.dumps(body))


def start_targets(procs: Procs, log_row: bool, policy: str, baseline: Path | None) -> list[Target]:
    backend = start_backend(procs)
    targets = [Target("direct", backend, "backend")]
    nginx = start_nginx(procs, backend)
    if nginx is None:
        print("nginx not found (apt-get install -y nginx): measuring without it.", file=sys.stderr)
    else:
        targets.append(Target("nginx", nginx, "nginx"))
    if baseline is not None:
        port = start_omnigate(procs, "omnigate-base", backend, access_log=False, policy=policy, src=baseline)
        targets.append(Target("omnigate@base", port, "omnigate-base"))
    port = start_omnigate(procs, "omnigate", backend, access_log=False, policy=policy)
    targets.append(Target("omnigate", port, "omnigate"))
    if log_row:
        port = start_omnigate(procs, "omnigate-log", backend, access_log=True, policy=policy)
        targets.append(Target("omnigate+log", port, "omnigate-log"))
    return targets


def check_bodies(lc: LoadClient, targets: list[Target]) -> list[str]:
    """Every target must return exactly what the backend sends a client; a mismatch makes numbers moot."""
    problems = []
    for t in targets:
        for kind, expected in zip(KINDS, (WHOLE_BODY, STREAM_BODY), strict=True):
            status, body = lc.fetch(t.port, _request(t.port, kind))
            if status != 200:
                problems.append(f"{t.name} {kind}: HTTP {status}")
            elif body != expected:
                problems.append(f"{t.name} {kind}: body differs from the backend's ({len(body)} bytes)")
    return problems


def measure(lc: LoadClient, procs: Procs, t: Target, load: Load, warmup: float) -> Result:
    """Warm up (discarded), then measure; process CPU is read around the measured part only."""
    if warmup > 0:
        lc.run(replace(load, duration=warmup))
    pids = {name: procs.procs[name].pid for name in {t.proc, "backend"}}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    wall = time.monotonic()
    result = lc.run(load)
    wall = time.monotonic() - wall
    used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    done = result["count"] + result["errors"]
    result["backend_cpu"] = used["backend"] / wall
    result["proxy_cpu"] = used[t.proc] / wall if t.proc != "backend" else NAN
    result["proxy_us"] = used[t.proc] / done * 1e6 if t.proc != "backend" and done else NAN
    return result


HEADER = (
    "| mode | kind | target | req/s | p50 ms | p99 ms | +p50 ms | +p99 ms | proxy CPU µs/req "
    "| CPU % proxy/backend/client | send lag p99 ms | errors |\n"
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _ms(v: float) -> str:
    return "—" if v != v else f"{v * 1000:.2f}"


def _pct(v: float) -> str:
    return "—" if v != v else f"{v * 100:.0f}"


def format_row(mode: str, kind: str, name: str, r: Result, direct: Result | None) -> str:
    base = direct if direct is not None and name != "direct" else None
    cells = [
        mode,
        kind,
        name,
        f"{r['rps']:.0f}",
        _ms(r["p50"]),
        _ms(r["p99"]),
        _ms(r["p50"] - base["p50"] if base else NAN),
        _ms(r["p99"] - base["p99"] if base else NAN),
        "—" if r["proxy_us"] != r["proxy_us"] else f"{r['proxy_us']:.0f}",
        f"{_pct(r['proxy_cpu'])}/{_pct(r['backend_cpu'])}/{_pct(r['client_cpu'])}",
        _ms(r["lag_p99"]) if mode == "fixed rate" else "—",
        str(r["errors"]),
    ]
    return "| " + " | ".join(cells) + " |"


def summary(results: Results, rate: float) -> list[str]:
    """The omnigate/nginx ratios and the issue's two targets, met or missed."""
    lines = []
    for kind in KINDS:
        fixed = {n: results.get(("fixed rate", kind, n)) for n in ("direct", "nginx", "omnigate")}
        top = {n: results.get(("max", kind, n)) for n in ("nginx", "omnigate")}
        d, n, o = fixed["direct"], fixed["nginx"], fixed["omnigate"]
        if d and o:
            added = o["p99"] - d["p99"]
            verdict = "meets" if added < 0.002 else "MISSES"
            vs = f" (nginx adds {(n['p99'] - d['p99']) * 1000:.2f} ms)" if n else ""
            lines.append(
                f"{kind:6}: omnigate adds {added * 1000:.2f} ms p99 at {rate:g} req/s{vs}: "
                f"{verdict} the < 2 ms target"
            )
        for name in ("nginx", "omnigate"):
            r = fixed[name]
            if r and r["proxy_cpu"] >= 0.95:
                lines.append(
                    f"{kind:6}: {name} is saturated at {rate:g} req/s (CPU {r['proxy_cpu'] * 100:.0f} %): "
                    "its fixed-rate latency is queueing, not per-request overhead"
                )
        mo, mn = top["omnigate"], top["nginx"]
        if mo and mn and mn["rps"]:
            ratio = mo["rps"] / mn["rps"]
            verdict = "meets" if ratio >= 1 / 3 else "MISSES"
            lines.append(
                f"{kind:6}: max req/s omnigate/nginx = {mo['rps']:.0f}/{mn['rps']:.0f} = {ratio:.3f}: "
                f"{verdict} the ≥ 0.33 target"
            )
            lines.append(
                f"{kind:6}: CPU per request omnigate/nginx = {mo['proxy_us']:.0f}/{mn['proxy_us']:.0f} µs "
                f"= {mo['proxy_us'] / mn['proxy_us'] if mn['proxy_us'] else NAN:.0f}×"
            )
    return lines


def machine_note(load_before: tuple[float, float, float]) -> str:
    cores = len(os.sched_getaffinity(0))
    return (
        f"Machine: {cores} cores; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after.\n"
        f"Client, backend and proxy are three busy processes on {cores} cores (plus whatever else runs), "
        "so max req/s\nis what this box gives, not a dedicated core per proxy; a proxy near 100 % CPU is "
        "the bottleneck, one far\nbelow is held back by the others. 'proxy CPU µs/req' is the proxy's own "
        "cost. Added latency is\np(target) − p(direct), a difference of percentiles. Send lag = actual − "
        "scheduled send time."
    )


def run(args: argparse.Namespace) -> int:
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="omnigate-bench-") as tmp:
        procs = Procs(Path(tmp))
        lc: LoadClient | None = None
        try:
            policy = Path(args.policy).read_text() if args.policy else PASS_THROUGH_POLICY
            baseline = Path(args.baseline_src) if args.baseline_src else None
            targets = start_targets(procs, not args.no_log_row, policy, baseline)
            lc = LoadClient()
            problems = check_bodies(lc, targets)
            for p in problems:
                print(f"WARNING: {p}")
            arrivals = "uniform" if args.uniform else "Poisson"
            names = ", ".join(t.name for t in targets)
            print(
                f"Targets: {names}. Whole and streaming ({STREAM_CHUNKS} chunks) chat completions;\n"
                f"fixed rate = {args.rate:g} req/s {arrivals}, max = closed loop at concurrency "
                f"{args.concurrency}; {args.duration:g} s each after {args.warmup:g} s warm-up.\n",
                flush=True,
            )
            print(HEADER, flush=True)
            results: Results = {}
            for mode in MODES:
                for kind in KINDS:
                    for t in targets:
                        procs.check_alive(t.proc)
                        load = Load(
                            port=t.port,
                            request=_request(t.port, kind),
                            concurrency=args.concurrency if mode == "max" else args.open_connections,
                            duration=args.duration,
                            rate=args.rate if mode == "fixed rate" else None,
                            poisson=not args.uniform,
                        )
                        r = results[(mode, kind, t.name)] = measure(lc, procs, t, load, args.warmup)
                        direct = results.get((mode, kind, "direct"))
                        print(format_row(mode, kind, t.name, r, direct), flush=True)
            print()
            for (mode, kind, name), r in results.items():
                if r["errors"]:
                    print(f"errors in {mode} {kind} {name}: {r['error_statuses']}")
            print("\n".join(summary(results, args.rate)))
            print()
            print(machine_note(load_before))
            return 1 if problems else 0
        finally:
            if lc is not None:
                lc.close()
            procs.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per cell (default 5)")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds of load before each cell (default 1)"
    )
    parser.add_argument("--rate", type=float, default=200.0, help="fixed-rate mode, req/s (default 200)")
    parser.add_argument("--concurrency", type=int, default=16, help="max mode connections (default 16)")
    parser.add_argument(
        "--open-connections", type=int, default=8, help="fixed-rate mode pre-opened connections (default 8)"
    )
    parser.add_argument("--uniform", action="store_true", help="evenly spaced arrivals instead of Poisson")
    parser.add_argument("--no-log-row", action="store_true", help="skip omnigate with its access log on")
    parser.add_argument(
        "--policy", help="policy file for omnigate (default: admission stages that never hold or shed)"
    )
    parser.add_argument(
        "--baseline-src",
        help="also measure omnigate from this source tree (row omnigate@base), e.g. "
        "`git worktree add /tmp/base HEAD~3`: before/after under the same conditions",
    )
    args = parser.parse_args(argv)
    if min(args.duration, args.rate, args.concurrency, args.open_connections) <= 0 or args.warmup < 0:
        parser.error("--duration, --rate, --concurrency and --open-connections must be positive")
    if args.duration + args.warmup > 30:
        parser.error("keep --duration + --warmup ≤ 30 s: the run has 16 such cells")

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("\ninterrupted; all child processes stopped.", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as e:
        print(f"overhead: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
