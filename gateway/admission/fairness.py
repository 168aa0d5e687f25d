"""Virtual Token Counters (VTC, OSDI'24): token-fair sharing between tenants of one pool.

Each tenant has a virtual counter of the service it received: every dispatch charges
`(input_tokens·wp + output_tokens·wq) / weight`. The dispatcher serves the backlogged tenant with the
lowest counter. A tenant that becomes backlogged again is lifted to the minimum counter of the tenants
already backlogged (or, when nobody is, to the counter of the last tenant served), so idle time banks no
credit. The estimate is charged at dispatch and corrected by
the difference with the actual usage when the request ends.

Replicas that share the engines share the counters too (gateway/coordination): every change is also kept
as a pending delta, which the coordinator adds to a shared sum at each refresh (`take_pending`) and then
reads the sums back (`merge`), so a tenant's counter is its service from every replica — as of the last
refresh plus what this replica charged since.
"""

from __future__ import annotations

from collections.abc import Iterable


def token_charge(prompt_tokens: int, output_tokens: int, weight: float, wp: float, wq: float) -> float:
    return (prompt_tokens * wp + output_tokens * wq) / weight


class VirtualTokenCounters:
    def __init__(self) -> None:
        self._counters: dict[str, float] = {}
        self._last_served = 0.0
        self._pending: dict[str, float] | None = None  # shared: changes not yet in the replicas' sums

    def counter(self, tenant: str) -> float:
        return self._counters.get(tenant, 0.0)

    def lifted(self, tenant: str, backlogged: Iterable[str]) -> float:
        """The counter `tenant` gets when it becomes backlogged: at least the lowest of the others."""
        others = [self._counters.get(t, 0.0) for t in backlogged if t != tenant]
        floor = min(others) if others else self._last_served
        return max(self._counters.get(tenant, 0.0), floor)

    def on_backlogged(self, tenant: str, backlogged: Iterable[str]) -> None:
        """Lift `tenant` (just became backlogged) to the lowest counter among the other backlogged ones."""
        self._add(tenant, self.lifted(tenant, backlogged) - self._counters.get(tenant, 0.0))

    def charge(self, tenant: str, amount: float) -> None:
        """Charge at dispatch (the estimate) or at the end (actual minus estimate, may be negative)."""
        self._add(tenant, amount)

    def served(self, tenant: str) -> None:
        """Remember the counter of the tenant just picked: the floor for tenants arriving to an idle queue."""
        self._last_served = self._counters.get(tenant, 0.0)

    def share(self) -> None:
        """From now on keep every change for the replicas' shared sums (the coordinator calls it)."""
        if self._pending is None:
            self._pending = {}

    def take_pending(self) -> dict[str, float]:
        """The changes since the last call, to add to the shared sums (forgotten here: `restore` them if
        they could not be sent)."""
        pending, self._pending = self._pending or {}, {}
        return pending

    def restore(self, pending: dict[str, float]) -> None:
        """Changes `take_pending` gave that never reached the shared sums: send them next time."""
        mine = self._pending if self._pending is not None else {}
        for tenant, delta in pending.items():
            mine[tenant] = mine.get(tenant, 0.0) + delta
        self._pending = mine

    def merge(self, totals: dict[str, float]) -> None:
        """Adopt the shared sums (every replica's changes, this one's taken ones included) plus what this
        replica changed since it took them."""
        pending = self._pending or {}
        for tenant, total in totals.items():
            self._counters[tenant] = total + pending.get(tenant, 0.0)

    def _add(self, tenant: str, amount: float) -> None:
        if amount:
            self._counters[tenant] = self._counters.get(tenant, 0.0) + amount
            if self._pending is not None:
                self._pending[tenant] = self._pending.get(tenant, 0.0) + amount
