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
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from loadtest.arrivals import constant_shape, schedule
from loadtest.media import MediaCache
from loadtest.metrics import error_bursts, summarize
from loadtest.records import RequestRecord
from loadtest.scrape import histogram_ms
from loadtest.sim.engine import Engine, EngineConfig, EngineError, SimRequest
from loadtest.sim.metrics import QUEUE_BUCKETS, TTFT_BUCKETS
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
        req = SimRequest(
            f"r{i}", prompt.total, max_new, out_len,
            encoder_tokens=prompt.encoder_tokens, arrival=t,
        )  # fmt: skip
        out.append(Arrival(t, phase, req, prepared.bucket))
    return out


def run(
    engine: Engine, sends: list[Arrival], end: float, max_in_flight: int | None = None
) -> tuple[list[RequestRecord], Gauges]:
    """Feed the sends, step until `end` (the harness's drain deadline); measured records and gauges.

    With `max_in_flight` the client holds arrivals in FIFO order while that many are at the engine and
    releases one whenever one finishes (the harness's outer in-flight cap, RunOptions.max_in_flight).
    """
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
        while held and slot_free:
            a = held.popleft()
            a.req.arrival = max(a.t, slot_free.popleft())
            released[a.req.rid] = a.req.arrival
            try:
                engine.submit(a.req)
            except EngineError:
                rejected.add(a.req.rid)
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
            g.kv_peak = max(g.kv_peak, engine.used_tokens / total)
            g.running_peak = max(g.running_peak, engine.num_running)
            g.queued_peak = max(g.queued_peak, len(engine.waiting))
            g.retracted += len(res.retracted)
            g.crashes += res.kind == "crash"
    records = [
        _record(a, a.req.rid in rejected, released.get(a.req.rid), end)
        for a in sends
        if a.phase == "measured"
    ]
    return records, g


def _record(a: Arrival, rejected: bool, sent: float | None, end: float) -> RequestRecord:
    r = a.req
    if sent is None:  # still held by the outer cap when the drain window closed
        rec = RequestRecord(bucket=a.bucket, scheduled=a.t, sent=end, outer_wait=end - a.t, e2e=0.0)
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
        rec.error = "InternalServerError"
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
) -> dict[str, Any]:
    """One sweep point as a run document with the fields validate-seed and the recommendation read.

    Engine-side TTFT and queue quantiles go through the sim's own histogram buckets, as a scrape sees them.
    """
    for a in sends:  # fresh engine state on the shared request list
        r = a.req
        r.generated = r.kv = r.retractions = 0
        r.admitted_at = r.finished_at = r.finish_reason = r.error = None
        r.token_times = []
        r.arrival = a.t
    engine = Engine(config, profile.costs)
    drain = w.drain if w.drain is not None else w.timeout
    end = w.warmup.duration + w.duration + drain
    records, g = run(engine, sends, end, max_in_flight)
    summary = summarize(records, w.slo)
    bursts = error_bursts(records)
    return {
        "kind": "run",
        "summary": summary,
        "backend": {
            "kv_usage": {"peak": g.kv_peak},
            "running": {"peak": g.running_peak},
            "queued": {"peak": g.queued_peak},
            "retractions": g.retracted,
            "engine_queue_ms": histogram_ms(histogram(g.queue_s, QUEUE_BUCKETS)),
            "engine_ttft_ms": histogram_ms(histogram(g.ttft_s, TTFT_BUCKETS)),
        },
        "oom": {"crashes": g.crashes, "error_bursts": bursts, "detected": g.crashes > 0 or bursts > 0},
    }
