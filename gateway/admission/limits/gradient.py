"""GradientLimit (Netflix's Gradient2, anchored to the SLO):

    long  ← EWMA(ratio, long_alpha), pulled down 5 % when long > 2 · ratio   (drift recovery)
    grad  = clamp(min(tolerance · long, setpoint) / ratio, 0.5, 1)          (a drop is grad 0.5)
    new   = limit · grad + sqrt(limit)                                       (queue allowance)
    limit ← limit · (1 − smoothing) + new · smoothing

It follows latency *gradients*: the limit grows while requests run below setpoint × target and shrinks
above it, whatever percentile that puts at the objective. Decreases wait `cooldown_s`; no growth while
app-limited (in_flight < limit / 2); samples without a latency signal count as grad 1.
"""

from __future__ import annotations

import math

from gateway.admission.limits.base import Bounded, Sample
from gateway.admission.settings import ControllerPolicy


class GradientLimit(Bounded):
    def __init__(self, policy: ControllerPolicy, start: float | None = None) -> None:
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
