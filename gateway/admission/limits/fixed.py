"""FixedLimit: limit = the policy's `initial`, whatever the samples say (under the engine's own cap)."""

from __future__ import annotations

from gateway.admission.limits.base import Bounded, Sample


class FixedLimit(Bounded):
    def update(self, sample: Sample) -> None:
        return None
