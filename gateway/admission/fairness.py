"""Virtual Token Counters (VTC, OSDI'24): token-fair sharing between tenants of one pool.

Each tenant has a virtual counter of the service it received: every dispatch charges
`(input_tokens·wp + output_tokens·wq) / weight`. The dispatcher serves the backlogged tenant with the
lowest counter. A tenant that becomes backlogged again is lifted to the minimum counter of the tenants
already backlogged (or, when nobody is, to the counter of the last tenant served), so idle time banks no
credit. The estimate is charged at dispatch and corrected by
the difference with the actual usage when the request ends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping


def token_charge(prompt_tokens: int, output_tokens: int, weight: float, wp: float, wq: float) -> float:
    return (prompt_tokens * wp + output_tokens * wq) / weight


class VirtualTokenCounters:
    def __init__(self) -> None:
        self._counters: dict[str, float] = {}
        self._last_served = 0.0

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def lifted(self, tenant: str, backlogged: Iterable[str]) -> float:
        """The counter `tenant` gets when it becomes backlogged: at least the lowest of the others."""
        others = [self._counters.get(t, 0.0) for t in backlogged if t != tenant]
        floor = min(others) if others else self._last_served
        return max(self._counters.get(tenant, 0.0), floor)

    def on_backlogged(self, tenant: str, backlogged: Iterable[str]) -> None:
        """Lift `tenant` (just became backlogged) to the lowest counter among the other backlogged ones."""
        self._counters[tenant] = self.lifted(tenant, backlogged)

    def charge(self, tenant: str, amount: float) -> None:
        """Charge at dispatch (the estimate) or at the end (actual minus estimate, may be negative)."""
        self._counters[tenant] = self._counters.get(tenant, 0.0) + amount

    def served(self, tenant: str) -> None:
        """Remember the counter of the tenant just picked: the floor for tenants arriving to an idle queue."""
        self._last_served = self._counters.get(tenant, 0.0)

    def snapshot(self) -> dict[str, float]:
        return dict(self._counters)


class RecentService:
    """Weighted tokens dispatched per tenant, decayed with time constant `window_s`: the rate view of
    service that VTC's lifted counters no longer hold (a light tenant lifted to a heavy one's counter on
    every arrival reads as just as served). `under_share` tells a tenant receiving less than the
    weighted average of the tenants present — less than its share of the pool's recent service."""

    def __init__(self) -> None:
        self._service: dict[str, tuple[float, float]] = {}  # tenant → (decayed charge, as of)
        self.version = 0  # bumped on every change, so callers may cache `totals` between changes

    def charge(
        self, tenant: str, amount: float, now: float, window_s: float, at: float | None = None
    ) -> None:
        """Add a dispatch's VTC charge (already divided by the tenant's weight); at the end, the actual
        usage's charge minus that estimate, dated `at` the dispatch so it decays as the estimate did (an
        undated correction of a long request would outweigh its long-decayed estimate)."""
        age = 0.0 if at is None else max(0.0, now - at)
        self.version += 1
        self._service[tenant] = (self.value(tenant, now, window_s) + amount * math.exp(-age / window_s), now)

    def value(self, tenant: str, now: float, window_s: float) -> float:
        value, at = self._service.get(tenant, (0.0, now))
        return value * math.exp(-max(0.0, now - at) / window_s)

    def totals(self, present: Mapping[str, float], now: float, window_s: float) -> tuple[float, float]:
        """(Σ weight · recent service, Σ weight) over `present` (tenant → weight)."""
        return sum(w * self.value(t, now, window_s) for t, w in present.items()), sum(present.values())

    def below(self, tenant: str, totals: tuple[float, float], now: float, window_s: float) -> bool:
        """Is `tenant`'s weight-normalised recent service below the weighted average `totals` (which
        count `tenant`)? Equal service is not under: two tenants served alike tie."""
        service, weight = totals
        return weight > 0 and self.value(tenant, now, window_s) < service / weight * (1 - 1e-9)

    def under_share(self, tenant: str, present: Mapping[str, float], now: float, window_s: float) -> bool:
        """Is `tenant` (in `present`, tenant → weight) below the weighted average of `present`?"""
        return self.below(tenant, self.totals(present, now, window_s), now, window_s)

    def forget(self, now: float, window_s: float) -> None:
        """Drop tenants whose service has decayed to nothing, so the map stays bounded."""
        for tenant in [t for t in self._service if self.value(t, now, window_s) < 1e-6]:
            del self._service[tenant]
            self.version += 1
