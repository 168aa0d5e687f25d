"""Virtual Token Counters (VTC, OSDI'24): token-fair sharing between tenants of one pool.

Each tenant has a virtual counter of the service it received: every dispatch charges
`(input_tokens·wp + output_tokens·wq) / weight`. The dispatcher serves the backlogged tenant with the
lowest counter. A tenant that becomes backlogged again is lifted to the minimum counter of the tenants
already backlogged (or, when nobody is, to the counter of the last tenant served), so idle time banks no
credit. The estimate is charged at dispatch and corrected by
the difference with the actual usage when the request ends.
"""

from __future__ import annotations

from collections.abc import Iterable


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
