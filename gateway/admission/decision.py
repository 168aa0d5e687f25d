"""The context of one dispatch decision: everything placement reads that changes between decisions.

The scheduler builds one per decision (`PoolScheduler.decision`) from the policy, the limits, the queue and
the clock, and hands it to every dispatcher call of that decision; nothing is set on the dispatcher from
outside. `/admin/state` builds its own the same way without touching the scheduler's state. Its `SlotRule`
is the headroom the slot family (slots.py) keeps for the top band and for tenants under their share.

Both are read-only by contract, plain slotted classes rather than frozen dataclasses: two are built per
request, and a frozen dataclass sets each field through `object.__setattr__` (about twice the cost).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

from gateway.admission.settings import PoolBudgets

_NONE: Mapping[int, Mapping[str, float]] = MappingProxyType({})


def _equal_weight(tenant: str) -> float:
    return 1.0


class SlotRule:
    """The headroom rules of one decision (rebuilt by the scheduler from the policy on every pump).
    `present` maps each band to the tenants waiting or running at it in the pool and their VTC weights;
    `weight_of` weighs a tenant not (yet) among them. The default rule keeps no headroom."""

    __slots__ = ("band_fraction", "present", "tenant_fraction", "top_band", "weight_of", "weights")

    def __init__(
        self,
        top_band: float = -math.inf,
        band_fraction: float = 0.0,
        tenant_fraction: float = 0.0,
        present: Mapping[int, Mapping[str, float]] = _NONE,
        weight_of: Callable[[str], float] = _equal_weight,
    ) -> None:
        self.top_band = top_band
        self.band_fraction = band_fraction
        self.tenant_fraction = tenant_fraction
        self.present = present
        self.weight_of = weight_of
        # asked per tenant and backend on every placement: summed once per rule, not per question
        self.weights = {band: sum(t.values()) for band, t in present.items()}  # band → Σ present weights

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


class Decision:
    """`budgets`: the pool's budgets, the round's prefill budget as metered now; `limits`: backend URL → its
    concurrency limit; `rule`: headroom for the top band and tenants under their share; `pool_slots`: Σ
    concurrency limits of the available backends; `prefill_rate`: per-backend tokens/s (a whole request's
    predicted prefill); `share_window_s`: time constant of the tenants' recent service; `inbound`: URL →
    peers' slots whose releases come here."""

    __slots__ = (
        "budgets",
        "inbound",
        "limits",
        "now",
        "pool_slots",
        "prefill_rate",
        "rule",
        "share_window_s",
    )

    def __init__(
        self,
        now: float,
        budgets: PoolBudgets,
        limits: Mapping[str, int],
        rule: SlotRule | None = None,
        pool_slots: int = 0,
        prefill_rate: float = math.inf,
        share_window_s: float = 60.0,
        inbound: Mapping[str, int] = MappingProxyType({}),
    ) -> None:
        self.now = now
        self.budgets = budgets
        self.limits = limits
        self.rule = SlotRule() if rule is None else rule
        self.pool_slots = pool_slots
        self.prefill_rate = prefill_rate
        self.share_window_s = share_window_s
        self.inbound = inbound
