"""Rolling P99 and SLO attainment per traffic class over the last N seconds.

Why not keep every sample: a busy gateway sees thousands of requests per window, and the alert rules ask
for P99 every few seconds. Instead the window is a ring of `slots` time slices; each slice holds counts
over fixed geometric buckets (ratio `GROWTH`, so a reported quantile is at most ~3 % above the true one,
never below: the bucket's upper edge, clipped to the largest sample seen). An observation is one bisect;
a query sums the live slices. Slices older than the window are dropped lazily. Pure: the caller passes
`now` (monotonic seconds), so tests drive it with exact times.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

GROWTH = 1.03
_MIN_EDGE = 1e-4  # 0.1 ms; smaller values share the first bucket
_MAX_EDGE = 3600.0


def _edges() -> list[float]:
    count = math.ceil(math.log(_MAX_EDGE / _MIN_EDGE) / math.log(GROWTH)) + 1
    return [_MIN_EDGE * GROWTH**i for i in range(count)]


EDGES: list[float] = _edges()


class _Ring(Generic[T]):
    """The last `window_s` seconds cut into `slots` slices, each holding one payload made by `factory`."""

    def __init__(self, window_s: float, slots: int, factory: Callable[[], T]) -> None:
        if window_s <= 0 or slots < 1:
            raise ValueError("window_s must be > 0 and slots >= 1")
        self.window_s = window_s
        self._width = window_s / slots
        self._factory = factory
        self._slices: deque[tuple[float, T]] = deque()

    def live(self, now: float) -> list[T]:
        self._drop_old(now)
        return [payload for _, payload in self._slices]

    def current(self, now: float) -> T:
        self._drop_old(now)  # an observation needs the newest slice only, not a list of every live one
        start = now - (now % self._width)
        if not self._slices or self._slices[-1][0] < start:
            self._slices.append((start, self._factory()))
        return self._slices[-1][1]

    def _drop_old(self, now: float) -> None:
        cutoff = now - self.window_s
        while self._slices and self._slices[0][0] + self._width <= cutoff:
            self._slices.popleft()


@dataclass(slots=True)
class _Hist:
    counts: dict[int, int] = field(default_factory=dict)  # sparse: bucket index -> samples
    maximum: float = 0.0


class RollingQuantile:
    """Quantiles of samples observed in the last `window_s` seconds."""

    def __init__(self, window_s: float, slots: int = 30) -> None:
        self._ring: _Ring[_Hist] = _Ring(window_s, slots, _Hist)

    def observe(self, value: float, now: float) -> None:
        hist = self._ring.current(now)
        index = min(bisect.bisect_left(EDGES, value), len(EDGES) - 1)
        hist.counts[index] = hist.counts.get(index, 0) + 1
        hist.maximum = max(hist.maximum, value)

    def count(self, now: float) -> int:
        return sum(sum(h.counts.values()) for h in self._ring.live(now))

    def quantile(self, q: float, now: float) -> float | None:
        """Upper bound of the q-quantile (nearest-rank), or None with no samples in the window."""
        live = self._ring.live(now)
        merged: dict[int, int] = {}
        for hist in live:
            for index, n in hist.counts.items():
                merged[index] = merged.get(index, 0) + n
        total = sum(merged.values())
        if total == 0:
            return None
        rank = max(1, math.ceil(q * total))
        seen = 0
        for index in sorted(merged):
            seen += merged[index]
            if seen >= rank:
                return min(EDGES[index], max(h.maximum for h in live))
        raise AssertionError("unreachable: rank <= total")


class RollingRatio:
    """Share of good events in the last `window_s` seconds."""

    def __init__(self, window_s: float, slots: int = 30) -> None:
        self._ring: _Ring[list[int]] = _Ring(window_s, slots, lambda: [0, 0])  # [good, total]

    def observe(self, good: bool, now: float) -> None:
        tally = self._ring.current(now)
        tally[0] += int(good)
        tally[1] += 1

    def ratio(self, now: float) -> float | None:
        live = self._ring.live(now)
        total = sum(t[1] for t in live)
        return None if total == 0 else sum(t[0] for t in live) / total


@dataclass(frozen=True, slots=True)
class ClassStats:
    """One class's rolling view: what the alert rules and the attainment gauge read."""

    traffic_class: str
    samples: int
    ttft_p99: float | None
    tpot_p99: float | None
    attainment: float | None


class SloTracker:
    """Per-class rolling TTFT/TPOT P99 and SLO attainment.

    The caller judges each request against the SLO in force when it finished (policies reload), so
    attainment is exact; P99s are the bucketed upper bounds described above.
    """

    def __init__(self, window_s: float = 300.0, slots: int = 30) -> None:
        self.window_s = window_s
        self._slots = slots
        self._ttft: dict[str, RollingQuantile] = {}
        self._tpot: dict[str, RollingQuantile] = {}
        self._met: dict[str, RollingRatio] = {}

    def _quantiles(self, table: dict[str, RollingQuantile], traffic_class: str) -> RollingQuantile:
        if traffic_class not in table:
            table[traffic_class] = RollingQuantile(self.window_s, self._slots)
        return table[traffic_class]

    def observe(
        self,
        traffic_class: str,
        now: float,
        *,
        ttft: float | None = None,
        tpot: float | None = None,
        ttft_slo: float | None = None,
        tpot_slo: float | None = None,
        failed: bool = False,
    ) -> None:
        """One finished request. A failed request counts as an SLO miss and adds no latency sample."""
        met = not failed
        if ttft is not None and not failed:
            self._quantiles(self._ttft, traffic_class).observe(ttft, now)
            met = met and (ttft_slo is None or ttft <= ttft_slo)
        if tpot is not None and not failed:
            self._quantiles(self._tpot, traffic_class).observe(tpot, now)
            met = met and (tpot_slo is None or tpot <= tpot_slo)
        if traffic_class not in self._met:
            self._met[traffic_class] = RollingRatio(self.window_s, self._slots)
        self._met[traffic_class].observe(met, now)

    def classes(self) -> Iterable[str]:
        return sorted(self._met)

    def stats(self, traffic_class: str, now: float) -> ClassStats:
        ttft = self._ttft.get(traffic_class)
        tpot = self._tpot.get(traffic_class)
        met = self._met.get(traffic_class)
        return ClassStats(
            traffic_class=traffic_class,
            samples=max(ttft.count(now) if ttft else 0, tpot.count(now) if tpot else 0),
            ttft_p99=ttft.quantile(0.99, now) if ttft else None,
            tpot_p99=tpot.quantile(0.99, now) if tpot else None,
            attainment=met.ratio(now) if met else None,
        )

    def snapshot(self, now: float) -> dict[str, ClassStats]:
        return {c: self.stats(c, now) for c in self.classes()}
