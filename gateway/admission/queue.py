"""The queue discipline of one pool: strict priority bands → VTC fairness between tenants → EDF.

`SLOQueue.ordered()` yields waiting entries in the order the dispatcher should try them: bands from the
most urgent (largest priority) down; inside a band, tenants by their virtual counter (lowest first, ties
by name); inside a tenant, earliest deadline first (ties by arrival order). The queue only holds and
orders; admission checks live in shedding.py, budgets in dispatch.py.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.settings import SLOClass
from gateway.ticket import Ticket


@dataclass(eq=False, slots=True)
class Entry:
    """One waiting request: its ticket plus what the queue orders and checks it by."""

    ticket: Ticket
    slo: SLOClass
    deadline: float
    weight: float
    enqueued_at: float
    seq: int = 0
    exclude: frozenset[str] = frozenset()
    queued: bool = field(default=False, repr=False)

    @property
    def band(self) -> int:
        return self.ticket.priority

    @property
    def tenant(self) -> str:
        return self.ticket.tenant

    @property
    def prompt_tokens(self) -> int:
        return self.ticket.cost.prompt_tokens

    @property
    def order_key(self) -> tuple[float, int]:
        return (self.deadline, self.seq)


def effective_deadline(ticket: Ticket, slo: SLOClass) -> float:
    """The class deadline (arrival + TTFT SLO, else completion deadline) or a tighter client deadline."""
    budget = slo.deadline_budget_s
    class_deadline = ticket.arrival + budget if budget is not None else float("inf")
    return min(ticket.deadline, class_deadline)


class SLOQueue:
    def __init__(self, counters: VirtualTokenCounters) -> None:
        self.counters = counters
        self._bands: dict[int, dict[str, list[Entry]]] = {}
        self._band_tokens: dict[int, int] = {}
        self._tenant_depth: dict[str, int] = {}
        self._class_depth: dict[str, int] = {}
        self._seq = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def stamp(self, entry: Entry) -> None:
        """Give an entry its arrival order (once), so it can be compared before it is pushed."""
        if not entry.seq:
            self._seq += 1
            entry.seq = self._seq

    def push(self, entry: Entry) -> None:
        """Queue an entry; a tenant that had nothing waiting is lifted first (VTC: no banked credit)."""
        if self._tenant_depth.get(entry.tenant, 0) == 0:
            self.counters.on_backlogged(entry.tenant, self._tenant_depth)
        self.stamp(entry)
        tenants = self._bands.setdefault(entry.band, {})
        bisect.insort(tenants.setdefault(entry.tenant, []), entry, key=lambda e: e.order_key)
        self._band_tokens[entry.band] = self._band_tokens.get(entry.band, 0) + entry.prompt_tokens
        self._tenant_depth[entry.tenant] = self._tenant_depth.get(entry.tenant, 0) + 1
        cls = entry.ticket.traffic_class
        self._class_depth[cls] = self._class_depth.get(cls, 0) + 1
        entry.queued = True
        self._len += 1

    def remove(self, entry: Entry) -> bool:
        """Take an entry out (dispatched, shed or cancelled); False if it was not queued."""
        if not entry.queued:
            return False
        tenants = self._bands[entry.band]
        lst = tenants[entry.tenant]
        i = bisect.bisect_left(lst, entry.order_key, key=lambda e: e.order_key)
        while lst[i] is not entry:
            i += 1
        del lst[i]
        if not lst:
            del tenants[entry.tenant]
            if not tenants:
                del self._bands[entry.band]
        self._band_tokens[entry.band] -= entry.prompt_tokens
        if not self._band_tokens[entry.band]:
            del self._band_tokens[entry.band]
        _decrement(self._tenant_depth, entry.tenant)
        _decrement(self._class_depth, entry.ticket.traffic_class)
        entry.queued = False
        self._len -= 1
        return True

    def ordered(self) -> Iterator[Entry]:
        for band in sorted(self._bands, reverse=True):
            tenants = self._bands[band]
            for tenant in sorted(tenants, key=lambda t: (self.counters.counter(t), t)):
                yield from tenants[tenant]

    def entries(self) -> list[Entry]:
        return [e for tenants in self._bands.values() for lst in tenants.values() for e in lst]

    def class_depth(self, traffic_class: str) -> int:
        return self._class_depth.get(traffic_class, 0)

    def depth_by_band(self) -> dict[int, int]:
        return {band: sum(len(lst) for lst in t.values()) for band, t in sorted(self._bands.items())}

    def prefill_tokens(self) -> int:
        return sum(self._band_tokens.values())

    def prefill_ahead(self, entry: Entry) -> int:
        """Prefill tokens certain to go before `entry`: higher bands, and its own tenant's earlier deadlines.

        Other tenants of the same band interleave by VTC, so their order is not known in advance; they
        are left out, which keeps the prediction optimistic (never rejects what could still make it).
        """
        ahead = sum(tokens for band, tokens in self._band_tokens.items() if band > entry.band)
        own = self._bands.get(entry.band, {}).get(entry.tenant, [])
        for other in own:
            if other is entry or other.order_key > entry.order_key:
                break
            ahead += other.prompt_tokens
        return ahead

    def newest_of_lowest_band(self, traffic_class: str, below: int) -> Entry | None:
        """The displacement victim: in the lowest band under `below`, the most recently queued entry."""
        for band in sorted(b for b in self._bands if b < below):
            victims = [
                e
                for lst in self._bands[band].values()
                for e in lst
                if e.ticket.traffic_class == traffic_class
            ]
            if victims:
                return max(victims, key=lambda e: e.seq)
        return None

    def oldest(self) -> Entry | None:
        return min(self.entries(), key=lambda e: e.enqueued_at, default=None)


def _decrement(counts: dict[str, int], key: str) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
