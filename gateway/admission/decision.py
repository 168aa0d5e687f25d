"""The frozen context of one dispatch decision: everything placement reads that changes between decisions.

The scheduler builds one per decision (`PoolScheduler.decision`) from the policy, the limits, the queue and
the clock, and hands it to every dispatcher call of that decision; nothing is set on the dispatcher from
outside. `/admin/state` builds its own the same way without touching the scheduler's state. Its `SlotRule`
is the headroom the slot family (slots.py) keeps for the top band and for tenants under their share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gateway.admission.settings import PoolBudgets


@dataclass(frozen=True, slots=True)
class SlotRule:
    """The headroom rules of one decision (rebuilt by the scheduler from the policy on every pump).
    `present` maps each band to the tenants waiting or running at it in the pool and their VTC weights;
    `weight_of` weighs a tenant not (yet) among them. The default rule keeps no headroom."""

    top_band: float = -math.inf
    band_fraction: float = 0.0
    tenant_fraction: float = 0.0
    present: Mapping[int, Mapping[str, float]] = field(default_factory=dict)
    weight_of: Callable[[str], float] = lambda tenant: 1.0
    weights: Mapping[int, float] = field(init=False, repr=False, compare=False)  # band → Σ present weights

    def __post_init__(self) -> None:
        # asked per tenant and backend on every placement: summed once per rule, not per question
        object.__setattr__(self, "weights", {band: sum(t.values()) for band, t in self.present.items()})

    def band_reserve(self, band: float, limit: int) -> int:
        """Slots a request of `band` must leave free for the top band."""
        if band >= self.top_band or self.band_fraction <= 0:
            return 0
        return min(limit - 1, math.ceil(self.band_fraction * limit))

    def tenant_share(self, band: int, tenant: str) -> float:
        """The tenant's weighted fair share of a backend's slots at `band`, 0..1."""
        present = self.present.get(band, {})
        total = self.weights.get(band, 0)
        weight = present.get(tenant)
        if weight is None:
            weight = self.weight_of(tenant)
            total += weight
        return weight / total if total > 0 else 1.0


@dataclass(frozen=True, slots=True)
class Decision:
    now: float
    budgets: PoolBudgets  # the pool's budgets, the round's prefill budget as metered now
    limits: Mapping[str, int]  # backend URL → its concurrency limit
    rule: SlotRule = field(default_factory=SlotRule)  # headroom for the top band and tenants under share
    pool_slots: int = 0  # Σ concurrency limits of the available backends
    prefill_rate: float = math.inf  # per-backend tokens/s: a whole request's predicted prefill
    share_window_s: float = 60.0  # time constant of the tenants' recent service
    inbound: Mapping[str, int] = field(default_factory=dict)  # URL → peers' slots whose releases come here
