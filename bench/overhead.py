"""What does omnigate add on top of a backend, next to nginx, smg and LiteLLM doing the same proxying?

One run starts a zero-latency SGLang-like backend, nginx (one worker, no buffering, keep-alive upstream),
LiteLLM's proxy (one worker, if installed) and omnigate several ways, each in its own process on loopback,
plus a load generator in another:

  omnigate          a policy whose admission stages never hold a request (no accumulating window, a fixed
                    concurrency limit above the load), no auth: the proxy, not the scheduler
  omnigate+log      the same with the access log on
  omnigate+otel     the same with OpenTelemetry traces on, every request sampled, exported to a sink
  default           policies/default.yaml and a tenant API key on every request (auth, quotas, pricing,
                    the adaptive limit), memory store: what one production process costs
  default·redis     the same on a Redis store (a private redis-server), one worker
  default·redis×2   `serve --workers 2` on that store: two replicas on one port sharing the budgets
  default·redis×4   `serve --workers 4` likewise
  smg               Shepherd Model Gateway (Rust), if installed (--smg PATH): the yardstick of issue 42

For non-streaming ("whole") and streaming (100 chunks) chat completions it measures, per target:

  one conn    closed loop, one connection                  → added p50 with no queueing at all
  fixed rate  open loop, Poisson arrivals at --rate req/s   → latency, added p50/p99 vs direct
  max         closed loop, --concurrency connections        → requests/s

and prints a markdown table, the ratios against nginx, LiteLLM and one worker, and each proxy's CPU time
per request (the number a busy machine disturbs least; the Redis rows include redis-server's). Streaming
clients do not ask for usage, so omnigate also does its usage-stripping work.

    .venv/bin/python -m bench.overhead [--duration 5] [--warmup 1] [--rate 200] [--concurrency 32]
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
import yaml

from bench.common.load_client import Load, LoadClient, http_request
from bench.common.servers import (
    LITELLM_KEY,
    MODEL,
    PASS_THROUGH_POLICY,
    ROOT,
    STREAM_BODY,
    STREAM_CHUNKS,
    WHOLE_BODY,
    Procs,
    cpu_seconds,
    start_backend,
    start_litellm,
    start_nginx,
    start_omnigate,
    start_redis,
    start_smg,
    tool_exe,
)

PATH = "/v1/chat/completions"
KINDS = ("whole", "stream")
MODES = ("one conn", "fixed rate", "max")
NAN = float("nan")
TENANT_KEY = "og-bench-tenant-key-0123456789"
DEFAULT_POLICY = ROOT / "policies" / "default.yaml"
# The backend answers in ~0.1 ms, so it prefills far faster than the default policy's prior of 10,000
# prompt tokens/s (an A100-class engine): the default rows state its speed, as an operator states their
# engine's. With the prior, the prefill metering would hold the max rows at the prior's pace of prompt
# tokens — the policy protecting a GPU, not the proxy's ceiling.
BACKEND_PREFILL_TOKENS_PER_S = 1e9


def default_policy(src: Path | None = None) -> str:
    """policies/default.yaml (of the tree `src`, else this one: a baseline reads its own policy keys)
    with the prefill prior set to the zero-latency backend's speed."""
    path = DEFAULT_POLICY if src is None else src / "policies" / "default.yaml"
    policy = yaml.safe_load(path.read_text())
    policy.setdefault("queue", {})["initial_prefill_tokens_per_s"] = BACKEND_PREFILL_TOKENS_PER_S
    return yaml.safe_dump(policy)


WORKER_ROWS = (("default·redis", 1), ("default·redis×2", 2), ("default·redis×4", 4))
OPTIONAL = ("omnigate+log", "omnigate+otel", "default", *(name for name, _ in WORKER_ROWS), "litellm", "smg")

Result = dict[str, Any]
Results = dict[tuple[str, str, str], Result]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    port: int
    procs: tuple[str, ...]  # the processes whose CPU is the proxying cost; ("backend",) for direct
    key: str | None = None  # the tenant API key sent with every request
    exact: bool = True  # returns the backend's bytes unchanged (LiteLLM rewrites them: content is compared)
    fixed_rate: bool = True  # LiteLLM's max is far below --rate: an open loop would only pile up a backlog


def _request(t: Target, kind: str) -> bytes:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": STREAM_CHUNKS,
        "stream": kind == "stream",
    }
    headers = {"authorization": f"Bearer {t.key}"} if t.key else None
    return http_request(t.port, PATH, orjson.dumps(body), headers)


def start_traced(procs: Procs, backend: int, policy: str) -> Target:
    """The omnigate row with tracing on (sampling 1.0) exporting to a sink that drops what it gets."""
    sink = procs.start(
        "otlp-sink",
        [sys.executable, str(Path(__file__).parent.joinpath("common", "otlp_sink.py"))],
        capture_stdout=True,
    )
    assert sink.stdout is not None
    sink_port = int(sink.stdout.readline().decode().split()[1])
    tracing = {
        "enabled": True,
        "endpoint": f"http://127.0.0.1:{sink_port}/v1/traces",
        "schedule_delay_s": 1.0,
    }
    port = start_omnigate(procs, "omnigate-otel", backend, access_log=False, policy=policy, tracing=tracing)
    return Target("omnigate+otel", port, ("omnigate-otel",))


def start_targets(procs: Procs, args: argparse.Namespace, policy: str) -> list[Target]:
    want = set(args.targets.split(",")) if args.targets else set(OPTIONAL)
    backend = start_backend(procs)
    targets = [Target("direct", backend, ("backend",))]
    nginx = start_nginx(procs, backend)
    if nginx is None:
        print("nginx not found (apt-get install -y nginx): measuring without it.", file=sys.stderr)
    else:
        targets.append(Target("nginx", nginx, ("nginx",)))
    if "litellm" in want:
        exe = tool_exe("litellm", args.litellm)
        if exe is None:
            print(
                "litellm not found (pip install -e '.[litellm]', or --litellm PATH): measuring without it.",
                file=sys.stderr,
            )
        else:
            port = start_litellm(procs, backend, exe)
            targets.append(Target("litellm", port, ("litellm",), LITELLM_KEY, exact=False, fixed_rate=False))
    if "smg" in want:
        exe = tool_exe("smg", args.smg)
        if exe is None:
            print("smg not found (pip install smg, or --smg PATH): measuring without it.", file=sys.stderr)
        else:
            targets.append(Target("smg", start_smg(procs, backend, exe), ("smg",)))
    port = start_omnigate(procs, "omnigate", backend, access_log=False, policy=policy)
    targets.append(Target("omnigate", port, ("omnigate",)))
    if "omnigate+log" in want:
        port = start_omnigate(procs, "omnigate-log", backend, access_log=True, policy=policy)
        targets.append(Target("omnigate+log", port, ("omnigate-log",)))
    if "omnigate+otel" in want:
        targets.append(start_traced(procs, backend, policy))
    default = default_policy()
    if args.baseline_src:
        src = Path(args.baseline_src)
        port = start_omnigate(
            procs,
            "base",
            backend,
            access_log=False,
            policy=default_policy(src),
            src=src,
            tenant_key=TENANT_KEY,
        )
        targets.append(Target("default@base", port, ("base",), TENANT_KEY))
    if "default" in want:
        port = start_omnigate(
            procs, "default", backend, access_log=False, policy=default, tenant_key=TENANT_KEY
        )
        targets.append(Target("default", port, ("default",), TENANT_KEY))
    redis_rows = [(name, n) for name, n in WORKER_ROWS if name in want]
    redis_url = start_redis(procs) if redis_rows else None
    if redis_rows and redis_url is None:
        print("redis-server not found (apt-get install -y redis-server): no Redis rows.", file=sys.stderr)
    for name, workers in redis_rows if redis_url else []:
        proc = f"redis-w{workers}"
        port = start_omnigate(
            procs,
            proc,
            backend,
            access_log=False,
            policy=default,
            tenant_key=TENANT_KEY,
            redis_url=redis_url,
            workers=workers,
        )
        targets.append(Target(name, port, (proc, "redis"), TENANT_KEY))
    return targets


def _content(kind: str, body: bytes) -> str:
    """The answer's text: a whole completion's message, or a stream's deltas joined."""
    if kind == "whole":
        return str(orjson.loads(body)["choices"][0]["message"]["content"])
    parts = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or ():
                parts.append((choice.get("delta") or {}).get("content") or "")
    return "".join(parts)


def check_bodies(lc: LoadClient, targets: list[Target]) -> list[str]:
    """Every target must return exactly what the backend sends a client (LiteLLM, which rewrites ids and
    framing: the same answer text); a mismatch makes numbers moot."""
    problems = []
    for t in targets:
        for kind, expected in zip(KINDS, (WHOLE_BODY, STREAM_BODY), strict=True):
            status, body = lc.fetch(t.port, _request(t, kind))
            if status != 200:
                problems.append(f"{t.name} {kind}: HTTP {status}: {body[:200]!r}")
            elif t.exact and body != expected:
                problems.append(f"{t.name} {kind}: body differs from the backend's ({len(body)} bytes)")
            elif not t.exact and _content(kind, body) != _content(kind, expected):
                problems.append(f"{t.name} {kind}: answer text differs from the backend's")
    return problems


def settle(procs: Procs, most: float = 5.0) -> None:
    """Wait (at most `most` seconds) until every process together is below a tenth of a core: a target
    still working off the last cell's load (LiteLLM's logging, a backlog) would slow the next one."""
    pids = [p.pid for p in procs.procs.values() if p.poll() is None]
    deadline = time.monotonic() + most
    while time.monotonic() < deadline:
        before = sum(cpu_seconds(pid) for pid in pids)
        time.sleep(0.2)
        if sum(cpu_seconds(pid) for pid in pids) - before < 0.02:
            return


def measure(lc: LoadClient, procs: Procs, t: Target, load: Load, warmup: float) -> Result:
    """Settle, warm up (discarded), then measure; process CPU is read around the measured part only."""
    settle(procs)
    if warmup > 0:
        lc.run(replace(load, duration=warmup))
    pids = {name: procs.procs[name].pid for name in {*t.procs, "backend"}}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    wall = time.monotonic()
    result = lc.run(load)
    wall = time.monotonic() - wall
    used = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    done = result["count"] + result["errors"]
    proxy = sum(used[name] for name in t.procs) if t.procs != ("backend",) else NAN
    result["backend_cpu"] = used["backend"] / wall
    result["proxy_cpu"] = proxy / wall
    result["proxy_us"] = proxy / done * 1e6 if done else NAN
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


def _verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def summary(results: Results, rate: float) -> list[str]:
    """The ratios against nginx, LiteLLM and one worker, and the targets, met or missed."""
    lines = []
    for kind in KINDS:
        fixed = {n: results.get(("fixed rate", kind, n)) for n in ("direct", "nginx", "omnigate")}
        d, n, o = fixed["direct"], fixed["nginx"], fixed["omnigate"]
        if d and o:
            added = o["p99"] - d["p99"]
            vs = f" (nginx adds {(n['p99'] - d['p99']) * 1000:.2f} ms)" if n else ""
            lines.append(
                f"{kind:6}: omnigate adds {added * 1000:.2f} ms p99 at {rate:g} req/s{vs}: "
                f"{_verdict(added < 0.002)} the < 2 ms target"
            )
        for (mode, k, name), r in results.items():
            if mode == "fixed rate" and k == kind and name != "direct" and r["proxy_cpu"] >= 0.95:
                lines.append(
                    f"{kind:6}: {name} is saturated at {rate:g} req/s (CPU {r['proxy_cpu'] * 100:.0f} %): "
                    "its fixed-rate latency is queueing, not per-request overhead"
                )
        top = {name: r for (mode, k, name), r in results.items() if mode == "max" and k == kind}
        mo, mn = top.get("omnigate"), top.get("nginx")
        if mo and mn and mn["rps"]:
            ratio = mo["rps"] / mn["rps"]
            lines.append(
                f"{kind:6}: max req/s omnigate/nginx = {mo['rps']:.0f}/{mn['rps']:.0f} = {ratio:.3f}: "
                f"{_verdict(ratio >= 1 / 3)} the ≥ 0.33 target"
            )
            lines.append(
                f"{kind:6}: CPU per request omnigate/nginx = {mo['proxy_us']:.0f}/{mn['proxy_us']:.0f} µs "
                f"= {mo['proxy_us'] / mn['proxy_us'] if mn['proxy_us'] else NAN:.0f}×"
            )
        lines += _default_policy_lines(kind, results, top)
    return lines


PEERS = ("nginx", "smg", "litellm", "default@base", "default")
CHUNK_NOISE = 1.05  # "no worse" for CPU per chunk: within 5 %, a shared box's spread between two rows


def _peer_figures(results: Results) -> dict[str, tuple[float, float, float, float]]:
    """Per target: CPU µs per whole request and added p50 ms at one connection, max whole req/s, CPU µs per
    streamed chunk (the max cell's CPU per stream over its chunks)."""
    figures = {}
    d1 = results.get(("one conn", "whole", "direct"))
    for name in PEERS:
        mw, ms = results.get(("max", "whole", name)), results.get(("max", "stream", name))
        o1 = results.get(("one conn", "whole", name))
        if mw and ms and o1 and d1:
            added = (o1["p50"] - d1["p50"]) * 1000
            figures[name] = (mw["proxy_us"], added, mw["rps"], ms["proxy_us"] / STREAM_CHUNKS)
    return figures


def scale_lines(results: Results) -> list[str]:
    """`serve --workers N` on one Redis: max req/s and CPU per whole request for each N measured, against
    one worker. Every worker is a process with its own event loop; on a box with fewer free cores than
    workers (plus the client and the backend) the ratio is the cores', not the workers'."""
    rows = [(n, results.get(("max", "whole", name))) for name, n in WORKER_ROWS]
    measured = [(n, r) for n, r in rows if r]
    if len(measured) < 2 or measured[0][0] != 1:
        return []
    one = measured[0][1]
    cores = len(os.sched_getaffinity(0))
    lines = []
    for n, r in measured:
        lines.append(
            f"workers {n}: max req/s {r['rps']:.0f} ({r['rps'] / one['rps']:.2f}× one worker), "
            f"CPU per whole request {r['proxy_us']:.0f} µs (redis-server's included), "
            f"{r['proxy_cpu'] * 100:.0f} % of a core"
        )
    if max(n for n, _ in measured) + 2 > cores:
        lines.append(
            f"  ... on {cores} cores shared with the load client and the backend: more workers than free "
            "cores add processes, not throughput; the CPU per request is the figure to scale by"
        )
    return lines


def peer_lines(results: Results) -> list[str]:
    """Issue 42's yardstick: the default policy with a tenant key beside nginx, smg and LiteLLM, and its
    targets: CPU per whole request and added p50 at one connection ≤ 2× smg's, CPU per streamed chunk no
    worse than the baseline's (`--baseline-src`)."""
    figures = _peer_figures(results)
    if "default" not in figures:
        return []
    lines = [
        "| target | CPU µs / whole request | added p50 ms, one conn | max req/s, 32 conns | CPU µs / chunk |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, (cpu, added, rps, chunk) in figures.items():
        lines.append(f"| {name} | {cpu:.0f} | {added:.2f} | {rps:.0f} | {chunk:.1f} |")
    cpu, added, rps, chunk = figures["default"]
    for peer in ("smg", "nginx"):
        if peer in figures:
            p_cpu, p_added, p_rps, p_chunk = figures[peer]
            lines.append(
                f"default/{peer}: CPU per whole request {cpu / p_cpu:.2f}×, "
                f"added p50 {added / p_added:.2f}×, max req/s {rps / p_rps:.2f}×, "
                f"CPU per chunk {chunk / p_chunk:.2f}×"
            )
    if "smg" in figures:
        p_cpu, p_added = figures["smg"][:2]
        lines.append(f"CPU per whole request ≤ 2× smg's: {_verdict(cpu <= 2 * p_cpu)} ({cpu / p_cpu:.2f}×)")
        ok = added <= 2 * p_added
        lines.append(f"added p50, one conn ≤ 2× smg's: {_verdict(ok)} ({added / p_added:.2f}×)")
    if "default@base" in figures:
        b_cpu, b_chunk = figures["default@base"][0], figures["default@base"][3]
        ok = chunk <= CHUNK_NOISE * b_chunk
        lines.append(
            f"CPU per streamed chunk no worse than the baseline's: {_verdict(ok)} ({chunk:.1f} against "
            f"{b_chunk:.1f} µs, {chunk / b_chunk:.2f}×; within {CHUNK_NOISE:g}× counts); "
            f"CPU per whole request {cpu / b_cpu:.2f}× the baseline's"
        )
    return lines


def _default_policy_lines(kind: str, results: Results, top: dict[str, Result]) -> list[str]:
    """Issue 19's targets for the default policy with a tenant key (whole requests; streams for reading)."""
    lines = []
    whole = kind == "whole"
    dm = top.get("default")
    if dm:
        us = dm["proxy_us"]
        verdict = f": {_verdict(us <= 600)} the ≤ 600 µs target" if whole else ""
        lines.append(f"{kind:6}: CPU per request, default policy + key = {us:.0f} µs{verdict}")
    one = {name: r for (mode, k, name), r in results.items() if mode == "one conn" and k == kind}
    d1, o1 = one.get("direct"), one.get("default")
    if d1 and o1:
        added = o1["p50"] - d1["p50"]
        verdict = f": {_verdict(added <= 0.0007)} the ≤ 0.7 ms target" if whole else ""
        lines.append(
            f"{kind:6}: added p50 at one connection, default policy + key = {added * 1000:.2f} ms{verdict}"
        )
    w1, w2 = top.get("default·redis"), top.get("default·redis×2")
    if w1 and w2 and w1["rps"]:
        ratio = w2["rps"] / w1["rps"]
        verdict = f": {_verdict(ratio >= 1.6)} the ≥ 1.6× target" if whole else ""
        rps = f"{w2['rps']:.0f}/{w1['rps']:.0f}"
        lines.append(f"{kind:6}: max req/s 2 workers / 1 worker = {rps} = {ratio:.2f}×{verdict}")
        c1, c2 = w1["proxy_cpu"], w2["proxy_cpu"]
        if c1 and c2 / c1 < 1.6:  # CPU per request is about the same: the ratio follows the cores given
            lines.append(
                f"{kind:6}:   ... with {c2 / c1:.2f}× the CPU one worker had ({c2 * 100:.0f} % against "
                f"{c1 * 100:.0f} % of a core): the box's free cores, not the workers, set that ratio"
            )
    lite = top.get("litellm")
    if lite and lite["rps"]:
        for name in ("default", "default·redis×2"):
            r = top.get(name)
            if r:
                ratio = r["rps"] / lite["rps"]
                verdict = f": {_verdict(ratio >= 20)} the ≥ 20× target" if whole else ""
                lines.append(
                    f"{kind:6}: max req/s {name}/litellm = {r['rps']:.0f}/{lite['rps']:.0f} "
                    f"= {ratio:.1f}×{verdict}"
                )
        dm = top.get("default")
        if dm and dm["proxy_us"]:  # each proxy saturates one core: the ratio its max req/s would read
            ratio = lite["proxy_us"] / dm["proxy_us"]
            lines.append(
                f"{kind:6}:   ... per CPU second (each on a whole core): litellm/default CPU per request "
                f"= {lite['proxy_us']:.0f}/{dm['proxy_us']:.0f} µs = {ratio:.1f}×"
            )
    return lines


LOOP_STEPS = 10**7


def loop_seconds() -> float:
    """Seconds one core takes for a plain Python loop: the box's speed, so absolute µs from two boxes
    can be told apart from a change in the code."""
    t0 = time.perf_counter()
    total = 0
    for i in range(LOOP_STEPS):
        total += i
    return time.perf_counter() - t0


def machine_note(load_before: tuple[float, float, float], loop_s: float) -> str:
    cores = len(os.sched_getaffinity(0))
    return (
        f"Machine: {cores} cores; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
        f"a {LOOP_STEPS:,}-step Python loop took {loop_s:.2f} s before the run.\n"
        f"Client, backend and proxy are three busy processes on {cores} cores (plus whatever else runs), "
        "so max req/s\nis what this box gives, not a dedicated core per proxy; a proxy near 100 % CPU is "
        "the bottleneck, one far\nbelow is held back by the others. 'proxy CPU µs/req' is the proxy's own "
        "cost. Added latency is\np(target) − p(direct), a difference of percentiles. Send lag = actual − "
        "scheduled send time."
    )


def run(args: argparse.Namespace) -> int:
    load_before, loop_s = os.getloadavg(), loop_seconds()
    with tempfile.TemporaryDirectory(prefix="omnigate-bench-") as tmp:
        procs = Procs(Path(tmp))
        lc: LoadClient | None = None
        try:
            policy = Path(args.policy).read_text() if args.policy else PASS_THROUGH_POLICY
            targets = start_targets(procs, args, policy)
            lc = LoadClient()
            problems = check_bodies(lc, targets)
            for p in problems:
                print(f"ERROR: {p}")
            if problems:
                return 1  # a target that does not proxy the backend faithfully: its figures mean nothing
            arrivals = "uniform" if args.uniform else "Poisson"
            names = ", ".join(t.name for t in targets)
            print(
                f"Targets: {names}. Whole and streaming ({STREAM_CHUNKS} chunks) chat completions;\n"
                f"one conn = closed loop on one connection, fixed rate = {args.rate:g} req/s {arrivals}, "
                f"max = closed loop at concurrency {args.concurrency};\n"
                f"{args.duration:g} s each after {args.warmup:g} s warm-up.\n",
                flush=True,
            )
            print(HEADER, flush=True)
            results: Results = {}
            for mode in MODES:
                for kind in KINDS:
                    for t in targets:
                        if mode == "fixed rate" and not t.fixed_rate:
                            continue
                        for name in t.procs:
                            procs.check_alive(name)
                        load = Load(
                            port=t.port,
                            request=_request(t, kind),
                            concurrency={"one conn": 1, "max": args.concurrency}.get(
                                mode, args.open_connections
                            ),
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
            print("\n".join(peer_lines(results)))
            print("\n".join(scale_lines(results)))
            if any(not t.fixed_rate for t in targets):
                print(f"litellm has no fixed-rate rows: its max req/s is far below {args.rate:g}.")
            print()
            print(machine_note(load_before, loop_s))
            return 0
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
    parser.add_argument("--concurrency", type=int, default=32, help="max mode connections (default 32)")
    parser.add_argument(
        "--open-connections", type=int, default=8, help="fixed-rate mode pre-opened connections (default 8)"
    )
    parser.add_argument("--uniform", action="store_true", help="evenly spaced arrivals instead of Poisson")
    parser.add_argument(
        "--targets",
        help=f"comma-separated rows beside direct, nginx and omnigate, of: {','.join(OPTIONAL)} "
        "(default: all)",
    )
    parser.add_argument("--litellm", help="the `litellm` executable (default: beside this python, or PATH)")
    parser.add_argument("--smg", help="the `smg` executable (default: beside this python, or PATH)")
    parser.add_argument(
        "--policy",
        help="policy file for the omnigate row (default: admission stages that never hold or shed)",
    )
    parser.add_argument(
        "--baseline-src",
        help="also measure the default row from this source tree (row default@base), e.g. "
        "`git worktree add /tmp/base HEAD~3`: before/after under the same conditions",
    )
    args = parser.parse_args(argv)
    if min(args.duration, args.rate, args.concurrency, args.open_connections) <= 0 or args.warmup < 0:
        parser.error("--duration, --rate, --concurrency and --open-connections must be positive")
    if args.duration + args.warmup > 30:
        parser.error("keep --duration + --warmup ≤ 30 s: the run has up to 64 such cells")
    unknown = set(args.targets.split(",")) - set(OPTIONAL) if args.targets else set()
    if unknown:
        parser.error(f"--targets: unknown {', '.join(sorted(unknown))}; choose from {', '.join(OPTIONAL)}")

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
