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

import math
import random
from dataclasses import dataclass, field
from typing import Any

from loadtest.arrivals import constant_shape, schedule
from loadtest.media import MediaCache
from loadtest.metrics import error_bursts, stats, summarize
from loadtest.records import RequestRecord
from loadtest.sim.engine import Engine, EngineConfig, EngineError, SimRequest
from loadtest.sim.profile import Profile
from loadtest.sim.tokens import PromptCounter
from loadtest.workload import RequestFactory, Workload


@dataclass(slots=True)
class Arrival:
    t: float
    phase: str
    req: SimRequest
    bucket: str


@dataclass(slots=True)
class Gauges:
    kv_peak: float = 0.0
    running_peak: int = 0
    queued_peak: int = 0
    retracted: int = 0
    crashes: int = 0
    queue_s: list[float] = field(default_factory=list)


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
        natural = round(out_rng.lognormvariate(math.log(o.median_tokens), o.sigma))
        req = SimRequest(
            f"r{i}", prompt.total, max_new, min(max_new, max(o.min_tokens, natural)),
            encoder_tokens=prompt.encoder_tokens, arrival=t,
        )  # fmt: skip
        out.append(Arrival(t, phase, req, prepared.bucket))
    return out


def run(engine: Engine, sends: list[Arrival], end: float) -> tuple[list[RequestRecord], Gauges]:
    """Feed the sends, step until `end` (the harness's drain deadline); measured records and gauges."""
    g = Gauges()
    rejected: set[str] = set()
    measured_start = min((a.t for a in sends if a.phase == "measured"), default=0.0)
    total = engine.config.max_total_tokens
    nxt = 0
    while engine.now < end and (nxt < len(sends) or engine.has_work()):
        while nxt < len(sends) and sends[nxt].t <= engine.now:
            try:
                engine.submit(sends[nxt].req)
            except EngineError:
                rejected.add(sends[nxt].req.rid)
            nxt += 1
        res = engine.step()
        if res is None:
            if nxt < len(sends):
                engine.advance_to(sends[nxt].t)
            elif engine.crashed_until is not None:
                engine.advance_to(engine.crashed_until)
            else:
                break
            continue
        if res.start >= measured_start:
            g.kv_peak = max(g.kv_peak, engine.used_tokens / total)
            g.running_peak = max(g.running_peak, engine.num_running)
            g.queued_peak = max(g.queued_peak, len(engine.waiting))
            g.retracted += len(res.retracted)
            g.crashes += res.kind == "crash"
    records = []
    for a in sends:
        if a.phase != "measured":
            continue
        r = a.req
        if r.admitted_at is not None:
            g.queue_s.append(r.admitted_at - r.arrival)
        records.append(_record(a, r.rid in rejected, end))
    return records, g


def _record(a: Arrival, rejected: bool, end: float) -> RequestRecord:
    r = a.req
    rec = RequestRecord(bucket=a.bucket, scheduled=a.t, sent=a.t, prompt_tokens=r.prompt_tokens)
    if rejected:
        rec.status, rec.error, rec.e2e = 503, "http_503", 0.0
        return rec
    rec.status = 200 if r.error is None else r.error.status
    rec.chunk_times = [t - a.t for t in r.token_times]
    rec.ttft = rec.chunk_times[0] if rec.chunk_times else None
    if r.error is not None:
        rec.error = "InternalServerError"
        rec.e2e = (r.finished_at or end) - a.t
    elif r.finished_at is None:
        rec.error = "unfinished"  # still running when the drain window closed
        rec.e2e = end - a.t
    else:
        rec.e2e = r.finished_at - a.t
        rec.output_tokens = r.generated
    return rec


def point(w: Workload, profile: Profile, config: EngineConfig, sends: list[Arrival]) -> dict[str, Any]:
    """One sweep point as a run document with the fields validate-seed and the recommendation read."""
    for a in sends:  # fresh engine state on the shared request list
        r = a.req
        r.generated = r.kv = r.retractions = 0
        r.admitted_at = r.finished_at = r.finish_reason = r.error = None
        r.token_times = []
        r.arrival = a.t
    engine = Engine(config, profile.costs)
    drain = w.drain if w.drain is not None else w.timeout
    end = w.warmup.duration + w.duration + drain
    records, g = run(engine, sends, end)
    summary = summarize(records, w.slo)
    q = stats([s * 1000 for s in g.queue_s])
    bursts = error_bursts(records)
    return {
        "kind": "run",
        "summary": summary,
        "backend": {
            "kv_usage": {"peak": g.kv_peak},
            "running": {"peak": g.running_peak},
            "queued": {"peak": g.queued_peak},
            "retractions": g.retracted,
            "engine_queue_ms": q,
        },
        "oom": {"crashes": g.crashes, "error_bursts": bursts, "detected": g.crashes > 0 or bursts > 0},
    }
