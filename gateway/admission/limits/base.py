"""What every limit shares: the sample it learns from, its interface, and the bounded value behind it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from gateway.admission.settings import ControllerPolicy


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished request on the backend: when, how many ran beside it, its SLO-relative latency
    (`signal.latency_ratio`, and its TPOT part `signal.tpot_ratio`; None when no objective applies),
    whether the backend refused it, and the share of its decode time its engine spent on the prefill the
    gateway sent it meanwhile (`decode_share.PrefillSeen`, in [0, 1]; None when unknown)."""

    now: float
    in_flight: int
    latency_ratio: float | None = None
    dropped: bool = False
    tpot_ratio: float | None = None
    prefill_share: float | None = None


class Limit(Protocol):
    policy: ControllerPolicy
    ceiling: int | None

    @property
    def limit(self) -> int: ...

    @property
    def value(self) -> float: ...

    @property
    def prefill_duty(self) -> float: ...

    def update(self, sample: Sample) -> None: ...


class Bounded:
    """A float value kept within [min, max] and under `ceiling` (the engine's own cap on running
    requests, set by the scheduler from the backend's scrape), exposed as an int; the decrease cooldown.
    The value is what another replica can follow: `make_limit(policy, start=value)` resumes it."""

    def __init__(self, policy: ControllerPolicy, start: float | None = None) -> None:
        self.policy = policy
        self.ceiling: int | None = None
        self._value = self._clamp(float(policy.initial if start is None else start))
        self._last_decrease = -math.inf

    @property
    def limit(self) -> int:
        return int(self._clamp(self._value))

    @property
    def value(self) -> float:
        return self._value

    @property
    def prefill_duty(self) -> float:
        """The share of the engine's prefill rate the round budget may meter out: all of it, unless the
        algorithm derives a cap from the TPOT objective (target.py)."""
        return 1.0

    def _clamp(self, value: float) -> float:
        top = float(self.policy.max if self.ceiling is None else min(self.policy.max, self.ceiling))
        return min(top, max(float(self.policy.min), value))

    def _may_decrease(self, now: float) -> bool:
        return now - self._last_decrease >= self.policy.cooldown_s

    def _set(self, value: float, now: float) -> None:
        value = self._clamp(value)
        if value < self._value:
            self._last_decrease = now
        self._value = value
