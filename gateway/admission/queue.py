"""The queue discipline of one pool: strict priority bands → fair sharing between tenants → EDF.

`SLOQueue.ordered()` yields waiting entries in the order the dispatcher should try them: bands from the
most urgent (largest priority) down; inside a band, tenants under their fair share first (`standing`,
standing.py), then by their virtual counter (lowest first, ties by name); inside a tenant,
earliest deadline first (ties by arrival order) — except while that tenant is congested at the band
(`lifo_after_fraction`: it has had requests waiting there without a break for longer than that share of
its most urgent request's deadline budget), when its requests go newest first (adaptive LIFO). A request
queued again after a dispatch (a loan revoked) goes before its tenant's others.

Standing comes first because VTC alone lets a light tenant queue behind a heavy one: lifted to the heavy
tenant's counter on every arrival and then charged, it is often just above it, and the heavy tenant's
backlog goes first. LIFO under congestion because EDF under overload serves every request at the edge of
its deadline, where any misprediction makes it late; newest first serves most with slack to spare and
lets the deadline sweep shed the oldest, which would have been late anyway. "Without a break" (as
CoDel judges a standing queue) so that a burst which drains — a light tenant's three prompts arriving
together — keeps EDF: there the oldest is not late, and serving it last would make it so.

`projected()` replays that order dispatch by dispatch (VTC re-sorts tenants after every charge), and
`Ahead` counts along it how many requests and prefill tokens go before each entry. The queue only holds
and orders; admission checks live in shedding.py, placement in dispatch.py.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.settings import SLOClass
from gateway.request.ticket import Ticket


@dataclass(eq=False, slots=True)
class Entry:
    """One waiting request: its ticket plus what the queue orders and checks it by."""

    ticket: Ticket
    slo: SLOClass
    deadline: float
    weight: float
    enqueued_at: float
    charge: float = 0.0  # VTC charge of the estimate, made at dispatch
    seq: int = 0
    exclude: frozenset[str] = frozenset()
    requeued: bool = False  # dispatched, then taken back or failed before its first byte: admitted already
    cached: int = 0  # its prompt's prefix expected cached on the pool's best backend when it came
    judged_by_wait: bool = False  # admitted on a predicted wait, not at once: its first byte calibrates
    queued: bool = field(default=False, repr=False)

    @property
    def band(self) -> int:
        return self.ticket.priority

    @property
    def tenant(self) -> str:
        return self.ticket.tenant

    @property
    def prompt_tokens(self) -> int:
        """The prefill it is predicted to take: its prompt less the prefix expected cached."""
        return self.ticket.cost.prompt_tokens - self.cached

    @property
    def order_key(self) -> tuple[bool, float, int]:
        """Inside its tenant: one queued again goes first (it had its turn), then EDF, then arrival."""
        return (not self.requeued, self.deadline, self.seq)


class Ahead:
    """What is dispatched before an entry, counted along the `projected` order: requests and their prefill
    tokens. A request whose modality bucket is at its cap on every backend (`full`) is passed by the
    others (dispatch.py's head-of-line rule): it counts only for the requests of its own bucket."""

    def __init__(self, full: frozenset[str] = frozenset()) -> None:
        self.full = full
        # (requests, tokens) per full bucket, and under None those every entry waits for
        self._counts: dict[str | None, tuple[int, int]] = {}

    def of(self, entry: Entry) -> tuple[int, int]:
        """(requests, prefill tokens) ahead of `entry`."""
        n, tokens = self._counts.get(None, (0, 0))
        held_n, held_tokens = self._counts.get(entry.ticket.bucket, (0, 0))
        return n + held_n, tokens + held_tokens

    def add(self, entry: Entry) -> None:
        """`entry` goes before the ones still to come."""
        key = entry.ticket.bucket if entry.ticket.bucket in self.full else None
        n, tokens = self._counts.get(key, (0, 0))
        self._counts[key] = (n + 1, tokens + entry.prompt_tokens)


def effective_deadline(ticket: Ticket, slo: SLOClass) -> float:
    """The class deadline (arrival + TTFT SLO, else completion deadline) or a tighter client deadline."""
    budget = slo.deadline_budget_s
    class_deadline = ticket.arrival + budget if budget is not None else float("inf")
    return min(ticket.deadline, class_deadline)


class SLOQueue:
    def __init__(
        self, counters: VirtualTokenCounters, standing: Callable[[int, str], bool] | None = None
    ) -> None:
        self.counters = counters
        self.standing = standing or (lambda band, tenant: False)  # (band, tenant) → under its share
        self.now = -math.inf  # the congestion check's clock and threshold, as of the last decision
        self.lifo_after_fraction: float | None = None
        self._backlogged_since: dict[tuple[int, str], float] = {}  # (band, tenant) → queue non-empty since
        self._bands: dict[int, dict[str, list[Entry]]] = {}
        self._band_tokens: dict[int, int] = {}
        self._tenant_depth: dict[str, int] = {}
        self._class_depth: dict[str, int] = {}
        self._seq = 0
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def depth_of(self, tenant: str) -> int:
        """The tenant's requests waiting here."""
        return self._tenant_depth.get(tenant, 0)

    def as_of(self, now: float, lifo_after_fraction: float | None) -> None:
        """Order as of the decision at `now`, under the policy's adaptive-LIFO threshold."""
        self.now = now
        self.lifo_after_fraction = lifo_after_fraction

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
        self._backlogged_since.setdefault((entry.band, entry.tenant), entry.enqueued_at)
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
            del self._backlogged_since[(entry.band, entry.tenant)]
            if not tenants:
                del self._bands[entry.band]
        self._band_tokens[entry.band] -= entry.prompt_tokens
        if entry.band not in self._bands:  # not "tokens == 0": zero-token entries may still be queued
            del self._band_tokens[entry.band]
        _decrement(self._tenant_depth, entry.tenant)
        _decrement(self._class_depth, entry.ticket.traffic_class)
        entry.queued = False
        self._len -= 1
        return True

    def ordered(self) -> Iterator[Entry]:
        for band in sorted(self._bands, reverse=True):
            tenants = self._bands[band]
            for tenant in self._tenant_order(band, tenants):
                yield from self._service_order(tenants[tenant])

    def _tenant_order(self, band: int, tenants: dict[str, list[Entry]]) -> Iterable[str]:
        """A band's tenants in service order; a lone tenant needs no standing (the usual case at low load)."""
        if len(tenants) == 1:
            return tenants
        return sorted(tenants, key=lambda t: self._tenant_key(band, t, self.counters.counter(t)))

    def _service_order(self, entries: list[Entry]) -> list[Entry]:
        """One tenant's entries at one band (kept in EDF order) in the order they are served (LIFO under
        congestion, but those queued again, which had their turn, first)."""
        if not self.congested(entries):
            return entries
        again = next((i for i, e in enumerate(entries) if not e.requeued), len(entries))
        return entries[:again] + entries[: again - 1 if again else None : -1]

    def congested(self, entries: list[Entry]) -> bool:
        """Have these entries (one tenant's at one band, EDF-ordered) had company waiting without a break
        for longer than the LIFO threshold of the most urgent deadline budget of a class that sheds by
        deadline? (A request that is never shed, the most urgent, must not turn its company back to EDF:
        it goes last among them, as they would have without it.)"""
        fraction = self.lifo_after_fraction
        if fraction is None or len(entries) < 2:
            return False
        first = entries[0]
        if not first.slo.shed_by_deadline:
            first = next((e for e in entries if e.slo.shed_by_deadline), first)
        budget = first.slo.deadline_budget_s
        if budget is None or not first.slo.shed_by_deadline:
            return False
        since = self._backlogged_since.get((first.band, first.tenant), self.now)
        return self.now - since > fraction * budget

    def _tenant_key(self, band: int, tenant: str, counter: float) -> tuple[bool, float, str]:
        return (not self.standing(band, tenant), counter, tenant)

    def entries(self) -> list[Entry]:
        return [e for tenants in self._bands.values() for lst in tenants.values() for e in lst]

    def tenants(self) -> set[tuple[int, str]]:
        """(band, tenant) of every waiting request."""
        return {(band, tenant) for band, tenants in self._bands.items() for tenant in tenants}

    def class_depth(self, traffic_class: str) -> int:
        return self._class_depth.get(traffic_class, 0)

    def depth_by_band(self) -> dict[int, int]:
        return {band: sum(len(lst) for lst in t.values()) for band, t in sorted(self._bands.items())}

    def prefill_tokens(self, band: int | None = None) -> int:
        """Queued prompt tokens, of one band or of all."""
        return sum(self._band_tokens.values()) if band is None else self._band_tokens.get(band, 0)

    def prefill_ahead(self, entry: Entry) -> int:
        """Prefill tokens dispatched before `entry` (queued or a candidate) if nothing else arrives."""
        return self.ahead_of(entry)[1]

    def ahead_of(self, entry: Entry, full: frozenset[str] = frozenset()) -> tuple[int, int]:
        """(entries, prefill tokens) dispatched before `entry` (queued or a candidate) in the `projected`
        order, while the buckets in `full` stay at their cap (`Ahead`)."""
        ahead = Ahead(full)
        if self._len:  # a candidate alone: nothing goes first
            for e in self.projected(entry):
                if e is entry:
                    break
                ahead.add(e)
        return ahead.of(entry)

    def projected(self, candidate: Entry | None = None) -> Iterator[Entry]:
        """Waiting entries (plus an unqueued `candidate`) in the order they would be dispatched.

        Bands go strictly from the top; inside a band tenants under their share come first (their standing
        is taken as of now) and VTC is replayed on a copy of the counters (each dispatch charges the entry's
        estimate and re-sorts the tenants), so another tenant's request counts as ahead exactly when the
        order would serve it first — lower bands never count, and neither does the part
        of a heavy tenant's backlog that VTC serves after this request. A candidate whose tenant has
        nothing queued starts from the counter it will be lifted to. Budgets and future arrivals are not
        modelled: this is the queue's share of the wait, not a bound on it.
        """
        counters = {t: self.counters.counter(t) for t in self._tenant_depth}
        bands = {band: dict(tenants) for band, tenants in self._bands.items()}
        if candidate is not None and not candidate.queued:
            if candidate.tenant not in counters:
                counters[candidate.tenant] = self.counters.lifted(candidate.tenant, self._tenant_depth)
            tenants = bands.setdefault(candidate.band, {})
            own = list(tenants.get(candidate.tenant, []))
            bisect.insort(own, candidate, key=lambda e: e.order_key)
            tenants[candidate.tenant] = own
        for band in sorted(bands, reverse=True):
            tenants = {t: self._service_order(lst) for t, lst in bands[band].items()}
            key = self._tenant_key if len(tenants) > 1 else _alone  # a lone tenant's key orders nothing
            heap = [(key(band, t, counters[t]), 0) for t in tenants]
            heapq.heapify(heap)
            while heap:
                (over, _, tenant), i = heapq.heappop(heap)
                entry = tenants[tenant][i]
                yield entry
                counters[tenant] += entry.charge
                if i + 1 < len(tenants[tenant]):
                    heapq.heappush(heap, ((over, counters[tenant], tenant), i + 1))

    def newest_of_lowest_band(self, traffic_class: str, below: int) -> Entry | None:
        """The displacement victim: in the lowest band under `below`, the most recently queued entry (not
        one queued again after a dispatch: it was admitted)."""
        for band in sorted(b for b in self._bands if b < below):
            victims = [
                e
                for lst in self._bands[band].values()
                for e in lst
                if e.ticket.traffic_class == traffic_class and not e.requeued
            ]
            if victims:
                return max(victims, key=lambda e: e.seq)
        return None

    def top_band(self) -> int | None:
        return max(self._bands, default=None)

    def band_entries(self, band: int) -> list[Entry]:
        return [e for lst in self._bands.get(band, {}).values() for e in lst]

    def oldest(self, band: int | None = None) -> Entry | None:
        """The longest-waiting entry, of one band or of all."""
        entries = self.entries() if band is None else self.band_entries(band)
        return min(entries, key=lambda e: e.enqueued_at, default=None)


def _alone(band: int, tenant: str, counter: float) -> tuple[bool, float, str]:
    """The heap key of a band's only tenant: compared with nothing, so its standing is not asked."""
    return (False, counter, tenant)


def _decrement(counts: dict[str, int], key: str) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
