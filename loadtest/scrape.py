"""Backend load during a run: poll each target's Prometheus `/metrics` and reduce to peak / P95.

Memory is judged by its peak, not its average (the seed's rule): an average hides the retraction
storm or OOM that a peak shows. A target whose `/metrics` stops answering after it had answered is
counted as a crash — the OOM signature of an engine that dies instead of retracting.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from loadtest.http import HttpError, HttpPool
from loadtest.metrics import percentile

# Gauges reduced by max across label sets (a fill ratio), everything else is summed (counts, tokens).
WATCHED = {
    "sglang:token_usage": "kv_usage",
    "sglang:num_used_tokens": "kv_used_tokens",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "queued",
    "sglang:num_retracted_requests_total": "retractions_total",
    "sglang:num_retracted_reqs": "retracted_now",
    "sim:memory_peak_bytes": "memory_bytes",  # the simulator's GPU memory in use (per engine: max)
}
MAX_REDUCED = frozenset({"kv_usage", "memory_bytes"})
# The engine's own latency histograms (bucket name → sample-key prefix): engine-side queue time and TTFT,
# measured from the moment a request reaches the engine (behind any outer layer that held it before).
HISTOGRAMS = {
    "sglang:queue_time_seconds_bucket": "queue_le:",
    "sglang:time_to_first_token_seconds_bucket": "ttft_le:",
}
QUEUE_PREFIX = HISTOGRAMS["sglang:queue_time_seconds_bucket"]
TTFT_PREFIX = HISTOGRAMS["sglang:time_to_first_token_seconds_bucket"]


def parse_prometheus(text: str) -> dict[str, float]:
    """Watched metrics from Prometheus text format, reduced across label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line[: line.index("{")], line[line.rindex("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        key = WATCHED.get(name)
        prefix = HISTOGRAMS.get(name)
        if prefix is not None and 'le="' in line:
            key = prefix + line.split('le="', 1)[1].split('"', 1)[0]
        if key is None:
            continue
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        out[key] = max(out.get(key, value), value) if key in MAX_REDUCED else out.get(key, 0.0) + value
    return out


@dataclass(slots=True)
class Sample:
    t: float
    target: str
    up: bool
    values: dict[str, float] = field(default_factory=dict)


async def scrape_once(pool: HttpPool, deadline_s: float) -> dict[str, float] | None:
    try:
        resp = await asyncio.wait_for(pool.request("GET", "/metrics"), deadline_s)
        body = await asyncio.wait_for(resp.read(), deadline_s)
    except (HttpError, TimeoutError):
        return None
    return parse_prometheus(body.decode("utf-8", "replace")) if resp.status == 200 else None


class Scraper:
    """Background poller; `samples` keeps every observation with its offset from the run's start."""

    def __init__(self, targets: list[str], start: float, interval: float = 0.5) -> None:
        self.pools = {t: HttpPool(t) for t in targets}
        self.start = start
        self.interval = interval
        self.samples: list[Sample] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            results = await asyncio.gather(*(scrape_once(p, self.interval * 2) for p in self.pools.values()))
            now = time.perf_counter() - self.start
            for target, values in zip(self.pools, results, strict=True):
                self.samples.append(Sample(now, target, values is not None, values or {}))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
        for p in self.pools.values():
            await p.aclose()


def summarize_samples(samples: list[Sample], time_scale: float = 1.0) -> dict[str, Any]:
    """Peak and P95 per watched gauge (queue and running summed over targets), retractions, crashes."""
    if not samples:
        return {}
    rounds: dict[float, list[Sample]] = {}
    for s in samples:
        rounds.setdefault(s.t, []).append(s)
    out: dict[str, Any] = {}
    for key in ("kv_usage", "kv_used_tokens", "memory_bytes", "running", "queued"):
        reduce = max if key in MAX_REDUCED else sum
        series = [
            reduce(s.values[key] for s in group if key in s.values)
            for group in rounds.values()
            if any(key in s.values for s in group)
        ]
        out[key] = {"peak": max(series), "p95": percentile(series, 95)} if series else None
    retractions = 0.0
    crashes = 0
    by_target: dict[str, list[Sample]] = {}
    for s in samples:
        by_target.setdefault(s.target, []).append(s)
    for seq in by_target.values():
        totals = [s.values["retractions_total"] for s in seq if "retractions_total" in s.values]
        if totals:
            retractions += max(totals) - totals[0]
        crashes += sum(prev.up and not cur.up for prev, cur in itertools.pairwise(seq))
    # The engine observes these on its own clock (virtual seconds for the simulator): no scaling.
    out["engine_queue_ms"] = histogram_ms(histogram_delta(by_target.values(), QUEUE_PREFIX))
    out["engine_ttft_ms"] = histogram_ms(histogram_delta(by_target.values(), TTFT_PREFIX))
    out["retractions"] = retractions
    out["crashes"] = crashes
    out["series"] = [
        {
            "t": t * time_scale,
            "kv_usage": max((s.values.get("kv_usage", 0.0) for s in group), default=0.0),
            "queued": sum(s.values.get("queued", 0.0) for s in group),
            "running": sum(s.values.get("running", 0.0) for s in group),
            "up": all(s.up for s in group),
        }
        for t, group in sorted(rounds.items())
    ]
    return out


def histogram_ms(buckets: dict[float, float]) -> dict[str, float] | None:
    """P50 / P99 in milliseconds of a histogram in seconds, or None when it saw nothing."""
    p99 = histogram_quantile(buckets, 0.99)
    if p99 is None:
        return None
    return {"p50": (histogram_quantile(buckets, 0.5) or 0.0) * 1000, "p99": p99 * 1000}


def histogram_delta(per_target: Iterable[list[Sample]], prefix: str) -> dict[float, float]:
    """Cumulative bucket counts gained during the window, summed over targets: {upper bound: count}."""
    total: dict[float, float] = {}
    for seq in per_target:
        seen = [s.values for s in seq if any(k.startswith(prefix) for k in s.values)]
        if not seen:
            continue
        first, last = seen[0], seen[-1]
        for k, v in last.items():
            if k.startswith(prefix):
                bound = float(k[len(prefix) :])
                total[bound] = total.get(bound, 0.0) + v - first.get(k, 0.0)
    return total


def histogram_quantile(buckets: dict[float, float], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket holding the rank."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    prev_bound, prev_count = 0.0, 0.0
    for b in bounds:
        count = buckets[b]
        if count >= rank:
            if math.isinf(b):
                return prev_bound
            width = count - prev_count
            return prev_bound + (b - prev_bound) * ((rank - prev_count) / width if width > 0 else 1.0)
        prev_bound, prev_count = b, count
    return prev_bound
