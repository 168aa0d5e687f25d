"""Replay a load-test workload file straight into the engine model: no HTTP, no wall clock.

The same requests the harness would send (its seeded RequestFactory and arrival schedule, warm-up
first), counted by the simulator's own PromptCounter, with output lengths drawn as the server's
Generator draws them, run on one Engine in virtual time. Each request becomes the harness's
RequestRecord, so the harness's own metric definitions, knee, recommendation and validate-seed checks
apply unchanged. A calibration aid: a 6-point sweep takes seconds instead of minutes.

Differences from a real run: arrivals reach the engine exactly at their scheduled time (no client lag,
no HTTP), queue time is exact per request rather than read from the engine's histogram, and backend
gauges are sampled after every step instead of every half second (so peaks are at least as high).
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.arrivals import constant_shape, schedule
from loadtest.knee import dig
from loadtest.media import MediaCache
from loadtest.metrics import error_bursts, summarize
from loadtest.records import RequestRecord
from loadtest.scrape import histogram_ms
from loadtest.seed_table import COLUMNS, VALUES, oom
from loadtest.sim.config import SimConfig
from loadtest.sim.engine import Engine, EngineConfig, EngineError, SimRequest
from loadtest.sim.memory import GIB, MemoryModel
from loadtest.sim.metrics import QUEUE_BUCKETS, TTFT_BUCKETS
from loadtest.sim.profile import PrefillChunk, Profile
from loadtest.sim.tokens import PromptCounter
from loadtest.sweep import analyse, set_dotted
from loadtest.workload import RequestFactory, Workload

PARAM = "max-running-requests"
HEADROOM = 0.1  # the recommendation's SLO margin: P99 ≤ 0.9 × SLO


@dataclass(slots=True)
class Arrival:
    t: float
    phase: str
    req: SimRequest
    bucket: str


@dataclass(slots=True)
class Gauges:
    kv_peak: float = 0.0
    memory_peak: int = 0  # bytes in use (memory.py), 0 without a memory model
    running_peak: int = 0
    queued_peak: int = 0
    retracted: int = 0
    preempted: int = 0
    crashes: int = 0
    queue_s: list[float] = field(default_factory=list)  # engine-side, observed in the measured window
    ttft_s: list[float] = field(default_factory=list)


def arrivals(w: Workload, profile: Profile, media: MediaCache | None = None) -> list[Arrival]:
    """Warm-up then measured sends, with the requests the harness would build for them, in send order."""
    factory = RequestFactory(w, media or MediaCache(None, w.seed))
    counter = PromptCounter(profile)
    out_rng = random.Random(w.seed)  # the sim server's Generator is seeded with --seed = workload seed
    warm = schedule(
        constant_shape(w.warmup.rate), duration=w.warmup.duration, count=w.warmup.count, seed=w.seed + 1
    )
    shape = w.arrivals.build(w.duration)
    measured = schedule(
        shape, duration=w.duration, count=w.count, process=w.arrivals.process,
        burstiness=w.arrivals.burstiness, seed=w.seed,
    )  # fmt: skip
    start = w.warmup.duration if warm or w.warmup.duration > 0 else 0.0
    timed = [(t, "warmup") for t in warm] + [(start + t, "measured") for t in measured]
    out = []
    for i, (t, phase) in enumerate(timed):
        prepared = factory.next()
        prompt = counter.chat(prepared.body["messages"])
        max_new = int(prepared.body["max_tokens"])
        o = profile.output
        if prepared.body.get("ignore_eos"):
            out_len = max_new  # as the server's Generator: no natural stop, no draw
        else:
            natural = round(out_rng.lognormvariate(math.log(o.median_tokens), o.sigma))
            out_len = min(max_new, max(o.min_tokens, natural))
        priority = prepared.body.get("priority")
        req = SimRequest(
            f"r{i}", prompt.total, max_new, out_len, encoder_tokens=prompt.encoder_tokens,
            priority=priority if isinstance(priority, int) else None, arrival=t,
        )  # fmt: skip
        out.append(Arrival(t, phase, req, prepared.bucket))
    return out


def run(
    engine: Engine,
    sends: list[Arrival],
    end: float,
    max_in_flight: int | None = None,
    load_end: float | None = None,
) -> tuple[list[RequestRecord], Gauges]:
    """Feed the sends, step until `end` (the harness's drain deadline); measured records and gauges.

    With `max_in_flight` the client holds arrivals in FIFO order while that many are at the engine and
    releases one whenever one finishes (the harness's outer in-flight cap, RunOptions.max_in_flight),
    until `load_end` (the measured window's end): what it still holds then is shed, as the runner does.
    """
    stop = end if load_end is None else load_end
    g = Gauges()
    rejected: set[str] = set()
    released: dict[str, float] = {}
    measured_start = min((a.t for a in sends if a.phase == "measured"), default=0.0)
    total = engine.config.max_total_tokens
    cap = max_in_flight if max_in_flight is not None else len(sends) + 1
    slot_free = deque([0.0] * cap)  # when each free slot of the outer cap became free, oldest first
    held: deque[Arrival] = deque()
    nxt = 0
    while engine.now < end and (nxt < len(sends) or held or engine.has_work()):
        while nxt < len(sends) and sends[nxt].t <= engine.now:
            held.append(sends[nxt])
            nxt += 1
        while held and slot_free and engine.now < stop:
            a = held.popleft()
            a.req.arrival = max(a.t, slot_free.popleft())
            released[a.req.rid] = a.req.arrival
            try:
                evicted = engine.submit(a.req)
            except EngineError:
                rejected.add(a.req.rid)
                slot_free.append(a.req.arrival)
                continue
            if evicted is not None:
                slot_free.append(a.req.arrival)
        res = engine.step()
        if res is None:
            if nxt < len(sends):
                engine.advance_to(sends[nxt].t)
            elif engine.crashed_until is not None:
                engine.advance_to(engine.crashed_until)
            else:
                break
            continue
        slot_free.extend(res.end for _ in (*res.finished, *res.failed))
        for r in res.emitted:
            if len(r.token_times) == 1 and res.end >= measured_start:  # as SimMetrics observes them
                g.ttft_s.append(r.token_times[0] - r.arrival)
                if r.admitted_at is not None:
                    g.queue_s.append(r.admitted_at - r.arrival)
        if res.start >= measured_start:
            g.kv_peak = max(g.kv_peak, res.kv_tokens / total)
            g.memory_peak = max(g.memory_peak, engine.memory_in_use)
            g.preempted += len(res.preempted)
            g.running_peak = max(g.running_peak, engine.num_running)
            g.queued_peak = max(g.queued_peak, len(engine.waiting))
            g.retracted += len(res.retracted)
            g.crashes += res.kind == "crash"
    records = [
        _record(a, a.req.rid in rejected, released.get(a.req.rid), end, min(stop, end))
        for a in sends
        if a.phase == "measured"
    ]
    return records, g


def _record(a: Arrival, rejected: bool, sent: float | None, end: float, shed_at: float) -> RequestRecord:
    r = a.req
    if sent is None:  # still held by the outer cap when it stopped releasing
        shed_at = max(shed_at, a.t)
        rec = RequestRecord(bucket=a.bucket, scheduled=a.t, sent=shed_at, outer_wait=shed_at - a.t, e2e=0.0)
        rec.status, rec.error = 408, "outer_queue_timeout"
        return rec
    rec = RequestRecord(bucket=a.bucket, scheduled=a.t, sent=sent, outer_wait=sent - a.t)
    rec.prompt_tokens = r.prompt_tokens
    if rejected:
        rec.status, rec.error, rec.e2e = 503, "http_503", 0.0
        return rec
    rec.status = 200 if r.error is None else r.error.status
    rec.chunk_times = [t - sent for t in r.token_times]
    rec.ttft = rec.chunk_times[0] if rec.chunk_times else None
    if r.error is not None:
        rec.error = f"http_{r.error.status}"
        rec.e2e = (r.finished_at or end) - sent
    elif r.finished_at is None:
        rec.error = "unfinished"  # still running when the drain window closed
        rec.e2e = end - sent
    else:
        rec.e2e = r.finished_at - sent
        rec.output_tokens = r.generated
    return rec


def histogram(values: list[float], bounds: Sequence[float]) -> dict[float, float]:
    """Cumulative bucket counts {upper bound: count} as the engine's Prometheus histogram would hold them."""
    per = [0] * (len(bounds) + 1)
    for v in values:
        per[bisect.bisect_left(bounds, v)] += 1
    out, acc = {}, 0
    for b, n in zip([*bounds, math.inf], per, strict=True):
        acc += n
        out[float(b)] = float(acc)
    return out


def point(
    w: Workload,
    profile: Profile,
    config: EngineConfig,
    sends: list[Arrival],
    max_in_flight: int | None = None,
    memory: MemoryModel | None = None,
) -> dict[str, Any]:
    """One sweep point as a run document with the fields validate-seed and the recommendation read.

    Engine-side TTFT and queue quantiles go through the sim's own histogram buckets, as a scrape sees them.
    """
    for a in sends:  # fresh engine state on the shared request list
        r = a.req
        r.generated = r.kv = r.retractions = r.preemptions = 0
        r.admitted_at = r.finished_at = r.finish_reason = r.error = None
        r.token_times = []
        r.arrival = a.t
    engine = Engine(config, profile.costs, memory=memory)
    drain = w.drain if w.drain is not None else w.timeout
    load_end = w.warmup.duration + w.duration if w.count is None else None  # as the runner
    end = w.warmup.duration + w.duration + drain
    records, g = run(engine, sends, end, max_in_flight, load_end)
    summary = summarize(records, w.slo)
    bursts = error_bursts(records)
    return {
        "kind": "run",
        "summary": summary,
        "backend": {
            "kv_usage": {"peak": g.kv_peak},
            "memory_bytes": {"peak": float(g.memory_peak)} if memory is not None else None,
            "preempted": g.preempted,
            "running": {"peak": g.running_peak},
            "queued": {"peak": g.queued_peak},
            "retractions": g.retracted,
            "engine_queue_ms": histogram_ms(histogram(g.queue_s, QUEUE_BUCKETS)),
            "engine_ttft_ms": histogram_ms(histogram(g.ttft_s, TTFT_BUCKETS)),
        },
        "oom": {"crashes": g.crashes, "error_bursts": bursts, "detected": g.crashes > 0 or bursts > 0},
    }


def sweep(
    w: Workload,
    profile: Profile,
    caps: list[str],
    config: SimConfig,
    sends: list[Arrival] | None = None,
    open_loop: bool = False,
) -> dict[str, Any]:
    """validate-seed's sweep of --max-running-requests, replayed: one point per cap, each behind the
    outer in-flight cap = the cap (`open_loop` drops it), analysed as the HTTP sweep is."""
    sends = arrivals(w, profile) if sends is None else sends
    points = []
    for cap in caps:
        engine_config, memory = config.model_copy(update={"max_running_requests": int(cap)}).build(profile)
        points.append(point(w, profile, engine_config, sends, None if open_loop else int(cap), memory))
    return analyse(PARAM, caps, points, w.slo.model_dump(), headroom=HEADROOM)


def physics(profile: Profile, cap: int = max(VALUES)) -> dict[str, float]:
    """The profile's figures the explanations quote: a 2–4-image prompt's prefill, a small batch's decode
    step, the static memory, the KV cell, the pool, the card and what stays outside the pool."""
    _, m = SimConfig(max_running_requests=cap).build(profile)
    c = profile.costs
    return {
        "prefill_2k_s": c.prefill_time([PrefillChunk(0, 2000, 1900)]),
        "prefill_4k_s": c.prefill_time([PrefillChunk(0, 4000, 3900)]),
        "decode_8_ms": c.decode_time(8, 8 * 1500) * 1000,
        "static_gib": m.static_bytes / GIB,
        "weights_gib": m.weight_bytes / GIB,
        "cell_kib": m.kv_bytes_per_token / 1024,
        "pool_tokens": float(m.pool_tokens),
        "gpu_gib": m.gpu_bytes / GIB,
        "headroom_gib": m.headroom_bytes / GIB,
    }


def seed_spread(
    w: Workload, profile: Profile, caps: list[str], config: SimConfig, seeds: list[int]
) -> dict[str, Any]:
    """The replayed sweep on each workload seed: each one's recommendation and TPOT P99 by cap, and per
    cap the median of every seed column (what the shape checks judge) and whether any seed ran out."""
    docs = [(s, sweep(w.model_copy(update={"seed": s}), profile, caps, config)) for s in seeds]
    per_seed = [
        {
            "seed": s,
            "recommendation": d["recommendation"],
            "tpot_p99_ms": {v: dig(p, "summary.tpot_ms.p99") for v, p in zip(caps, d["points"], strict=True)},
        }
        for s, d in docs
    ]
    median = []
    for i in range(len(caps)):
        point: dict[str, Any] = {"oom": {"detected": any(oom(d["points"][i]) for _, d in docs)}}
        for _, path, _, _, _ in COLUMNS:
            known = [v for _, d in docs if (v := dig(d["points"][i], path)) is not None]
            if known:
                set_dotted(point, path, statistics.median(known))
        median.append(point)
    return {"per_seed": per_seed, "median": median}
