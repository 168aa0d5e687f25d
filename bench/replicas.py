"""Replicas benchmark: 1, 2 and 3 gateway replicas on one Redis in front of the same simulated engines.

    .venv/bin/python -m bench.replicas                  # every scenario, ~6–8 min on the 2-core box
    .venv/bin/python -m bench.replicas --scenarios sawtooth --replicas 1,2 --duration 60

The house is `bench/scheduling.py`'s (its engines, its time-scaled default policy, its load and metrics),
plus a private `redis-server` that every replica's `store` points at: the replicas share the tenants,
quotas and each engine's budgets (gateway/coordination/). Every figure is in the simulated engine's time.

Scenarios (in this order by default):
- sawtooth: the seed mix's compare sawtooth (0.3× → 2× capacity), split evenly across N replicas (one
  stream per replica, each a seed of its own at 1/N of the rate), N in `--replicas`, with a fixed limit
  (`--limit`, the same for every run) so the engine's own peak (`sim:requests_peak`, a maximum since the
  engine started) can be held to it; first, for reference, one gateway on its embedded store, and one on
  the Redis store with `coordination.enabled: false`. Target: N replicas' peak goodput within 5 % of
  one replica's.
- flood: the scheduling benchmark's flood with the high-priority stream on replica A and the low flood
  (3× capacity) on replica B; one replica with both streams for reference. Target: the high-priority
  TTFT P99 within its 2 s SLO.
- kill: two replicas at 0.8× capacity (one stream each, fixed limit), replica B killed with -9 a third
  into the run: how soon A's share is the whole limit again, what A's stream lost (nothing), what B's
  clients saw (their connections cut or refused: answered by an error, nothing run twice), and the
  engine's peak.
- adaptive: the sawtooth with the policy's adaptive controller (one limit owner per engine), for one
  replica and the most; from here on the engine's peak is no longer judged against a fixed limit.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.common.args import comma_list
from bench.common.servers import ROOT, Procs, free_port
from bench.scheduling import (
    HEADER,
    MIX_CAPACITY,
    MIXES,
    TTFT_SLO_S,
    House,
    Stream,
    peak_goodput,
    row,
    run,
    ttft_p99,
    verdict,
    workload,
)
from gateway.livepolicy.policy import load_policy
from loadtest.workload import Workload

STATE_HEADERS = {"authorization": "Bearer bench"}


@dataclass
class Bench:
    house: House
    args: argparse.Namespace
    redis_url: str
    fixed_only: bool = True  # every run so far had the fixed limit: the engine's peak is judged by it

    @property
    def fixed(self) -> dict[str, Any]:
        n = self.args.limit
        return {"algorithm": "fixed", "initial": n, "min": n, "max": n}

    def replicas(self, name: str, n: int, controller: dict[str, Any], store: str = "shared") -> Replicas:
        """`n` replicas on the Redis store sharing the engines; `store`: "unshared", the Redis store with
        `coordination.enabled: false`; "embedded", the gateway's own in-memory store."""
        if controller.get("algorithm") != "fixed":
            self.fixed_only = False
        return Replicas(
            self.house, name, n, controller, None if store == "embedded" else self.redis_url, store
        )


class Replicas:
    """N replicas of one gateway config on the house's engines and one Redis; `stop` prints each one's
    view and stops them all."""

    def __init__(
        self,
        house: House,
        name: str,
        n: int,
        controller: dict[str, Any],
        redis_url: str | None,
        store: str = "shared",
    ) -> None:
        prefix = f"bench:{name}:"  # each run its own keys: no lease or limit owner carried over
        redis = (
            None if redis_url is None else {"kind": "redis", "redis_url": redis_url, "redis_prefix": prefix}
        )
        config = house.gateway_config(name, controller, store=redis)
        if store == "unshared":
            data = orjson.loads(config.read_bytes())
            config.write_bytes(orjson.dumps({**data, "coordination": {"enabled": False}}))
        self.house = house
        self.names = [f"{name}-{chr(ord('a') + i)}" for i in range(n)]
        self.urls = [house.start_gateway(replica, config) for replica in self.names]

    def stop(self) -> None:
        for name, url in zip(self.names, self.urls, strict=True):
            if name in self.house.procs.procs:
                self.house.stop(name, url)


async def shared_view(client: httpx.AsyncClient, url: str) -> list[dict[str, Any]]:
    """Every backend's `shared` section of `url`'s /admin/state (the engines in the house's order)."""
    resp = await client.get(url + "/admin/state", headers=STATE_HEADERS)
    return [b["shared"] for b in resp.json()["pools"]["interactive"]["backends"]]


class Watch:
    """Polls every live replica's /admin/state every 0.1 s (wall) during a run: the engine limits they
    see, and the sum of all replicas' shares in each one's view (the allocator's answer to its last
    refresh: one instant of Redis, unlike reading the replicas one after another) against the limit."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = list(urls)
        self.limits: set[int] = set()
        self.over = -(10**9)  # the most the shares together ever exceeded an engine's limit (≤ 0: never)
        self._task: asyncio.Task[None] | None = None

    async def _poll(self) -> None:
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                for url in list(self.urls):
                    try:
                        views = await shared_view(client, url)
                    except (httpx.HTTPError, KeyError, ValueError):
                        continue
                    for v in views:
                        self.limits.add(v["engine_limit"])
                        self.over = max(self.over, sum(v["replica_shares"].values()) - v["engine_limit"])
                await asyncio.sleep(0.1)

    def __enter__(self) -> Watch:
        self._task = asyncio.create_task(self._poll())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def engine_peak(house: House) -> int:
    """The most requests any engine held at once since it started (`sim:requests_peak`)."""
    peak = 0
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        for url in house.engines:
            text = (await client.get(url + "/metrics")).text
            match = re.search(r"^sim:requests_peak\{[^}]*\} (\S+)$", text, re.MULTILINE)
            peak = max(peak, int(float(match.group(1)))) if match else peak
    return peak


async def peak_verdict(bench: Bench) -> list[str]:
    """While every run so far had the fixed limit: did any engine ever hold more than it?"""
    if not bench.fixed_only:
        return []
    peak = await engine_peak(bench.house)
    limit = bench.args.limit
    return [
        verdict(
            f"the engine never held more than the limit ({limit})", peak <= limit, f"sim:requests_peak {peak}"
        )
    ]


def seed_mix(args: argparse.Namespace, label: str, i: int, **over: Any) -> Workload:
    """The seed mix from the chat tenant, the i-th stream of a run (seed 42 + i)."""
    return workload(args, label, mix=MIXES["seed"], seed=42 + i, api_key="sk-chat", **over)


def split(args: argparse.Namespace, label: str, n: int, low: float, high: float) -> list[Stream]:
    """The seed mix's sawtooth from `low` to `high` req/s as `n` streams of 1/n of it (seeds 42, 43, …)."""
    arrivals = {"shape": "sawtooth", "process": "poisson", "period": args.duration / 2}
    return [
        Stream(
            f"{label} {i + 1}/{n}",
            seed_mix(
                args,
                f"{label}-{i}",
                i,
                arrivals={**arrivals, "low": low / n, "high": high / n},
                warmup={"duration": 5, "rate": low / n},
            ),
        )
        for i in range(n)
    ]


async def sawtooth(bench: Bench) -> list[str]:
    """The fixed-limit runs for every N, then (`adaptive`) the policy's controller for 1 and the most."""
    label = f"fixed {bench.args.limit}"
    setups = [  # for reference: the embedded default, and the Redis store without sharing the engines
        (1, f"{label}, no Redis", bench.fixed, "embedded"),
        (1, f"{label}, Redis, not shared", bench.fixed, "unshared"),
    ]
    return await _sawtooth(bench, setups + [(n, label, bench.fixed, "shared") for n in bench.args.replicas])


async def adaptive(bench: Bench) -> list[str]:
    counts = sorted({min(bench.args.replicas), max(bench.args.replicas)})
    return await _sawtooth(bench, [(n, "adaptive", {}, "shared") for n in counts])


async def _sawtooth(bench: Bench, setups: list[tuple[int, str, dict[str, Any], str]]) -> list[str]:
    house, args = bench.house, bench.args
    cap = MIX_CAPACITY["seed"] * len(house.sims)
    lines = [
        f"\n### sawtooth — seed mix, {0.3 * cap:.1f} → {2 * cap:.1f} req/s split across the replicas\n",
        "| replicas | limit | peak goodput r/s | vs 1 replica | SLO att. | rejected | Σ shares − limit, max "
        "| engine limits seen |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    peaks: dict[tuple[str, int], float] = {}
    for n, label, controller, store in setups:
        reps = bench.replicas(f"saw-{label.split()[0]}-{n}-{store}", n, controller, store)
        streams = split(args, f"{n}r", n, 0.3 * cap, 2 * cap)
        for s, url in zip(streams, reps.urls, strict=True):
            s.url = url
        try:
            with Watch(reps.urls) as watch:
                await run(house, reps.urls[0], streams)
        finally:
            reps.stop()
        peaks[(label, n)] = sum(peak_goodput(s) for s in streams)
        sent = sum(s.result["summary"]["requests"] for s in streams if s.result)
        good = sum(
            s.result["summary"]["slo_attainment"] * s.result["summary"]["requests"]
            for s in streams
            if s.result
        )
        rejected = sum(
            s.result["summary"]["rejection_rate"] * s.result["summary"]["requests"]
            for s in streams
            if s.result
        )
        base = peaks.get((label, 1))
        lines.append(
            f"| {n} | {label} | {peaks[(label, n)]:.2f} | "
            f"{'—' if not base or n == 1 else f'{peaks[(label, n)] / base:.0%}'} "
            f"| {good / max(1, sent):.1%} | {rejected / max(1, sent):.1%} "
            f"| {watch.over if watch.limits else '—'} "
            f"| {'—' if not watch.limits else f'{min(watch.limits)}–{max(watch.limits)}'} |"
        )
        print(lines[-1], flush=True)
    lines.append("")
    for (label, n), mine in peaks.items():
        one = peaks.get((label, 1))
        if n != 1 and one is not None:
            lines.append(
                verdict(
                    f"{n} replicas' peak goodput within 5 % of one replica's ({label})",
                    mine >= 0.95 * one,
                    f"{mine:.2f} vs {one:.2f} r/s = {mine / max(one, 1e-9):.0%}",
                )
            )
    return lines + await peak_verdict(bench)


async def flood(bench: Bench) -> list[str]:
    house, args = bench.house, bench.args
    cap = args.capacity * len(house.sims)
    out = ["\n### flood — low priority at 3× capacity beside a high-priority stream\n", HEADER]
    verdicts = []
    for n in (1, 2):
        hi = Stream(
            "high priority" + (" on A" if n == 2 else ""),
            workload(args, "hi", api_key="sk-hi", priorities=[{"value": 10}], **{"arrivals.rate": 0.3 * cap}),
        )
        lo = Stream(
            "low flood 3×" + (" on B" if n == 2 else ""),
            workload(
                args, "lo", api_key="sk-lo", priorities=[{"value": 0}], seed=43, **{"arrivals.rate": 3 * cap}
            ),
        )
        reps = bench.replicas(f"flood-{n}", n, {})
        hi.url, lo.url = reps.urls[0], reps.urls[-1]
        try:
            await run(house, reps.urls[0], [hi, lo])
        finally:
            reps.stop()
        name = f"{n} replica{'s' if n > 1 else ''}"
        out += [row(name, hi), row(name, lo)]
        verdicts.append(
            verdict(
                f"{name}: high-priority TTFT P99 within its SLO",
                ttft_p99(hi) <= TTFT_SLO_S * 1000,
                f"{ttft_p99(hi):.0f} ms vs {TTFT_SLO_S * 1000:.0f} ms",
            )
        )
    return [*out, "", *verdicts]


async def kill(bench: Bench) -> list[str]:
    house, args = bench.house, bench.args
    cap = args.capacity * len(house.sims)
    reps = bench.replicas("kill", 2, bench.fixed)
    streams = [
        Stream(
            f"on {side}",
            seed_mix(args, f"kill-{side}", i, **{"arrivals.rate": 0.4 * cap}),
            url=url,
        )
        for i, (side, url) in enumerate(zip("AB", reps.urls, strict=True))
    ]
    returned: list[float] = []

    async def kill_b() -> None:
        await asyncio.sleep(args.duration / house.k / 3)
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            before = (await shared_view(client, reps.urls[0]))[0]["share"]
            house.procs.procs[reps.names[1]].kill()  # kill -9
            killed = time.monotonic()
            for _ in range(500):  # ≤ 10 s: an outside process's state, nothing to await
                if (await shared_view(client, reps.urls[0]))[0]["share"] >= args.limit:
                    returned.append(time.monotonic() - killed)
                    break
                await asyncio.sleep(0.02)
            print(
                f"  A's share {before} before the kill, {args.limit} again after {returned[0]:.2f} s",
                flush=True,
            )

    try:
        killer = asyncio.create_task(kill_b())
        await run(house, reps.urls[0], streams)
        await killer
    finally:
        house.procs.procs.pop(reps.names[1], None)
        reps.stop()
    a, b = (s.result["summary"] for s in streams if s.result)
    lines = [
        f"\n### kill — two replicas at {0.8 * cap:.1f} req/s, B killed with -9 a third into the run\n",
        HEADER,
        *(row("2 replicas, B killed", s) for s in streams),
        "",
        verdict(
            "A's share is the whole limit again within the lease TTL (3 s)",
            bool(returned) and returned[0] <= 3.0 + 0.5,
            f"{returned[0]:.2f} s" if returned else "never",
        ),
        verdict(
            "nothing lost on A",
            a["error_rate"] == 0,
            f"errors {a['error_codes']}, rejected {a['rejection_rate']:.1%}",
        ),
        f"- B's clients: {b['error_rate']:.1%} of their requests answered by an error (cut or refused: "
        f"{b['error_codes']}); each is the client's to retry, none was sent twice by a gateway",
    ]
    return lines + await peak_verdict(bench)


async def main_async(args: argparse.Namespace) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    with tempfile.TemporaryDirectory(prefix="omnigate-replicas-") as tmp:
        procs = Procs(Path(tmp))
        try:
            port = free_port()
            procs.start(
                "redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp]
            )
            redis_url = f"redis://127.0.0.1:{port}/0"
            house = House(procs, args.time_scale, args.backends, load_policy(args.policy))
            bench = Bench(house, args, redis_url)
            report: list[str] = []
            started = time.monotonic()
            scenarios = {"sawtooth": sawtooth, "kill": kill, "flood": flood, "adaptive": adaptive}
            for name in args.scenarios:
                report += await scenarios[name](bench)
            print("\n".join(report))
            print(
                f"\nwall time {time.monotonic() - started:.0f} s, time scale {args.time_scale:g}, "
                f"{args.duration:g} simulated s per run, {len(house.sims)} engine(s)"
            )
        finally:
            procs.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--scenarios",
        type=comma_list(str),
        default=["sawtooth", "kill", "flood", "adaptive"],
        help="in this order the fixed-limit runs come first, so the engine's peak is judged by their limit",
    )
    ap.add_argument(
        "--replicas", type=comma_list(int), default=[1, 2, 3], help="replica counts of the sawtooth"
    )
    ap.add_argument("--limit", type=int, default=32, help="the fixed concurrency limit of the probe runs")
    ap.add_argument("--duration", type=float, default=60.0, help="simulated seconds per run")
    ap.add_argument(
        "--drain", type=float, default=20.0, help="simulated seconds to finish after the last send"
    )
    ap.add_argument("--time-scale", type=float, default=6.0)
    ap.add_argument("--backends", type=int, default=1)
    ap.add_argument("--capacity", type=float, default=MIX_CAPACITY["seed"], help="req/s one engine serves")
    ap.add_argument(
        "--policy", type=Path, default=ROOT / "policies" / "default.yaml", help="policy to time-scale"
    )
    args = ap.parse_args()
    if 1 not in args.replicas:
        ap.error("--replicas must include 1 (the baseline)")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
