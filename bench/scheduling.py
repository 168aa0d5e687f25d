"""Scheduling benchmark: does omnigate's admission beat clients going straight to the engine?

    .venv/bin/python -m bench.scheduling                       # every scenario, a few minutes
    .venv/bin/python -m bench.scheduling --scenarios compare --workloads seed --duration 120

Simulated SGLang Omni backends (`python -m loadtest.sim`, default profile, engine cap 64, priority
scheduling) run `--time-scale` times faster than real time; the gateway is a real `omnigate serve`
whose policy has every time divided by the same factor, so the whole house runs on one compressed clock
and every figure below is printed in the simulated engine's seconds. Load and metrics come from the
harness (`loadtest.runner.execute`, `loadtest.results.build_result`); the client's send lag (wall ms)
is printed so an overloaded load generator shows.

Scenarios (each a flag-sized run; `--duration` is simulated seconds per run):
- compare: per workload (seed 5:3:2, text-heavy, multi-image-heavy; Poisson on a sawtooth QPS):
  direct to the engines (cap 64), omnigate with a fixed concurrency limit for each `--sweep` value,
  omnigate adaptive (the policy's controller). Targets: adaptive ≥ 1.5× direct goodput under
  the sawtooth peak, ≥ 95 % of the best fixed limit's, and its TPOT P99 under the SLO. `--mix` adds a
  workload of your own (one nothing was tuned on). One run's peak goodput spreads ±6 % (about
  100 requests decide it), as much as that target: `--repeats 3 --duration 180` runs every setting
  three times, interleaved, three times longer, and judges the means (printing each one's range).
- flood: a low-priority flood at 3× capacity next to a high-priority stream; high TTFT P99 ≤ its SLO
  (`--flood-duration`, 240 simulated s: ~370 high-priority requests, so the P99 is not their maximum).
- tenants: a light tenant alone, then beside a tenant sending 10× its rate; light TTFT P99 ≤ 1.2× alone
  (`--tenants-duration`, 240 simulated s: ~320 light requests, so the P99 is not their maximum;
  `--tenants-seeds`, default 42,7,99, repeats it per workload seed and judges the P99 of every seed's
  requests together: one run's P99 is its third-worst request and swings ±30 % between seeds).
- mixed: interactive (high priority) beside an offline flood in one pool; interactive attainment ≥ 99 %
  while offline uses ≥ 80 % of the capacity interactive leaves (capacity: an offline-only run).
- speech: text chat, chat with audio out and /v1/audio/speech on one simulated sglang-omni server, direct vs
  omnigate (staged capacity); targets: speech RTF P99 < 1, text TTFT P99 within its SLO, peak goodput ≥
  1.5× direct.
- multiturn: conversations of 3–10 turns (pictures in the first, the history resent every turn, think
  time between turns) on `--multiturn-backends` engines running SGLang's radix cache, through omnigate
  with each placement rule: least outstanding tokens, sgl-model-gateway's cache_aware, and the predicted
  first token (the default). TTFT P99, SLO attainment, goodput and the engines' own prefill per request
  (prompt − cached, from their usage); target: first_token ≥ 1.3× least_tokens' goodput. The engines
  restart for each rule (no rule inherits another's cache), and every rule gets the same conversations.
- lending: the same targets with separate pools — an offline pool of its own engines whose whole
  requests borrow the interactive engines (lending on, `max_load` 1.0) and give them back when an
  interactive request waits; capacity = the offline flood alone on both pools' engines.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench.common.args import comma_list
from bench.common.conversations import drive, plan
from bench.common.servers import ROOT, Procs, cpu_seconds, free_port, wait_http
from gateway.livepolicy.policy import Policy, load_policy
from loadtest.media import MediaCache
from loadtest.metrics import meets_slo, percentile, summarize
from loadtest.records import RequestRecord
from loadtest.results import build_result
from loadtest.runner import RunOptions, execute
from loadtest.workload import RequestFactory, Slo, Workload, load_workload

MODEL = "Qwen/Qwen2.5-Omni-7B"
SEED_WORKLOAD = ROOT / "loadtest" / "workloads" / "seed.yaml"
TTFT_SLO_S, TPOT_SLO_S = 2.0, 0.06  # interactive SLO (virtual seconds), as in policies/default.yaml
MIXES = {
    "seed": {"text": 5, "single_image": 3, "multi_image": 2},
    "text": {"text": 9, "single_image": 1},
    "multi": {"text": 1, "single_image": 1, "multi_image": 8},
}
# Request capacity of one default-profile engine at cap 64 (req/s, simulated), per mix, read off this
# benchmark's own direct runs; each compare sawtooth runs from 0.3× to 2× it. The scenarios use the
# seed mix's (`--capacity` overrides).
MIX_CAPACITY = {"seed": 5.0, "text": 15.0, "multi": 2.5}
CAPACITY_RPS = MIX_CAPACITY["seed"]
TENANTS = [
    {"id": t, "keys": [f"sk-{t}"], "max_priority": 10, "default_class": "interactive"}
    for t in ("hi", "lo", "light", "heavy", "chat", "batch")
]


# -- the house ------------------------------------------------------------------------------------------
def scaled_policy(base: Policy, k: float, controller: dict[str, Any]) -> dict[str, Any]:
    """The admission sections of `base` with every duration divided by k (the prefill-rate prior
    multiplied; token budgets stay, as the engine's tokens/s are k times faster too)."""
    p = base.model_dump(mode="json")
    q, b, w, c = p["queue"], p["budgets"], p["window"], p["controller"]
    for cls in q["classes"].values():
        for key in ("ttft_p99_s", "tpot_p99_s", "completion_deadline_s", "max_wait_s"):
            if cls[key] is not None:
                cls[key] /= k
    q["classes"]["interactive"].update(ttft_p99_s=TTFT_SLO_S / k, tpot_p99_s=TPOT_SLO_S / k)
    q["initial_prefill_tokens_per_s"] *= k
    q["recheck_interval_s"] /= k
    if q["priorities"]["reserve_hold_s"] is not None:
        q["priorities"]["reserve_hold_s"] /= k
    b["round_s"] /= k
    b["stages"]["rtf_target"] /= k  # wall seconds per audio second: the audio is not compressed
    b["shield"]["hold_s"] /= k
    for acc in w["accumulate"].values():
        acc["max_wait_s"] /= k
    c["cooldown_s"] /= k
    p["fairness"]["share_window_s"] /= k
    c.update(controller)
    return {"version": 1, "queue": q, "budgets": b, "window": w, "controller": c, "fairness": p["fairness"]}


class House:
    """The simulated engines (started once) and one gateway at a time in front of them."""

    def __init__(
        self,
        procs: Procs,
        k: float,
        backends: int,
        policy: Policy,
        engine_args: list[str] | None = None,
        name: str = "sim",
    ) -> None:
        self.procs, self.k, self.policy = procs, k, policy
        self.engine_args = engine_args or []  # extra `loadtest.sim` flags for every engine
        self.sims = [self._sim(f"{name}{i}", i) for i in range(backends)]  # the interactive pool's
        self.offline_sims: list[str] = []  # the offline pool's, started by the first scenario needing it
        self.started: dict[str, float] = {}

    def _sim(self, name: str, seed: int) -> str:
        port = free_port()
        argv = [sys.executable, "-m", "loadtest.sim", "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--time-scale", repr(self.k), "--max-running-requests", "64"]
        argv += ["--enable-priority-scheduling", *self.engine_args]
        self.procs.start(name, [*argv, "--seed", str(seed)])
        wait_http(port, "/health", 60, self.procs, name)
        return f"http://127.0.0.1:{port}"

    def offline_pool(self, backends: int) -> list[str]:
        """The offline pool's engines, started once."""
        while len(self.offline_sims) < backends:
            n = len(self.offline_sims)
            self.offline_sims.append(self._sim(f"offline-sim{n}", 100 + n))
        return self.offline_sims[:backends]

    @property
    def engines(self) -> list[str]:
        return [*self.sims, *self.offline_sims]

    def gateway(self, name: str, controller: dict[str, Any], lend: dict[str, Any] | None = None) -> str:
        """A gateway whose interactive pool is `sims`; with `lend`, also an offline pool on `offline_sims`
        and the interactive pool's `budgets.pools.interactive.lend` set to it."""
        return self.start_gateway(name, self.gateway_config(name, controller, lend))

    def gateway_config(
        self,
        name: str,
        controller: dict[str, Any],
        lend: dict[str, Any] | None = None,
        store: dict[str, Any] | None = None,
        pools: list[dict[str, Any]] | None = None,
        placement: dict[str, Any] | None = None,
    ) -> Path:
        """The config file (and its policy) of `gateway`; `store` replaces the in-memory tenant store,
        `pools` the pool of `sims`, `placement` the policy's `budgets.placement`."""
        work = self.procs.workdir
        policy = scaled_policy(self.policy, self.k, controller)
        if placement is not None:
            policy["budgets"]["placement"] = placement
        if lend is not None:
            budgets = policy["budgets"]
            own = {key: value for key, value in budgets.items() if key != "pools"}
            budgets["pools"] = {"interactive": {**own, "lend": lend}}
        else:  # one pool: offline work runs on it (a policy may name no other: gateway/livepolicy/refs.py)
            policy["queue"]["classes"]["offline"]["pool"] = "interactive"
            policy["window"]["accumulate"].pop("offline")
        (work / f"{name}-policy.yaml").write_text(yaml.safe_dump(policy))
        pool = {"models": [MODEL], "priority_scheduling": True, "health_interval_s": 0.25}
        pools = pools or [{"name": "interactive", "backends": self.sims, **pool}]
        if lend is not None:
            pools.append({"name": "offline", "backends": self.offline_sims, **pool})
        config = {
            "listen": {"host": "127.0.0.1", "port": 0},
            "policy_path": str(work / f"{name}-policy.yaml"),
            "watch_policy": False,
            "admin": {"token": "bench"},
            "auth": {"required": True},
            "store": store or {"kind": "memory"},
            "access_log": False,
            "tenants": TENANTS,
            "pools": pools,
        }
        (work / f"{name}.yaml").write_bytes(orjson.dumps(config))
        return work / f"{name}.yaml"

    def start_gateway(self, name: str, config: Path) -> str:
        """`omnigate serve --config config` on a free port, once it is ready."""
        port = free_port()
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config), "--port", str(port)]
        self.procs.start(name, [*argv, "--log-level", "warning"])
        wait_http(port, "/readyz", 60, self.procs, name)
        self.started[name] = time.monotonic()
        return f"http://127.0.0.1:{port}"

    def stop(self, name: str, url: str) -> None:
        """Print the gateway's own view (rejections by reason, final limits, prefill duties and the
        refusals' wait factor) and its CPU share (near 100 % means the gateway, not admission, set the
        figures), then stop it."""
        pid = self.procs.procs[name].pid
        cpu = cpu_seconds(pid) / max(1e-9, time.monotonic() - self.started.pop(name))
        print(f"  {name}: gateway CPU {cpu:.0%} of one core", flush=True)
        try:
            pool = httpx.get(url + "/admin/state", headers={"authorization": "Bearer bench"}, timeout=5)
            snap = pool.json()["pools"]["interactive"]
            limits = [b["limit"] for b in snap["backends"]]
            duties = [b["prefill_duty"] for b in snap["backends"]]
            print(
                f"  {name}: rejections {snap['rejections']}, final limits {limits}, prefill duties {duties}, "
                f"refusal wait factor {snap['refusal_wait_factor']}",
                flush=True,
            )
            indexes = [b["prefix_index"] for b in snap["backends"] if b["prefix_index"]["requests"]]
            if indexes:
                shares = [(i["predicted_token_share"], i["engine_token_share"]) for i in indexes]
                print(
                    f"  {name}: prefix index, cached share predicted/engine per backend {shares}", flush=True
                )
            if any("budget" in st for b in snap["backends"] for st in b["stages"]):
                budgets = [{st["stage"]: st["budget"] for st in b["stages"]} for b in snap["backends"]]
                print(f"  {name}: final stage budgets {budgets}", flush=True)
            revoked = [
                line.rsplit(" ", 1)[1]
                for line in httpx.get(url + "/metrics", timeout=5).text.splitlines()
                if line.startswith('omnigate_loans_revoked_total{pool="offline"}')
            ]
            if revoked:
                print(f"  {name}: loans revoked {float(revoked[0]):.0f}", flush=True)
        except (httpx.HTTPError, KeyError, ValueError) as e:
            print(f"  {name}: no state ({e})", flush=True)
        proc = self.procs.procs.pop(name)
        proc.terminate()
        proc.wait(10)

    async def drained(self) -> None:
        """Wait (≤ 120 s) until every engine is idle, so no run inherits the last one's backlog."""
        async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                loads = [(await client.get(s + "/v1/loads")).json()["loads"][0] for s in self.engines]
                if all(ld["num_running_reqs"] + ld["num_waiting_reqs"] == 0 for ld in loads):
                    return
                await asyncio.sleep(0.2)
        raise RuntimeError("engines still busy after the drain timeout")

    async def generated_tokens(self) -> float:
        """Σ `sglang:generation_tokens_total` over the engines (their own count, cut streams included).
        An engine far past its capacity answers late: it is waited for, not given up on mid-run."""
        total = 0.0
        async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
            for s in self.engines:
                for line in (await client.get(s + "/metrics")).text.splitlines():
                    if line.startswith("sglang:generation_tokens_total"):
                        total += float(line.rsplit(" ", 1)[1])
        return total


class OmniHouse(House):
    """One simulated sglang-omni server (the `later` release: caps 64 / 32, text answers on the thinker
    only) and a gateway with it as its `kind: sglang-omni` pool, for the speech scenario."""

    def __init__(self, procs: Procs, k: float, policy: Policy) -> None:
        super().__init__(procs, k, 0, policy)
        port = free_port()
        argv = [sys.executable, "-m", "loadtest.sim", "--api", "sglang-omni", "--omni-release", "later"]
        argv += ["--host", "127.0.0.1", "--port", str(port), "--time-scale", repr(k), "--model", MODEL]
        procs.start("omni-sim", [*argv, "--seed", "11"])
        wait_http(port, "/health", 60, procs, "omni-sim")
        self.url = f"http://127.0.0.1:{port}"

    @property
    def engines(self) -> list[str]:
        return []  # no sglang:* metrics to scrape

    def omni_gateway(self, name: str) -> str:
        pool = {
            "name": "interactive",
            "kind": "sglang-omni",
            "sglang_omni": {"version": "later"},
            "models": [MODEL],
            "backends": [self.url],
            "health_interval_s": 0.25,
        }
        return self.start_gateway(name, self.gateway_config(name, {}, pools=[pool]))

    async def _accounting(self) -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
            doc: dict[str, Any] = (await client.get(self.url + "/sim/omni/accounting?limit=0")).json()
            return doc

    async def drained(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (await self._accounting())["tracked"] == 0:
                return
            await asyncio.sleep(0.2)
        raise RuntimeError("the omni server is still busy after the drain timeout")

    async def generated_tokens(self) -> float:
        """Thinker and talker tokens the server made (its own accounting)."""
        totals = (await self._accounting())["totals"]
        return float(totals["thinker_tokens"] + totals["talker_tokens"])


# -- load -----------------------------------------------------------------------------------------------
@dataclass
class Stream:
    """One open-loop stream of a run: a workload (rate, mix, key, priority, class) and its records."""

    label: str
    workload: Workload
    url: str | None = None  # its own target (a replica), else the run's
    headers_at: dict[int, dict[str, str]] = field(default_factory=dict)  # RunOptions.headers_at
    records: list[RequestRecord] | None = None
    result: dict[str, Any] | None = None


def workload(args: argparse.Namespace, label: str, **over: Any) -> Workload:
    base: dict[str, Any] = {
        "name": label,
        "model": MODEL,
        "duration": args.duration,
        "time_scale": args.time_scale,
        "warmup": {"duration": 0},
        "slo": {"ttft_ms": TTFT_SLO_S * 1000, "tpot_ms": TPOT_SLO_S * 1000},
        "drain": args.drain,
        "timeout": 600,
        "arrivals.shape": "constant",
        # the plain mix: seed.yaml's long-answer batch job (110 back-to-back 2 k-token answers, there to
        # exhaust KV at cap 128 in validate-seed) would turn a "light" tenant into a heavy one mid-run
        "buckets": {},
        # two variants per image size: the engine only sees dimensions, and a small set keeps the
        # harness' media prewarm (blocking, in the shared event loop) from delaying a parallel stream
        "images.single_image.variants": 2,
        "images.multi_image.variants": 2,
    }
    return load_workload(SEED_WORKLOAD, {**base, **over})


async def run(house: House, url: str, streams: list[Stream]) -> float:
    """Run every stream at once against `url`; returns the engines' generated tokens per simulated s."""
    for s in streams:  # render media now, so no stream's start blocks another's sends
        await asyncio.to_thread(RequestFactory(s.workload, MediaCache(None, s.workload.seed)).prewarm)
    before = await house.generated_tokens()
    window = asyncio.create_task(asyncio.sleep(max(s.workload.duration for s in streams) / house.k))

    async def one(s: Stream) -> None:
        opts = RunOptions(
            url=s.url or url,
            workload=s.workload,
            scrape_targets=house.engines,
            scrape_interval=0.25,
            headers_at=s.headers_at,
        )
        records, samples = await execute(opts)
        s.records, s.result = records, build_result(records, samples, opts)
        print(f"  {s.label}: failures {s.result['summary']['error_codes']}", flush=True)

    tasks = [asyncio.create_task(one(s)) for s in streams]
    await window
    tokens = await house.generated_tokens() - before
    await asyncio.gather(*tasks)
    await house.drained()
    return tokens / max(s.workload.duration for s in streams)


def measured(s: Stream) -> list[RequestRecord]:
    """The stream's records after its warm-up, in the simulated engine's time."""
    return [r.scaled(s.workload.time_scale) for r in s.records or [] if r.phase == "measured"]


def peak_half(s: Stream) -> tuple[list[RequestRecord], float]:
    """The requests sent in the top half of the sawtooth (offered rate ≥ the mid rate), and its seconds."""
    w = s.workload
    shape = w.arrivals.build(w.duration)
    mid = (w.arrivals.low + w.arrivals.high) / 2
    recs = measured(s)
    if not recs:
        return [], 0.0
    t0 = min(r.scheduled for r in recs)
    steps = [i / 10 for i in range(int(w.duration * 10))]
    peak_s = sum(0.1 for t in steps if shape.rate(t) >= mid)
    return [r for r in recs if shape.rate(r.scheduled - t0) >= mid], peak_s


def peak_goodput(s: Stream) -> float:
    """Requests per second sent in the sawtooth's top half that met the SLO."""
    recs, peak_s = peak_half(s)
    good = sum(1 for r in recs if meets_slo(r, s.workload.slo))
    return good / peak_s if peak_s else 0.0


def peak_by_bucket(s: Stream) -> str:
    """Of the requests sent in the sawtooth's top half, how many met the SLO, per modality bucket: which
    work a policy serves when it cannot serve all."""
    recs, _ = peak_half(s)
    sent = Counter(r.bucket for r in recs)
    good = Counter(r.bucket for r in recs if meets_slo(r, s.workload.slo))
    return " · ".join(f"{b} {good[b]}/{n}" for b, n in sorted(sent.items()))


# -- report ---------------------------------------------------------------------------------------------
def _p(summary: dict[str, Any], key: str, q: str) -> str:
    v = (summary.get(key) or {}).get(q)
    return "—" if v is None else f"{v:.0f}"


HEADER = (
    "| run | stream | sent | SLO att. | goodput r/s | peak goodput | TTFT p50/p99 ms | TPOT p50/p99 ms "
    "| rejected | errors | KV peak | send lag p99 ms |\n"
    "|---|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|"
)


def row(run_name: str, s: Stream) -> str:
    assert s.result is not None
    m = s.result["summary"]
    kv = (s.result["backend"].get("kv_usage") or {}).get("peak")
    lag = s.result["client"]["send_lag_ms"] or {}
    sawtooth = s.workload.arrivals.shape == "sawtooth"
    return (
        f"| {run_name} | {s.label} | {m['requests']} | {m['slo_attainment']:.1%} | {m['goodput']:.2f} "
        f"| {f'{peak_goodput(s):.2f}' if sawtooth else '—'} "
        f"| {_p(m, 'ttft_ms', 'p50')}/{_p(m, 'ttft_ms', 'p99')} "
        f"| {_p(m, 'tpot_ms', 'p50')}/{_p(m, 'tpot_ms', 'p99')} "
        f"| {m['rejection_rate']:.1%} | {m['error_rate']:.1%} | {'—' if kv is None else f'{kv:.0%}'} "
        f"| {lag.get('p99', 0):.0f} |"
    )


def where_ttft_goes(alone: Stream, shared: Stream) -> str:
    """Where the shared run's extra TTFT comes from. The two runs send the same requests at the same
    times (same seed), so each request is paired with itself: TTFT − gateway queue time is the engine's
    part (and the network's); beside − alone per pair, p50/p90/p99. Plus TTFT P99 per bucket."""

    def done(s: Stream) -> dict[float, RequestRecord]:
        return {round(r.scheduled, 6): r for r in measured(s) if r.ok}

    a, b = done(alone), done(shared)
    pairs = [(a[t], b[t]) for t in a.keys() & b.keys() if a[t].ttft is not None and b[t].ttft is not None]
    if not pairs:
        return "no request completed in both runs"

    def spread(values: list[float]) -> str:
        return "/".join(f"{percentile(values, q):.0f}" for q in (50, 90, 99))

    def queue(r: RequestRecord) -> float:
        return r.queue_ms or 0.0

    engine = [1000 * (y.ttft or 0.0) - queue(y) - (1000 * (x.ttft or 0.0) - queue(x)) for x, y in pairs]
    buckets = [
        f"{bucket} {_p(x, 'ttft_ms', 'p99')} → {_p(y, 'ttft_ms', 'p99')}"
        for bucket, x in ((alone.result or {})["breakdowns"].get("bucket") or {}).items()
        if (y := ((shared.result or {})["breakdowns"].get("bucket") or {}).get(bucket)) is not None
    ]
    return (
        f"{len(pairs)} requests paired, beside − alone p50/p90/p99 ms: gateway queue "
        f"{spread([queue(y) - queue(x) for x, y in pairs])}, engine (TTFT − queue) {spread(engine)}; "
        f"TTFT P99 alone → beside: {', '.join(buckets)}"
    )


def verdict(name: str, ok: bool, detail: str) -> str:
    return f"- {'PASS' if ok else 'MISS'} {name}: {detail}"


def ttfts_ms(s: Stream) -> list[float]:
    """TTFT of the stream's completed measured requests, simulated ms."""
    return [1000 * r.ttft for r in measured(s) if r.ok and r.ttft is not None]


def ttft_p99(s: Stream) -> float:
    return float(((s.result or {})["summary"].get("ttft_ms") or {}).get("p99", float("inf")))


def tpot_p99(s: Stream) -> float:
    return float(((s.result or {})["summary"].get("tpot_ms") or {}).get("p99", float("inf")))


# -- scenarios ------------------------------------------------------------------------------------------
def sawtooth(args: argparse.Namespace, cap: float, mix: dict[str, int]) -> dict[str, Any]:
    """Workload overrides: `mix`, Poisson on a sawtooth from 0.3× to 2× `cap` (two periods a run)."""
    return {
        "mix": mix,
        "arrivals": {
            "shape": "sawtooth",
            "process": "poisson",
            "low": 0.3 * cap,
            "high": 2.0 * cap,
            "period": args.duration / 2,
        },
        "warmup": {"duration": 5, "rate": 0.3 * cap},
        "api_key": "sk-chat",
    }


async def compare(house: House, args: argparse.Namespace, mix: str) -> list[str]:
    cap = MIX_CAPACITY[mix] * len(house.sims)
    over = sawtooth(args, cap, MIXES[mix])
    setups: list[tuple[str, dict[str, Any] | None]] = [("direct (cap 64)", None)]
    setups += [(f"fixed {n}", {"algorithm": "fixed", "initial": n, "min": n, "max": n}) for n in args.sweep]
    setups.append(("adaptive", {}))
    peaks: dict[str, list[float]] = {name: [] for name, _ in setups}
    tpots: dict[str, list[float]] = {name: [] for name, _ in setups}  # each run's TPOT P99, simulated ms
    served: list[str] = []  # per run, who met the SLO at the peak
    lines = [
        f"\n### compare — workload `{mix}` {MIXES[mix]}, sawtooth {0.3 * cap:.1f}→{2.0 * cap:.1f} req/s\n"
    ]
    lines.append(HEADER)
    for rep in range(args.repeats):  # the settings interleaved: a slow spell of the box hits them all
        for name, controller in setups:
            s = Stream(mix, workload(args, mix, **over))
            if controller is None:
                url = house.sims[0]
                if len(house.sims) > 1:
                    raise SystemExit("direct runs drive one engine: use --backends 1")
                await run(house, url, [s])
            else:
                gw_name = "gw-" + name.replace(" ", "-")
                gw = house.gateway(gw_name, controller)
                try:
                    await run(house, gw, [s])
                finally:
                    house.stop(gw_name, gw)
            peaks[name].append(peak_goodput(s))
            tpots[name].append(tpot_p99(s))
            run_name = name if args.repeats == 1 else f"{name} #{rep + 1}"
            lines.append(row(run_name, s))
            served.append(f"  {run_name}: {peak_by_bucket(s)}")
            print(lines[-1], flush=True)
    lines.append("\nIn SLO at the peak, of those sent, by modality bucket:")
    lines += served
    mean = {name: statistics.fmean(runs) for name, runs in peaks.items()}

    def spread(name: str) -> str:
        runs = peaks[name]
        return "" if len(runs) == 1 else f" [{min(runs):.2f}–{max(runs):.2f}]"

    direct, adaptive = mean["direct (cap 64)"], mean["adaptive"]
    best_name = max((n for n in mean if n.startswith("fixed")), key=mean.__getitem__)
    best = mean[best_name]
    of = "" if args.repeats == 1 else f" (means of {args.repeats} runs, [min–max])"
    lines.append("")
    lines.append(
        verdict(
            "adaptive ≥ 1.5× direct (peak goodput)",
            adaptive >= 1.5 * max(direct, 1e-9),
            f"{adaptive:.2f}{spread('adaptive')} vs {direct:.2f}{spread('direct (cap 64)')} r/s"
            + (f" = {adaptive / direct:.2f}×" if direct else "")
            + of,
        )
    )
    lines.append(
        verdict(
            f"adaptive within 5 % of best fixed ({best_name})",
            adaptive >= 0.95 * best,
            f"{adaptive:.2f}{spread('adaptive')} vs {best:.2f}{spread(best_name)} r/s = "
            f"{adaptive / max(best, 1e-9):.0%}{of}",
        )
    )
    slo_ms = TPOT_SLO_S * 1000
    lines.append(
        verdict(
            "adaptive TPOT P99 under the SLO (every run)",
            max(tpots["adaptive"]) < slo_ms,
            " / ".join(f"{t:.1f}" for t in tpots["adaptive"]) + f" ms vs {slo_ms:.0f} ms",
        )
    )
    lines.append(f"  TPOT P99 of each setting's runs (ms): {_tpot_ranges(tpots)}")
    held = [n for n in mean if n.startswith("fixed") and max(tpots[n]) < slo_ms]
    if held and best_name not in held:  # context for the verdict above, not a verdict of its own
        top = max(held, key=mean.__getitem__)
        lines.append(
            f"  the best fixed limit under the TPOT SLO in every run: {top} {mean[top]:.2f} r/s; "
            f"adaptive = {adaptive / max(mean[top], 1e-9):.0%} of it"
        )
    return lines


def _tpot_ranges(tpots: dict[str, list[float]]) -> str:
    return ", ".join(
        f"{name} {min(runs):.0f}" + ("" if len(runs) == 1 else f"–{max(runs):.0f}")
        for name, runs in tpots.items()
    )


async def gateway_run(
    house: House, name: str, streams: list[Stream], lend: dict[str, Any] | None = None
) -> float:
    gw = house.gateway(name, {}, lend)
    try:
        return await run(house, gw, streams)
    finally:
        house.stop(name, gw)


async def flood(house: House, args: argparse.Namespace) -> list[str]:
    cap = args.capacity * len(house.sims)
    longer = {"duration": args.flood_duration}  # P99 over ~370 high-priority requests, not their maximum
    hi = Stream(
        "high priority",
        workload(
            args, "hi", api_key="sk-hi", priorities=[{"value": 10}], **{"arrivals.rate": 0.3 * cap, **longer}
        ),
    )
    lo = Stream(
        "low flood 3×",
        workload(
            args,
            "lo",
            api_key="sk-lo",
            priorities=[{"value": 0}],
            seed=43,
            **{"arrivals.rate": 3 * cap, **longer},
        ),
    )
    await gateway_run(house, "gw-flood", [hi, lo])
    out = ["\n### flood — low priority at 3× capacity beside a high-priority stream\n", HEADER]
    out += [row("adaptive", hi), row("adaptive", lo), ""]
    out.append(
        verdict(
            "high-priority TTFT P99 within its SLO",
            ttft_p99(hi) <= TTFT_SLO_S * 1000,
            f"{ttft_p99(hi):.0f} ms vs {TTFT_SLO_S * 1000:.0f} ms",
        )
    )
    return out


async def tenants(house: House, args: argparse.Namespace) -> list[str]:
    """Per seed in `--tenants-seeds`: the light tenant alone, then beside the heavy one; the verdict
    is on the P99 of all seeds' light requests together (one run's P99 swings ±30 % with the timing of a
    handful of requests; pooled, the P99 rests on ~10 of ~900)."""
    cap = args.capacity * len(house.sims)
    rate = 0.25 * cap
    longer = {"duration": args.tenants_duration}  # P99 over ≥ 300 light requests, not their maximum
    out = ["\n### tenants — a light tenant alone, then beside one sending 10× its rate\n", HEADER]
    ratios: list[float] = []
    notes: list[str] = []
    pooled_alone: list[float] = []
    pooled_shared: list[float] = []
    for seed in args.tenants_seeds:

        def light(seed: int = seed) -> Stream:
            over = {"arrivals.rate": rate, **longer}
            return Stream("light", workload(args, "light", api_key="sk-light", seed=seed, **over))

        alone = light()
        await gateway_run(house, "gw-light", [alone])
        shared = light()
        over = {"arrivals.rate": 10 * rate, **longer}
        heavy = Stream("heavy 10×", workload(args, "heavy", api_key="sk-heavy", seed=seed + 2, **over))
        await gateway_run(house, "gw-tenants", [shared, heavy])
        ratios.append(ttft_p99(shared) / max(ttft_p99(alone), 1e-9))
        pooled_alone += ttfts_ms(alone)
        pooled_shared += ttfts_ms(shared)
        label = f"seed {seed}: "
        out += [
            row(label + "alone", alone),
            row(label + "beside heavy", shared),
            row(label + "beside", heavy),
        ]
        notes.append(f"- seed {seed}, light {where_ttft_goes(alone, shared)}")
    alone_p99, shared_p99 = percentile(pooled_alone, 99), percentile(pooled_shared, 99)
    ratio = shared_p99 / max(alone_p99, 1e-9)
    out += ["", *notes, ""]
    out.append(
        verdict(
            "light TTFT P99 ≤ 1.2× its value alone (P99 over every seed's requests)",
            ratio <= 1.2,
            f"{shared_p99:.0f} / {alone_p99:.0f} ms = {ratio:.2f}× over {len(pooled_shared)} requests "
            f"(per seed: {', '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f})",
        )
    )
    return out


async def mixed(house: House, args: argparse.Namespace) -> list[str]:
    title = "mixed — interactive (high priority) beside an offline flood, one pool"
    return await beside_offline(house, args, "mixed", title, lend=None)


async def lending(house: House, args: argparse.Namespace) -> list[str]:
    """The issue's layout: an offline pool of its own (as many engines as the interactive pool) whose
    whole requests borrow the interactive engines below `--lend-max-load` and give them back as soon as
    an interactive request waits (loans revoked). The capacity is measured with lending at any load
    (`max_load` 1.0): every engine of the house."""
    house.offline_pool(len(house.sims))
    title = (
        "lending — separate pools; offline borrows the interactive engines below load "
        f"{args.lend_max_load:g} and gives them back"
    )
    lend = {"enabled": True, "max_load": args.lend_max_load}
    return await beside_offline(house, args, "lending", title, lend=lend)


async def beside_offline(
    house: House, args: argparse.Namespace, name: str, title: str, lend: dict[str, Any] | None
) -> list[str]:
    """An offline flood alone (its engine tokens/s = the capacity), then with an interactive stream:
    interactive attainment, and how much of what interactive leaves the offline flood uses. With `lend`,
    offline has its own pool and sends whole answers (only those borrow); alone it borrows at any load."""
    cap = args.capacity * len(house.sims)
    engines = len(house.sims) + (len(house.offline_sims) if lend is not None else 0)

    def batch() -> Stream:
        return Stream(
            "offline flood" + (" (whole answers)" if lend is not None else ""),
            workload(
                args,
                "batch",
                api_key="sk-batch",
                seed=45,
                classes=[{"name": "offline"}],
                priorities=[{"value": 0}],
                stream=lend is None,
                **{"arrivals.rate": 2 * args.capacity * engines, "slo": {}},
            ),
        )

    alone = batch()
    full = None if lend is None else {**lend, "max_load": 1.0}
    capacity = await gateway_run(house, f"gw-{name}-offline", [alone], full)
    chat = Stream(
        "interactive",
        workload(
            args,
            "chat",
            api_key="sk-chat",
            # one pool: the top band is what protects interactive; separate pools: the pools do (and
            # loans given back), so interactive keeps the default priority and no band reserve is held
            priorities=[{"value": 10 if lend is None else 5}],
            classes=[{"name": "interactive"}],
            # long enough for its longest answers (4096 tokens at ~40 ms) to finish: cut off by the
            # drain they would count as failures of the gateway, which sent them on time
            drain=300,
            **{"arrivals.rate": 0.4 * cap},
        ),
    )
    shared = batch()
    total = await gateway_run(house, f"gw-{name}", [chat, shared], lend)
    chat_rate = summarize(measured(chat), chat.workload.slo)["output_throughput"]
    left = capacity - chat_rate
    used = (total - chat_rate) / left if left > 0 else 0.0
    att = (chat.result or {})["summary"]["slo_attainment"]
    out = [f"\n### {title}\n", HEADER]
    out += [row("offline alone", alone), row(name, chat), row(name, shared), ""]
    out.append(
        f"engine tokens/s: offline alone {capacity:.0f}, {name} total {total:.0f}, "
        f"interactive {chat_rate:.0f}"
    )
    out.append(verdict("interactive SLO attainment ≥ 99 %", att >= 0.99, f"{att:.1%}"))
    out.append(
        verdict(
            "offline uses ≥ 80 % of the capacity left over",
            used >= 0.8,
            f"{total - chat_rate:.0f} of {left:.0f} tokens/s = {used:.0%}",
        )
    )
    return out


SPEECH_MIX = {"text": 4, "audio_out": 3, "speech": 3}
# Requests/s of the speech mix the simulated `later` server keeps in real time (--speech-capacity): its
# talker makes one frame (80 ms of audio) for each of B streams per 8 + 4·B ms, so a stream plays at
# RTF 0.1 + 0.05·B and real time ends at B = 18; a speaking answer is ~17 s of audio; by Little's law
# 18 = 0.6·λ·17 s·RTF(18) gives λ ≈ 1.8 (60 % of the mix speaks; text runs on the thinker alone).
SPEECH_CAPACITY_RPS = 1.8
TTFA_SLO_S, RTF_SLO = 2.0, 1.0


def speech_row(name: str, s: Stream) -> str:
    """Goodput (whole run and sawtooth peak), text TTFT P99, speech TTFA / RTF P99, stalled streams."""
    recs, slo = measured(s), s.workload.slo
    by_bucket = {b: summarize([r for r in recs if r.bucket == b], slo) for b in SPEECH_MIX}
    spoken = summarize([r for r in recs if r.bucket != "text"], slo)
    whole = summarize(recs, slo)

    def ms(summary: dict[str, Any], key: str) -> str:
        v = (summary.get(key) or {}).get("p99")
        return "—" if v is None else f"{v:.0f}"

    rtf = (spoken.get("rtf") or {}).get("p99")
    stalled = spoken.get("stalled_rate")
    return (
        f"| {name} | {whole['goodput']:.2f} | {peak_goodput(s):.2f} | {ms(by_bucket['text'], 'ttft_ms')} | "
        f"{ms(by_bucket['audio_out'], 'ttfa_ms')} | {ms(by_bucket['speech'], 'ttfa_ms')} | "
        f"{'—' if rtf is None else f'{rtf:.2f}'} | {'—' if stalled is None else f'{stalled:.0%}'} | "
        f"{spoken.get('audio_seconds_per_s', 0.0):.1f} | {whole['rejection_rate']:.0%} |"
    )


async def speech(procs: Procs, args: argparse.Namespace, base: Policy) -> list[str]:
    """Text chat, chat with audio out and /v1/audio/speech together on one simulated sglang-omni server,
    sawtooth from 0.3× to 2× its capacity: clients going direct vs through omnigate (staged budgets)."""
    house = OmniHouse(procs, args.time_scale, base)
    cap = args.speech_capacity
    slo = {"ttft_ms": TTFT_SLO_S * 1000, "ttfa_ms": TTFA_SLO_S * 1000, "rtf": RTF_SLO}
    over = {
        **sawtooth(args, cap, SPEECH_MIX),
        "slo": slo,
        # a voice assistant's turns: short prompts, spoken answers of ~60 tokens (~18 s of speech)
        "prompt_tokens": {"dist": "lognormal", "median": 40, "sigma": 0.5, "min": 8, "max": 200},
        "output_tokens": {"dist": "lognormal", "median": 60, "sigma": 0.5, "min": 8, "max": 300},
    }
    lines = [
        f"\n### speech — {SPEECH_MIX} on one sglang-omni server (later), sawtooth {0.3 * cap:.1f}→"
        f"{2.0 * cap:.1f} req/s; SLO TTFT ≤ {TTFT_SLO_S:g} s, TTFA ≤ {TTFA_SLO_S:g} s, RTF ≤ {RTF_SLO:g}\n",
        "| run | goodput r/s | peak goodput r/s | text TTFT P99 ms | audio-out TTFA P99 ms "
        "| speech TTFA P99 ms | RTF P99 | stalled streams | audio s/s | rejected |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    direct = Stream("direct", workload(args, "speech", **over))
    await run(house, house.url, [direct])
    lines.append(speech_row("direct", direct))
    print(lines[-1], flush=True)
    gw = house.omni_gateway("gw-speech")
    through = Stream("omnigate", workload(args, "speech", **over))
    try:
        await run(house, gw, [through])
    finally:
        house.stop("gw-speech", gw)
    lines.append(speech_row("omnigate", through))
    print(lines[-1], flush=True)
    spoken = summarize([r for r in measured(through) if r.bucket != "text"], through.workload.slo)
    text = summarize([r for r in measured(through) if r.bucket == "text"], through.workload.slo)
    rtf = (spoken.get("rtf") or {}).get("p99")
    ttft = (text.get("ttft_ms") or {}).get("p99")
    gain = peak_goodput(through) / max(peak_goodput(direct), 1e-9)
    lines.append("")
    lines.append(verdict("omnigate speech RTF P99 < 1", rtf is not None and rtf < RTF_SLO, f"{rtf}"))
    lines.append(
        verdict(
            "omnigate text TTFT P99 within SLO", ttft is not None and ttft <= TTFT_SLO_S * 1000, f"{ttft} ms"
        )
    )
    lines.append(verdict("peak goodput ≥ 1.5× direct", gain >= 1.5, f"{gain:.2f}×"))
    return lines


PLACEMENTS = ("least_tokens", "cache_aware", "first_token")
TURN_SLO = Slo(ttft_ms=TTFT_SLO_S * 1000, tpot_ms=TPOT_SLO_S * 1000)
MULTITURN_HEADER = (
    "| conv/s | placement | turns sent | SLO att. | goodput r/s | TTFT p50/p99 ms | TPOT p99 ms | rejected "
    "| engine prefill tok/req | cached share |\n|---:|---|---:|---:|---:|---|---:|---:|---:|---:|"
)


@dataclass(frozen=True)
class TurnsRun:
    """One placement rule's run of the multiturn scenario."""

    placement: str
    rate: float  # new conversations per simulated s
    records: list[RequestRecord]  # in simulated time
    duration: float

    @property
    def slo(self) -> Any:
        return Workload.model_validate(
            {"slo": {"ttft_ms": TTFT_SLO_S * 1000, "tpot_ms": TPOT_SLO_S * 1000}}
        ).slo

    @property
    def attainment(self) -> float:
        return (
            sum(1 for r in self.records if meets_slo(r, TURN_SLO)) / len(self.records)
            if self.records
            else 0.0
        )

    @property
    def goodput(self) -> float:
        """Turns that met the SLO per simulated second of arrivals."""
        return sum(1 for r in self.records if meets_slo(r, TURN_SLO)) / self.duration

    def row(self) -> str:
        m = summarize(self.records, TURN_SLO, self.duration)
        answered = [r for r in self.records if r.ok and r.cached_tokens is not None]
        prompt = sum(r.prompt_tokens for r in answered)
        cached = sum(r.cached_tokens or 0 for r in answered)
        prefill = (prompt - cached) / len(answered) if answered else 0.0
        return (
            f"| {self.rate:.2f} | {self.placement} | {m['requests']} | {self.attainment:.1%} "
            f"| {self.goodput:.2f} | {_p(m, 'ttft_ms', 'p50')}/{_p(m, 'ttft_ms', 'p99')} "
            f"| {_p(m, 'tpot_ms', 'p99')} "
            f"| {m['rejection_rate']:.1%} | {prefill:.0f} | {cached / prompt if prompt else 0.0:.0%} |"
        )


async def multiturn_run(
    procs: Procs, args: argparse.Namespace, base: Policy, placement: str, rate: float
) -> TurnsRun:
    """One placement rule on fresh engines (radix cache and cache report on): no rule inherits another's
    cache, and every rule at a rate gets the same conversations."""
    k, backends = args.multiturn_time_scale, args.multiturn_backends
    conversations = plan(42, rate, args.duration, args.think_time, args.multiturn_max_tokens)
    engines = ["--radix-cache", "--enable-cache-report"]
    house = House(procs, k, backends, base, engines, name=f"mt-{placement}-")
    name = f"gw-mt-{placement}"
    gw = house.start_gateway(name, house.gateway_config(name, {}, placement={"policy": placement}))
    try:
        records = await drive(gw, MODEL, conversations, k, "sk-chat", timeout_s=600 / k)
    finally:
        house.stop(name, gw)
        for sim in [n for n in procs.procs if n.startswith(f"mt-{placement}-")]:
            proc = procs.procs.pop(sim)
            proc.terminate()
            proc.wait(10)
    run = TurnsRun(placement, rate, [r.scaled(k) for r in records], args.duration)
    print(run.row(), flush=True)
    return run


async def multiturn(procs: Procs, args: argparse.Namespace, base: Policy) -> list[str]:
    """Every placement rule at every rate of `--conversation-rates` (per engine); the verdict compares each
    rule's best goodput at which it still met the SLO for `--multiturn-attainment` of the turns."""
    backends, target = args.multiturn_backends, args.multiturn_attainment
    runs = [
        await multiturn_run(procs, args, base, placement, per_engine * backends)
        for per_engine in args.conversation_rates
        for placement in PLACEMENTS
    ]
    out = [
        f"\n### multiturn — conversations of 3–10 turns for {args.duration:g} s on {backends} engines, think "
        f"time {args.think_time:g} s, time scale {args.multiturn_time_scale:g}\n",
        MULTITURN_HEADER,
        *(run.row() for run in runs),
        "",
    ]
    best = {
        p: max((r.goodput for r in runs if r.placement == p and r.attainment >= target), default=0.0)
        for p in PLACEMENTS
    }
    out.append(
        f"best goodput at ≥ {target:.0%} SLO attainment: "
        + ", ".join(f"{p} {g:.2f}" for p, g in best.items())
    )
    gain = best["first_token"] / best["least_tokens"] if best["least_tokens"] else float("inf")
    out.append(
        verdict(
            f"first_token goodput ≥ 1.3× least_tokens at ≥ {target:.0%} attainment",
            gain >= 1.3,
            f"{gain:.2f}×",
        )
    )
    return out


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="omnigate-sched-") as tmp:
        procs = Procs(Path(tmp))
        try:
            policy = load_policy(args.policy)
            if args.no_bucket_caps:
                policy = policy.model_copy(
                    update={"budgets": policy.budgets.model_copy(update={"bucket_caps": {}})}
                )
            chunk = args.chunked_prefill_size
            engine_args = [] if chunk is None else ["--chunked-prefill-size", str(chunk)]
            house: House | None = None
            report: list[str] = []
            started = time.monotonic()
            for scenario in args.scenarios:
                if scenario == "speech":  # its own simulated server: no plain engines needed
                    report += await speech(procs, args, policy)
                    continue
                if scenario == "multiturn":  # engines of its own, restarted per placement rule
                    report += await multiturn(procs, args, policy)
                    continue
                if house is None:
                    house = House(procs, args.time_scale, args.backends, policy, engine_args)
                if scenario == "compare":
                    for mix in args.workloads:
                        report += await compare(house, args, mix)
                else:
                    scenarios = {"flood": flood, "tenants": tenants, "mixed": mixed, "lending": lending}
                    report += await scenarios[scenario](house, args)
            print("\n".join(report))
            print(
                f"\nwall time {time.monotonic() - started:.0f} s, time scale {args.time_scale:g}, "
                f"{args.duration:g} simulated s per run, {len(house.sims) if house else 0} engine(s)"
            )
        finally:
            procs.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--scenarios", type=comma_list(str), default=["compare", "flood", "tenants", "mixed", "lending"]
    )
    ap.add_argument(
        "--workloads", type=comma_list(str), default=["seed", "text", "multi"], help="of: " + ",".join(MIXES)
    )
    ap.add_argument("--sweep", type=comma_list(int), default=[16, 32, 48], help="fixed concurrency limits")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="compare: run every setting this many times (interleaved) and judge on the means; one run's "
        "peak goodput spreads ±6 %%, as much as the 5 %% target",
    )
    ap.add_argument("--duration", type=float, default=60.0, help="simulated seconds per run")
    ap.add_argument(
        "--flood-duration",
        type=float,
        default=240.0,
        help="simulated seconds of the flood scenario's run (its P99 needs a few hundred requests)",
    )
    ap.add_argument(
        "--tenants-duration",
        type=float,
        default=240.0,
        help="simulated seconds of the tenants scenario's runs (its P99 needs a few hundred requests)",
    )
    ap.add_argument(
        "--tenants-seeds",
        type=comma_list(int),
        default=[42, 7, 99],
        help="workload seeds of the tenants scenario (the heavy tenant uses seed + 2); verdict on the P99 "
        "of all their light requests together",
    )
    ap.add_argument(
        "--drain", type=float, default=20.0, help="simulated seconds to finish after the last send"
    )
    ap.add_argument("--time-scale", type=float, default=6.0)
    ap.add_argument("--backends", type=int, default=1)
    ap.add_argument(
        "--policy", type=Path, default=ROOT / "policies" / "default.yaml", help="policy to time-scale"
    )
    ap.add_argument(
        "--lend-max-load",
        type=float,
        default=0.5,
        help="the lending scenario's lend.max_load (the policy default 0.5): loans start only below it",
    )
    ap.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=None,
        help="the engines' chunked prefill size (the sim's default: 8192, SGLang's on an A100-80G)",
    )
    ap.add_argument(
        "--no-bucket-caps",
        action="store_true",
        help="drop the policy's per-backend modality bucket caps (then the concurrency limit alone bounds "
        "multi-image decodes: what the fixed-limit sweep is about)",
    )
    ap.add_argument(
        "--capacity", type=float, default=CAPACITY_RPS, help="req/s one engine serves (sizes rates)"
    )
    ap.add_argument(
        "--speech-capacity",
        type=float,
        default=SPEECH_CAPACITY_RPS,
        help="req/s of the speech mix one sglang-omni server serves (sizes the speech sawtooth)",
    )
    ap.add_argument(
        "--mix",
        type=lambda text: {k: int(v) for k, v in (part.split("=") for part in text.split(","))},
        help="compare: one more workload, a mix of your own (e.g. text=2,single_image=6,multi_image=2), run "
        "after --workloads as `custom`: a check on a mix nothing was tuned on",
    )
    ap.add_argument(
        "--mix-capacity", type=float, default=CAPACITY_RPS, help="req/s one engine serves of --mix"
    )
    ap.add_argument("--multiturn-backends", type=int, default=3, help="multiturn: engines in the pool")
    ap.add_argument(
        "--conversation-rates",
        type=comma_list(float),
        default=[1.0, 1.5, 2.0],
        help="multiturn: new conversations/s per engine, one run of every placement rule at each",
    )
    ap.add_argument(
        "--multiturn-attainment",
        type=float,
        default=0.95,
        help="multiturn: the SLO attainment a rule must hold for its goodput to count in the verdict",
    )
    ap.add_argument("--think-time", type=float, default=3.0, help="multiturn: mean think time, simulated s")
    ap.add_argument("--multiturn-max-tokens", type=int, default=64, help="multiturn: median answer cap")
    ap.add_argument(
        "--multiturn-time-scale",
        type=float,
        default=2.0,
        help="multiturn: its own time scale (several engines and streamed answers on one box)",
    )
    args = ap.parse_args()
    if args.mix:
        MIXES["custom"], MIX_CAPACITY["custom"] = args.mix, args.mix_capacity
        args.workloads.append("custom")
    unknown = set(args.workloads) - set(MIXES)
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
