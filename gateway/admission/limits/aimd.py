"""AIMDLimit:

    on a drop or latency_ratio > 1:          limit ← limit · backoff   (at most once per cooldown_s)
    otherwise, when in_flight ≥ limit / 2:   limit ← limit + increase

The classic additive-increase / multiplicative-decrease; "used" keeps an idle backend from growing it.
"""

from __future__ import annotations

from gateway.admission.limits.base import Bounded, Sample


class AIMDLimit(Bounded):
    def update(self, sample: Sample) -> None:
        bad = sample.dropped or (sample.latency_ratio is not None and sample.latency_ratio > 1.0)
        if bad:
            if self._may_decrease(sample.now):
                self._set(self._value * self.policy.backoff, sample.now)
        elif sample.in_flight * 2 >= self.limit:
            self._set(self._value + self.policy.increase, sample.now)
