"""Drive the engine model directly (no HTTP) through a batch-cap sweep, to check the profile's shape.

A calibration aid, not the load-test harness: Poisson arrivals whose rate follows a sawtooth, the seed's
5:3:2 text : single-image : multi-image mix, and the seed table's columns computed from the engine's own
per-request timestamps. Usage: `python -m loadtest.sim.shape --caps 8,16,32,48,64,128`.
"""

from __future__ import annotations

import argparse
import math
import random
from dataclasses import dataclass

from loadtest.sim.engine import Engine, EngineConfig, EngineError, SimRequest
from loadtest.sim.profile import Profile, load_profile
from loadtest.sim.vision import image_tokens

KV_BYTES_PER_TOKEN = 57_344
RESOLUTIONS = [(480, 640), (720, 1280), (768, 1024), (1080, 1920), (1024, 1024), (600, 800)]


@dataclass(frozen=True)
class Workload:
    rate_low: float = 2.0
    rate_high: float = 9.0
    period_s: float = 120.0
    duration_s: float = 600.0
    warmup_s: float = 60.0
    max_tokens: int = 1024
    max_queued: int | None = None
    seed: int = 7


def _rate(w: Workload, t: float) -> float:
    phase = (t % w.period_s) / w.period_s
    tri = 2 * phase if phase < 0.5 else 2 * (1 - phase)
    return w.rate_low + (w.rate_high - w.rate_low) * tri


def _request(i: int, t: float, rng: random.Random, profile: Profile, w: Workload) -> SimRequest:
    kind = rng.choices(["text", "single", "multi"], weights=[5, 3, 2])[0]
    images = {"text": 0, "single": 1, "multi": rng.randint(2, 4)}[kind]
    vis = sum(image_tokens(*rng.choice(RESOLUTIONS), profile.vision) for _ in range(images))
    text = int(rng.lognormvariate(math.log(600 if kind == "text" else 120), 0.5))
    out = max(1, int(rng.lognormvariate(math.log(profile.output.median_tokens), profile.output.sigma)))
    return SimRequest(f"r{i}", text + vis, w.max_tokens, out, encoder_tokens=vis, arrival=t)


def run_point(profile: Profile, cap: int, w: Workload) -> dict[str, float]:
    cfg = EngineConfig(
        max_total_tokens=profile.engine.max_total_tokens,
        max_running_requests=cap,
        max_prefill_tokens=profile.engine.max_prefill_tokens,
        chunked_prefill_size=profile.engine.chunked_prefill_size,
        max_queued_requests=w.max_queued,
    )
    engine = Engine(cfg, profile.costs)
    rng = random.Random(w.seed)
    arrivals: list[SimRequest] = []
    t, i = 0.0, 0
    while t < w.duration_s:
        t += rng.expovariate(_rate(w, t))
        arrivals.append(_request(i, t, rng, profile, w))
        i += 1
    done: list[SimRequest] = []
    peak_used, retracted, rejected = 0, 0, 0
    nxt = 0
    while nxt < len(arrivals) or engine.has_work():
        while nxt < len(arrivals) and arrivals[nxt].arrival <= engine.now:
            try:
                engine.submit(arrivals[nxt])
            except EngineError:
                rejected += 1
            nxt += 1
        res = engine.step()
        if res is None:
            if nxt < len(arrivals):
                engine.advance_to(arrivals[nxt].arrival)
            continue
        peak_used = max(peak_used, engine.used_tokens)
        retracted += len(res.retracted)
        done.extend(res.finished)
    measured = [r for r in done if r.arrival >= w.warmup_s]
    span = w.duration_s - w.warmup_s
    tokens = sum(1 for r in done for t in r.token_times if w.warmup_s <= t < w.duration_s)
    ttft = [r.token_times[0] - r.arrival for r in measured]
    tpot = [(r.token_times[-1] - r.token_times[0]) / (r.generated - 1) for r in measured if r.generated > 1]
    queue = [(r.admitted_at or r.arrival) - r.arrival for r in measured]
    return {
        "cap": cap,
        "tokens_per_s": tokens / span,
        "ttft_p99_ms": _pct(ttft, 99) * 1e3,
        "tpot_p50_ms": _pct(tpot, 50) * 1e3,
        "tpot_p99_ms": _pct(tpot, 99) * 1e3,
        "queue_p99_ms": _pct(queue, 99) * 1e3,
        "kv_peak_pct": 100 * peak_used / cfg.max_total_tokens,
        "kv_peak_gb": peak_used * KV_BYTES_PER_TOKEN / 1e9,
        "retracted": retracted,
        "rejected_pct": 100 * rejected / len(arrivals),
    }


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="default")
    ap.add_argument("--caps", default="8,16,32,48,64,128")
    ap.add_argument("--rate-low", type=float, default=Workload.rate_low)
    ap.add_argument("--rate-high", type=float, default=Workload.rate_high)
    ap.add_argument("--duration", type=float, default=Workload.duration_s)
    ap.add_argument("--max-queued", type=int, default=None)
    ap.add_argument("--seed", type=int, default=Workload.seed)
    args = ap.parse_args(argv)
    w = Workload(
        rate_low=args.rate_low,
        rate_high=args.rate_high,
        duration_s=args.duration,
        seed=args.seed,
        max_queued=args.max_queued,
    )
    profile = load_profile(args.profile)
    cols = ["cap", "tokens_per_s", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "queue_p99_ms", "kv_peak_pct"]
    print(" ".join(f"{c:>13}" for c in [*cols, "retracted", "rejected_pct"]))
    for cap in (int(c) for c in args.caps.split(",")):
        row = run_point(profile, cap, w)
        print(" ".join(f"{row[c]:>13.0f}" for c in [*cols, "retracted", "rejected_pct"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
