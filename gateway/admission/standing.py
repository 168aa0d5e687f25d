"""Tenant standing: which tenant is under its weighted fair share, and the engine priority that follows.

A tenant holding fewer of the pool's slots at its band than its weighted fair share, and whose recent
service in tokens (`RecentService`) is below the weighted average of the tenants present there, is
*under its share*. Such a tenant goes first in its band (queue.py), ranks half a band above the others
(`rank`: the shield protects it), and, when the pool's engines schedule by priority
(`priority_scheduling`), gets the engine priority `2 · band + 1` instead of `2 · band`: the engine serves
its waiting requests by that value, so a light tenant's prefill overtakes a heavy tenant's queued ones
instead of waiting behind them. Without tenant headroom
(`fairness.reserve_fraction` 0) nobody is under.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gateway.admission.decision import Decision
from gateway.admission.slots import Holdings
from gateway.request.ticket import Ticket


class RecentService:
    """Weighted tokens dispatched per tenant, decayed with time constant `window_s`: the rate view of
    service that VTC's lifted counters no longer hold (a light tenant lifted to a heavy one's counter on
    every arrival reads as just as served). `below` tells a tenant receiving less than the
    weighted average of the tenants present — less than its share of the pool's recent service."""

    def __init__(self) -> None:
        self._service: dict[str, tuple[float, float]] = {}  # tenant → (decayed charge, as of)
        self.version = 0  # bumped on every change, so callers may cache `totals` between changes
        # shared between replicas: the charges not yet in the replicas' sums, (decayed charge, as of)
        self._pending: dict[str, tuple[float, float]] | None = None

    def charge(
        self, tenant: str, amount: float, now: float, window_s: float, at: float | None = None
    ) -> None:
        """Add a dispatch's VTC charge (already divided by the tenant's weight); at the end, the actual
        usage's charge minus that estimate, dated `at` the dispatch so it decays as the estimate did (an
        undated correction of a long request would outweigh its long-decayed estimate)."""
        age = 0.0 if at is None else max(0.0, now - at)
        self.version += 1
        added = amount * math.exp(-age / window_s)
        self._service[tenant] = (self.value(tenant, now, window_s) + added, now)
        if self._pending is not None:
            self._pending[tenant] = (_decayed(self._pending.get(tenant), now, window_s) + added, now)

    def value(self, tenant: str, now: float, window_s: float) -> float:
        return _decayed(self._service.get(tenant), now, window_s)

    def totals(self, present: Mapping[str, float], now: float, window_s: float) -> tuple[float, float]:
        """(Σ weight · recent service, Σ weight) over `present` (tenant → weight)."""
        return sum(w * self.value(t, now, window_s) for t, w in present.items()), sum(present.values())

    def below(self, tenant: str, totals: tuple[float, float], now: float, window_s: float) -> bool:
        """Is `tenant`'s weight-normalised recent service below the weighted average `totals` (which
        count `tenant`)? Equal service is not under: two tenants served alike tie."""
        service, weight = totals
        return weight > 0 and self.value(tenant, now, window_s) < service / weight * (1 - 1e-9)

    def share(self) -> None:
        """From now on keep every charge for the replicas' shared sums (the coordinator calls it)."""
        if self._pending is None:
            self._pending = {}

    def take_pending(self, now: float, window_s: float) -> dict[str, float]:
        """The charges since the last call, decayed to `now`, to add to the shared sums."""
        pending, self._pending = self._pending or {}, {}
        return {tenant: _decayed(p, now, window_s) for tenant, p in pending.items()}

    def restore(self, pending: dict[str, float], now: float, window_s: float) -> None:
        """Charges `take_pending` gave (as of `now`) that never reached the shared sums."""
        mine = self._pending if self._pending is not None else {}
        for tenant, value in pending.items():
            mine[tenant] = (_decayed(mine.get(tenant), now, window_s) + value, now)
        self._pending = mine

    def merge(self, totals: dict[str, float], now: float, window_s: float) -> None:
        """Adopt the shared sums as of `now` (every replica's charges, this one's taken ones included)
        plus what this replica charged since it took them."""
        pending = self._pending or {}
        for tenant, total in totals.items():
            self._service[tenant] = (total + _decayed(pending.get(tenant), now, window_s), now)
        self.version += 1

    def forget(self, now: float, window_s: float) -> None:
        """Drop tenants whose service has decayed to nothing, so the map stays bounded."""
        for tenant in [t for t in self._service if self.value(t, now, window_s) < 1e-6]:
            del self._service[tenant]
            self.version += 1


def _decayed(entry: tuple[float, float] | None, now: float, window_s: float) -> float:
    if entry is None:
        return 0.0
    value, at = entry
    return value * math.exp(-max(0.0, now - at) / window_s)


class Standing:
    """Standing and rank of a pool's tenants, from the slots they hold (`holdings`, the dispatcher's) and
    the service they were recently given (`recent`, charged by the scheduler at dispatch and at the end)."""

    def __init__(self, holdings: Holdings, recent: RecentService, engine_priorities: bool = False) -> None:
        self.holdings = holdings
        self.engine_priorities = engine_priorities  # the engines serve waiting work by priority
        self.recent = recent
        self._totals: dict[int, tuple[float, float]] = {}  # band → RecentService.totals of its present
        self._totals_of: tuple[Decision, int] | None = None  # (decision, recent.version) they hold for

    def under_share(self, band: int, tenant: str, ctx: Decision) -> bool:
        """Is `tenant` under its weighted fair share at `band` of both scarce things: the pool's slots
        (the slot rule's `tenant_share` × `pool_slots`: running generations cannot be preempted) and its
        recent service in tokens (the prefill a light tenant waits behind)?"""
        rule = ctx.rule
        if rule.tenant_fraction <= 0:
            return False
        share = rule.tenant_share(band, tenant) * ctx.pool_slots
        if self.holdings.in_pool(band, tenant) >= share:
            return False
        service, weight = self._band_totals(band, ctx)
        if tenant not in rule.present.get(band, {}):
            w = rule.weight_of(tenant)
            service += w * self.recent.value(tenant, ctx.now, ctx.share_window_s)
            weight += w
        return self.recent.below(tenant, (service, weight), ctx.now, ctx.share_window_s)

    def _band_totals(self, band: int, ctx: Decision) -> tuple[float, float]:
        """RecentService.totals of the tenants present at `band`, kept for one decision until the service
        changes: the queue ranks every tenant by `under_share` on every placement, and summing over all
        the present tenants for each would make that quadratic in tenants."""
        held = self._totals_of
        if held is None or held[0] is not ctx or held[1] != self.recent.version:
            self._totals, self._totals_of = {}, (ctx, self.recent.version)
        totals = self._totals.get(band)
        if totals is None:
            present = ctx.rule.present.get(band, {})
            totals = self._totals[band] = self.recent.totals(present, ctx.now, ctx.share_window_s)
        return totals

    def rank(self, ticket: Ticket, ctx: Decision) -> float:
        """The ticket's place in the pool's order across tenants: its band, plus a half while its tenant is
        under its share."""
        return ticket.priority + (0.5 if self.under_share(ticket.priority, ticket.tenant, ctx) else 0.0)

    def engine_priority(self, ticket: Ticket, ctx: Decision, rank: float | None = None) -> int:
        """The `priority` the engine gets for `ticket` (0 when the engines ignore it): its `rank` doubled."""
        if not self.engine_priorities:
            return 0
        return int(2 * (self.rank(ticket, ctx) if rank is None else rank))
