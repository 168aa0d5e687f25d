"""Adaptive concurrency limits, one per backend, behind one interface (after Netflix concurrency-limits).

`limit.update(sample)` feeds one finished request; `limit.limit` is the current cap on active requests,
always within the policy's [min, max]. The signal is length-normalised and SLO-relative:

    latency_ratio = max(TPOT / TPOT target, (TTFT − estimated prefill time) / TTFT target)

so 1.0 means "exactly at the class SLO"; a backend 503 / queue-full answer is a drop. Decreases are
rate-limited by `cooldown_s` so one burst of bad samples does not collapse the limit.

- FixedLimit: the policy's `initial`, never moves.
- AIMDLimit: on a drop or a ratio > 1, limit ← limit · backoff (once per cooldown); otherwise, when the
  backend is actually used (in_flight ≥ limit / 2), limit ← limit + increase.
- GradientLimit (Gradient2): long ← EWMA(ratio, long_alpha), pulled down 5 % when long > 2 · ratio
  (drift recovery); grad = clamp(min(tolerance · long, setpoint) / ratio, 0.5, 1); a drop is grad 0.5;
  new = limit · grad + sqrt(limit) (queue allowance); limit ← limit · (1 − smoothing) + new · smoothing.
  The `setpoint` cap anchors Gradient2's relative baseline to the SLO: the limit grows while requests run
  below setpoint × target and shrinks above it. No growth while app-limited (in_flight < limit / 2);
  samples without a latency signal (classes with no SLO) count as grad 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from gateway.admission.settings import ControllerPolicy, SLOClass


@dataclass(frozen=True, slots=True)
class Sample:
    now: float
    in_flight: int
    latency_ratio: float | None = None
    dropped: bool = False


class Limit(Protocol):
    policy: ControllerPolicy

    @property
    def limit(self) -> int: ...

    def update(self, sample: Sample) -> None: ...


class _Bounded:
    """Shared state: a float value kept within [min, max], exposed as an int, and the decrease cooldown."""

    def __init__(self, policy: ControllerPolicy, start: int | None = None) -> None:
        self.policy = policy
        self._value = float(policy.initial if start is None else start)
        self._value = self._clamp(self._value)
        self._last_decrease = -math.inf

    @property
    def limit(self) -> int:
        return int(self._value)

    def _clamp(self, value: float) -> float:
        return min(float(self.policy.max), max(float(self.policy.min), value))

    def _may_decrease(self, now: float) -> bool:
        return now - self._last_decrease >= self.policy.cooldown_s

    def _set(self, value: float, now: float) -> None:
        value = self._clamp(value)
        if value < self._value:
            self._last_decrease = now
        self._value = value


class FixedLimit(_Bounded):
    def update(self, sample: Sample) -> None:
        return None


class AIMDLimit(_Bounded):
    def update(self, sample: Sample) -> None:
        bad = sample.dropped or (sample.latency_ratio is not None and sample.latency_ratio > 1.0)
        if bad:
            if self._may_decrease(sample.now):
                self._set(self._value * self.policy.backoff, sample.now)
        elif sample.in_flight * 2 >= self.limit:
            self._set(self._value + self.policy.increase, sample.now)


class GradientLimit(_Bounded):
    def __init__(self, policy: ControllerPolicy, start: int | None = None) -> None:
        super().__init__(policy, start)
        self.long: float | None = None

    def update(self, sample: Sample) -> None:
        grad = self._gradient(sample)
        if grad >= 1.0 and sample.in_flight * 2 < self.limit:
            return
        if grad < 1.0 and not self._may_decrease(sample.now):
            return
        p = self.policy
        proposal = self._value * grad + math.sqrt(self._value)
        self._set(self._value * (1 - p.smoothing) + proposal * p.smoothing, sample.now)

    def _gradient(self, sample: Sample) -> float:
        if sample.dropped:
            return 0.5
        ratio = sample.latency_ratio
        if ratio is None:
            return 1.0
        ratio = max(ratio, 1e-9)
        p = self.policy
        self.long = ratio if self.long is None else self.long + p.long_alpha * (ratio - self.long)
        if self.long > 2 * ratio:
            self.long *= 0.95
        return min(1.0, max(0.5, min(p.tolerance * self.long, p.setpoint) / ratio))


_ALGORITHMS: dict[str, type[FixedLimit] | type[AIMDLimit] | type[GradientLimit]] = {
    "fixed": FixedLimit,
    "aimd": AIMDLimit,
    "gradient": GradientLimit,
}


def make_limit(policy: ControllerPolicy, start: int | None = None) -> Limit:
    """A limit of the policy's algorithm; `start` carries the current value over a policy reload."""
    return _ALGORITHMS[policy.algorithm](policy, None if policy.algorithm == "fixed" else start)


def latency_ratio(
    slo: SLOClass,
    ttft_s: float | None,
    tpot_s: float | None,
    prefill_s: float,
    shared_tpot_p99_s: float | None = None,
) -> float | None:
    """max(TPOT / target, (TTFT − estimated prefill) / target); None when no target applies. A class
    without a TPOT target is judged by `shared_tpot_p99_s`, the tightest target among the requests that
    share its backend's decode batch: its TPOT is theirs."""
    parts = []
    tpot_target = slo.tpot_p99_s if slo.tpot_p99_s is not None else shared_tpot_p99_s
    if tpot_target is not None and tpot_s is not None:
        parts.append(tpot_s / tpot_target)
    if slo.ttft_p99_s is not None and ttft_s is not None:
        parts.append(max(0.0, ttft_s - prefill_s) / slo.ttft_p99_s)
    return max(parts) if parts else None
