"""Slot headroom: which request may take one of a backend's concurrency slots, and when one frees.

The gateway cannot preempt a running generation, and a decode holds its slot for its whole length (~10 s
in the default profile). Strict bands and VTC order the *queue*, but once a low-priority flood (or one
heavy tenant) holds every slot, a high-priority (or light-tenant) arrival waits for the next completion —
or several, when the adaptive limit steps down below the running set. The fix is headroom, kept by rules
on who may take a slot (`slot_miss`):

- **Band reserve**: a band below the top configured priority level may take a slot only while
  `active < limit − ceil(queue.priorities.reserve_fraction · limit)`; the top band uses the whole limit.
- **Tenant share**: inside a band (where VTC shares between tenants; bands are the band reserve's
  business), a tenant already holding its weighted fair share of a backend's slots
  (`limit · weight / Σ weights of the band's tenants waiting or running in the pool`, VTC weights) leaves
  a further `ceil(fairness.reserve_fraction · limit)` slots free. A tenant alone in its band has the whole
  limit as its share, so a single tenant is never held back.
- **Step-down relief**: when the limit falls below the running set, a top-band request does not count
  the slots lower bands hold beyond their own ceiling (`limit − band reserve`) — they took them under
  the old limit and cannot take more, so the excess only drains, and the top band keeps its headroom.
Every ceiling stays ≥ 1. How fast the slots free, for predicting a slot's wait, is turnover.py's.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TypeVar

from gateway.admission.blocks import Block
from gateway.admission.decision import Decision, SlotRule
from gateway.admission.families import Ask
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket

K = TypeVar("K")


class Holdings:
    """Slots held per backend, by band and by (band, tenant) (the backend's `active` counts them all)."""

    def __init__(self) -> None:
        self._bands: dict[str, Counter[int]] = {}
        self._tenants: dict[str, Counter[tuple[int, str]]] = {}
        self._pool_tenants: Counter[tuple[int, str]] = Counter()

    def add(self, url: str, ticket: Ticket) -> None:
        bands = self._bands.get(url)
        if bands is None:  # not setdefault: that would build a Counter on every dispatch
            bands = self._bands[url] = Counter()
            self._tenants[url] = Counter()
        bands[ticket.priority] += 1
        seat = (ticket.priority, ticket.tenant)
        self._tenants[url][seat] += 1
        self._pool_tenants[seat] += 1

    def remove(self, url: str, ticket: Ticket) -> None:
        _decrement(self._bands[url], ticket.priority)
        seat = (ticket.priority, ticket.tenant)
        _decrement(self._tenants[url], seat)
        _decrement(self._pool_tenants, seat)

    def below(self, url: str, band: float) -> int:
        """Slots on `url` held by bands below `band`."""
        return sum(n for b, n in self._bands.get(url, {}).items() if b < band)

    def by_band(self, url: str) -> Mapping[int, int]:
        """Slots on `url` per band."""
        return self._bands.get(url, {})

    def of_tenant(self, url: str, band: int, tenant: str) -> int:
        held = self._tenants.get(url)
        return 0 if held is None else held[(band, tenant)]

    def in_pool(self, band: int, tenant: str) -> int:
        """Slots the tenant holds at `band` on all the pool's backends."""
        return self._pool_tenants[(band, tenant)]

    def tenants(self) -> set[tuple[int, str]]:
        """(band, tenant) of every slot held on the pool's backends."""
        return set(self._pool_tenants)


class Slots:
    """The concurrency family, a `Budget` (families.py): the slots each band and tenant holds per
    backend, and the rules on who may take one. `places`: the talker places a staged backend's speaking
    requests hold (engine_stages.py), which its limit — the thinker's — does not count."""

    lasting = True

    def __init__(self, places: Callable[[BackendState], int] | None = None) -> None:
        self.held = Holdings()
        self._places = places

    def miss(self, ask: Ask, backend: BackendState, ctx: Decision) -> Block | None:
        limit = ctx.limits[backend.url]
        if self._places is not None:
            limit += self._places(backend)
        return slot_miss(ask.ticket, backend, limit, ctx.rule, self.held)

    def margin(self, ticket: Ticket, backend: BackendState, ctx: Decision) -> int:
        """`slot_margin` under the backend's limit in `ctx`."""
        return slot_margin(ticket, backend, ctx.limits[backend.url], ctx.rule, self.held)

    def commit(self, ask: Ask, backend: BackendState, ctx: Decision) -> None:
        self.held.add(backend.url, ask.ticket)

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        self.held.remove(backend.url, ticket)


def slot_miss(
    ticket: Ticket, backend: BackendState, limit: int, rule: SlotRule, held: Holdings
) -> Block | None:
    """Why `ticket` may not take a slot on `backend` now: the limit, the band reserve or its tenant's
    share; None when it may."""
    return _shortfall(ticket, backend, limit, rule, held)[0]


def slot_margin(ticket: Ticket, backend: BackendState, limit: int, rule: SlotRule, held: Holdings) -> int:
    """Slots the rules leave `ticket` on `backend`: free ones if positive; else it needs 1 − margin
    releases there before it may take one."""
    return _shortfall(ticket, backend, limit, rule, held)[1]


def _shortfall(
    ticket: Ticket, backend: BackendState, limit: int, rule: SlotRule, held: Holdings
) -> tuple[Block | None, int]:
    occupied = backend.active
    if limit <= 0:  # a replica's share of the engine can be nothing: no rule may round it up to a slot
        return Block.CONCURRENCY, -occupied
    band_ceiling = limit - rule.band_reserve(ticket.priority, limit)
    if ticket.priority >= rule.top_band:
        lower_ceiling = limit - rule.band_reserve(-math.inf, limit)
        occupied -= max(0, held.below(backend.url, rule.top_band) - lower_ceiling)
    ceiling = band_ceiling
    if (
        rule.tenant_fraction > 0
        and held.of_tenant(backend.url, ticket.priority, ticket.tenant)
        >= rule.tenant_share(ticket.priority, ticket.tenant) * limit
    ):
        ceiling = max(1, band_ceiling - math.ceil(rule.tenant_fraction * limit))
    if occupied < ceiling:
        return None, ceiling - occupied
    reason = (
        Block.CONCURRENCY
        if occupied >= limit
        else Block.BAND_RESERVE
        if occupied >= band_ceiling
        else Block.TENANT_SHARE
    )
    return reason, ceiling - occupied


def _decrement(counts: Counter[K], key: K) -> None:
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
