"""Arrival schedules: a rate shape over time combined with a gap process, all pure and seeded.

A shape is a piecewise-linear rate function r(t) (requests/s). Arrivals are drawn by time rescaling:
a unit-rate renewal process (exponential gaps for Poisson, gamma gaps with shape = burstiness as in
vLLM's bench, or fixed gaps for constant) is generated in "operational time" s = Λ(t) = ∫₀ᵗ r, and each
arrival is mapped back with t = Λ⁻¹(s). This is exact for a non-homogeneous Poisson process and keeps
the burstiness of gamma gaps while following the shape.

With N workers each worker k draws from its own seed stream at rate r(t)/N: the superposition of N
independent Poisson processes of rate r/N is a Poisson process of rate r, and no two workers share gaps.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

Process = Literal["poisson", "gamma", "constant"]


@dataclass(frozen=True, slots=True)
class Segment:
    """Rate changes linearly from r0 to r1 over [t0, t1)."""

    t0: float
    t1: float
    r0: float
    r1: float

    def area(self) -> float:
        return (self.r0 + self.r1) / 2 * (self.t1 - self.t0)

    def invert(self, s: float) -> float:
        """Time offset τ into the segment at which the accumulated rate reaches s (0 ≤ s ≤ area)."""
        a, b = self.r0, (self.r1 - self.r0) / (self.t1 - self.t0)
        if abs(b) < 1e-12:
            return s / a
        # b/2·τ² + a·τ − s = 0, numerically stable root.
        disc = max(a * a + 2 * b * s, 0.0)
        return 2 * s / (a + math.sqrt(disc))


@dataclass(frozen=True, slots=True)
class Shape:
    """A rate profile; segments cover [0, duration) and the last rate holds afterwards."""

    segments: tuple[Segment, ...]

    def rate(self, t: float) -> float:
        for seg in self.segments:
            if seg.t0 <= t < seg.t1:
                return seg.r0 + (seg.r1 - seg.r0) * (t - seg.t0) / (seg.t1 - seg.t0)
        return self.segments[-1].r1

    def scaled(self, factor: float) -> Shape:
        """Same profile with every rate multiplied by factor (worker split, time scaling)."""
        return Shape(tuple(Segment(s.t0, s.t1, s.r0 * factor, s.r1 * factor) for s in self.segments))

    def compressed(self, speed: float) -> Shape:
        """The profile played `speed` times faster: times divided, rates multiplied."""
        return Shape(
            tuple(Segment(s.t0 / speed, s.t1 / speed, s.r0 * speed, s.r1 * speed) for s in self.segments)
        )

    def inverse(self, s: float) -> float:
        """Λ⁻¹(s): wall offset at which the cumulative expected count reaches s."""
        acc = 0.0
        for seg in self.segments:
            area = seg.area()
            if s <= acc + area and area > 0:
                return seg.t0 + seg.invert(s - acc)
            acc += area
        last = self.segments[-1]
        if last.r1 <= 0:
            return math.inf
        return last.t1 + (s - acc) / last.r1


def _check_rate(*rates: float) -> None:
    if any(r < 0 or not math.isfinite(r) for r in rates):
        raise ValueError(f"rates must be finite and ≥ 0, got {rates}")


def constant_shape(rate: float) -> Shape:
    _check_rate(rate)
    return Shape((Segment(0.0, 1.0, rate, rate),))


def step_shape(rates: list[float], dwell: float) -> Shape:
    """Rate ladder: each rate held for `dwell` seconds, the last one held on."""
    _check_rate(*rates)
    if not rates or dwell <= 0:
        raise ValueError("step shape needs at least one rate and dwell > 0")
    return Shape(tuple(Segment(i * dwell, (i + 1) * dwell, r, r) for i, r in enumerate(rates)))


def sawtooth_shape(low: float, high: float, period: float, duration: float) -> Shape:
    """low → high → low every `period` seconds (triangular), repeated until `duration`."""
    _check_rate(low, high)
    if period <= 0:
        raise ValueError("sawtooth period must be > 0")
    half = period / 2
    segs = []
    t = 0.0
    rising = True
    while t < max(duration, period):
        r0, r1 = (low, high) if rising else (high, low)
        segs.append(Segment(t, t + half, r0, r1))
        t += half
        rising = not rising
    return Shape(tuple(segs))


def burst_shape(base: float, peak: float, every: float, length: float, duration: float) -> Shape:
    """`base` rate with a burst at `peak` for `length` seconds at the start of every `every` seconds."""
    _check_rate(base, peak)
    if not 0 < length < every:
        raise ValueError("burst needs 0 < length < every")
    segs = []
    t = 0.0
    while t < max(duration, every):
        segs.append(Segment(t, t + length, peak, peak))
        segs.append(Segment(t + length, t + every, base, base))
        t += every
    return Shape(tuple(segs))


def worker_rng(seed: int, worker: int) -> random.Random:
    """An independent, reproducible stream per (seed, worker)."""
    return random.Random(f"omnigate-loadtest:{seed}:{worker}")


def unit_gap(process: Process, burstiness: float, rng: random.Random) -> float:
    """One gap of a unit-rate renewal process."""
    if process == "poisson":
        return rng.expovariate(1.0)
    if process == "gamma":
        if burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        return rng.gammavariate(burstiness, 1.0 / burstiness)
    return 1.0


def schedule(
    shape: Shape,
    *,
    duration: float,
    count: int | None = None,
    process: Process = "poisson",
    burstiness: float = 1.0,
    seed: int = 0,
    worker: int = 0,
    workers: int = 1,
) -> list[float]:
    """Send offsets (seconds from start) for one worker, bounded by duration and by its share of count."""
    if workers < 1 or not 0 <= worker < workers:
        raise ValueError(f"worker {worker} out of range for {workers} workers")
    rng = worker_rng(seed, worker)
    mine = shape.scaled(1.0 / workers)
    limit = None if count is None else count // workers + (1 if worker < count % workers else 0)
    out: list[float] = []
    # Constant gaps: workers are phase-shifted so their sends interleave evenly.
    s = (worker + 0.5) / workers - 1.0 if process == "constant" else 0.0
    while limit is None or len(out) < limit:
        s += unit_gap(process, burstiness, rng)
        t = mine.inverse(s)
        if t >= duration:
            break
        out.append(t)
    return out
