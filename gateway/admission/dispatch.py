"""Placement: which waiting request of a pool goes to which backend now, within every budget.

The dispatcher composes the policy families, each in its own module, through their contracts
(families.py), in this declared order — the first budget a request misses is the reason it waits:
- slots.py — concurrency: a slot under the backend's limit (limits/), less the headroom its band and
  its tenant must leave free;
- engine_stages.py — a staged backend's stage budgets (only for a staged kind);
- rounds.py — the round's prefill budget per backend (fixed, or metered at the engine's measured pace);
- shield.py — the prefill shield and duty spacing;
- budgets.py — the KV watermark, and the dispatch's hold on the backend's accounting;
then the tallies that never refuse: turnover.py (hold times) and decode_share.py (prefill seen while a
request decodes). standing.py gives each request its rank and engine priority (`Ask`); the modality
bucket caps and exclusions are the request's own constraints (budgets.own_backends).
Every call gets the frozen `Decision` (decision.py) the scheduler built for it; the dispatcher's own
state is only what its dispatches left behind (slots held, the round, prompts not started, turnover).

Among backends that fit: the pool's placement rule (placement.py: by default where the first token is
predicted soonest, the prefix each backend is expected to hold cached counted); the traffic the shield
protects goes where the fewest prompt tokens wait for their prefill. Every prefill budget counts a prompt
less the prefix its backend is expected to hold cached (gateway/backends/prefix_index.py, `Ask.prefill`).

Head-of-line: a request that is out only because of its own constraints (its bucket is at cap on every
backend, or it excludes the backends that have room) is skipped, so a multi_image at its cap never
blocks text. A request that is out because of shared budgets (concurrency, prefill round, KV, shield)
blocks everything after it in the order: otherwise a stream of small requests would starve big ones
forever. A tenant held back by its share (slots.py) is skipped like an own constraint: the slot it may
not take is meant for the other tenants. So is a big lower-ranked prompt waiting for its spaced turn:
smaller prompts pass it, the time is the engine's, not theirs to wait for.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from gateway.admission.blocks import Block
from gateway.admission.budgets import Occupancy, bucket_full, kv_miss, own_backends
from gateway.admission.decision import Decision
from gateway.admission.decode_share import PrefillSeen
from gateway.admission.engine_stages import StageBook
from gateway.admission.families import Ask, Budget, FirstByte, Tally
from gateway.admission.placement import Placement
from gateway.admission.queue import Entry
from gateway.admission.rounds import Rounds
from gateway.admission.settings import PoolBudgets, ShieldPolicy
from gateway.admission.shield import Shield
from gateway.admission.slots import Slots
from gateway.admission.standing import RecentService, Standing
from gateway.admission.turnover import Turnover
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket


class Dispatcher:
    def __init__(
        self,
        engine_priorities: bool = False,
        stages: StageBook | None = None,
        recent: RecentService | None = None,
    ) -> None:
        """`stages`: a staged kind's stage budgets; `recent`: the tenants' recent service, which the
        scheduler charges (standing reads it)."""
        self._stages = stages  # per-stage budgets of a staged kind's backends (engine_stages.py)
        self._slots = Slots(None if stages is None else stages.speaking)
        recent = RecentService() if recent is None else recent
        self._standing = Standing(self._slots.held, recent, engine_priorities)
        self._rounds = Rounds()
        self._shield = Shield()
        self._turnover = Turnover()
        self._prefill_seen = PrefillSeen()  # what each request's decode shared with prefill (the duty)
        staged: tuple[StageBook, ...] = () if stages is None else (stages,)
        self._budgets: tuple[Budget, ...] = (self._slots, *staged, self._rounds, self._shield, Occupancy())
        self._lasting = tuple(b for b in self._budgets if b.lasting)
        self._unshielded = tuple(b for b in self._budgets if b is not self._shield)  # a rush's budgets
        self._tallies: tuple[Tally, ...] = (*self._budgets, self._turnover, self._prefill_seen)
        self._first_byte: tuple[FirstByte, ...] = (self._shield, self._prefill_seen, *staged)
        self._placement = Placement()
        self._chosen: tuple[Decision, Ask] | None = None  # what `place` last chose by, for its `commit`

    # -- placement ---------------------------------------------------------------------------------

    def ask(self, ticket: Ticket, ctx: Decision, *, loan: bool = False, new_round: bool = False) -> Ask:
        """`ticket` as placement weighs it under `ctx`: its rank and engine priority as they stand now."""
        rank = self._standing.rank(ticket, ctx)
        prio = self._standing.engine_priority(ticket, ctx, rank)
        return Ask(ticket, rank, prio, loan=loan, new_round=new_round)

    def shared_budget_miss(
        self, ask: Ask, backend: BackendState, ctx: Decision, *, metered: bool = True
    ) -> Block | None:
        """The first shared budget `ask` does not fit on `backend`, in the families' declared order (None:
        it fits). `metered=False` asks only the lasting ones (slots, stages, KV), not those that free
        themselves in time (the round's prefill, the shield and its spacing)."""
        return _first_miss(self._budgets if metered else self._lasting, ask, backend, ctx)

    def blocked_by(
        self,
        entry: Entry,
        backends: Iterable[BackendState],
        ctx: Decision,
        *,
        new_round: bool = False,
        metered: bool = True,
    ) -> dict[str, Block]:
        """Why `entry` is not going to each backend now (empty: nothing stops it). `new_round`: as a round
        opened now would judge it (the round's prefill budget unspent); `metered=False`: only what lasts —
        slots, KV, buckets — not the round, the shield or the spacing."""
        ask = self.ask(entry.ticket, ctx, new_round=new_round)
        out: dict[str, Block] = {}
        for b in backends:
            if not b.available:
                out[b.url] = Block.UNAVAILABLE
            elif b.url in entry.exclude:
                out[b.url] = Block.EXCLUDED
            elif bucket_full(entry.ticket, b, ctx.budgets):
                out[b.url] = Block.BUCKET_CAP
            elif (miss := self.shared_budget_miss(ask, b, ctx, metered=metered)) is not None:
                out[b.url] = miss
        return out

    def place(
        self,
        order: Iterable[Entry],
        backends: Iterable[BackendState],
        ctx: Decision,
        *,
        loan: bool = False,
        paced: bool = True,
    ) -> tuple[Entry, BackendState] | None:
        """The first entry in `order` that fits somewhere, and where; None when nothing may go now.
        `loan`: `order` is another pool's request (not spaced). `paced=False` (a rushed request,
        scheduler.py): neither the shield nor its spacing holds it — only the slots, stages, KV and the
        round's prefill budget. A refusal by the shield is remembered (`held`):
        a first byte may lift it. The chosen request's `Ask` is kept for its `commit` under the same
        decision: nothing between the two changes its standing, so it is not weighed twice."""
        self._chosen = None
        usable = [b for b in backends if b.available]
        shield = ctx.budgets.shield
        for entry in order:
            own = own_backends(entry.ticket, entry.exclude, usable, ctx.budgets)
            if not own:
                continue
            ask = self.ask(entry.ticket, ctx, loan=loan)
            budgets = self._budgets if paced else self._unshielded
            misses = [_first_miss(budgets, ask, b, ctx) for b in own]
            if any(miss is not None and miss.shield for miss in misses):
                self._shield.held = True
            fitting = [b for b, miss in zip(own, misses, strict=True) if miss is None]
            if fitting:
                self._chosen = (ctx, ask)
                if len(fitting) == 1:  # nothing to choose between (both rules below only order backends)
                    return entry, fitting[0]
                if shield.tokens is not None and self._shield.on_top(ask.rank, shield, ctx.now):
                    # its prefill starts soonest where the fewest prompts wait for theirs
                    return entry, min(
                        fitting,
                        key=lambda b: (
                            self._shield.unstarted(b.url, ctx.now),
                            b.outstanding_tokens,
                            b.active,
                            b.url,
                        ),
                    )
                placement = ctx.budgets.placement
                unstarted = functools.partial(self._shield.unstarted, now=ctx.now)
                return entry, self._placement.choose(entry.ticket, fitting, placement, unstarted)
            if any(miss is not None and not miss.passable for miss in misses):
                return None
        return None

    def slot_wait(
        self,
        entry: Entry,
        backends: Iterable[BackendState],
        ctx: Decision,
        now: float,
        max_age_s: float,
        ahead: int = 0,
    ) -> float | None:
        """Seconds until a backend could take `entry` by every budget but the round's prefill budget
        (which frees itself within `round_s`), with `ahead` requests to be placed before it: 0.0 when the
        slots its rules leave free (over the backends it may use) cover them and it; else the releases
        still lacking at the pool's turnover (`Turnover`: each usable backend's running requests over
        its mean hold time, the rates adding up — a backend marked unavailable adds nothing; with
        replicas, the peers' running requests count too while their releases are owed to this one);
        None when nothing can be predicted (KV full, no recent releases, own constraints, a speaking stage
        full everywhere). What the guard asks before refusing a request by prediction: past the head,
        slots — not prefill — are what a tenant held to its share, or any request when decodes fill every
        slot, waits for."""
        margins: list[int] = []
        rate = 0.0
        usable = [b for b in backends if b.available]
        own = own_backends(entry.ticket, entry.exclude, usable, ctx.budgets)
        if (
            self._stages is not None
            and own
            and all((miss := self._stages.full(entry.ticket, b)) is not None and miss.speaking for b in own)
        ):
            return None  # it waits for a stream to end somewhere: no slot turnover predicts that
        for b in own:
            if kv_miss(entry.ticket, b, ctx.budgets) is not None:
                continue
            margins.append(self._slots.margin(entry.ticket, b, ctx))
            occupied = b.active + ctx.inbound.get(b.url, 0)  # peers' releases owed to this replica
            rate += self._turnover.rate(b.url, occupied, now, max_age_s) or 0.0
        if not margins:
            return None
        free = sum(m for m in margins if m > 0)
        if ahead < free:
            return 0.0
        lacking = ahead + 1 - free if free else ahead + min(1 - m for m in margins)
        return lacking / rate if rate > 0 else None

    def commit(self, ticket: Ticket, backend: BackendState, ctx: Decision, *, loan: bool = False) -> int:
        """Account a dispatch with every family (`release` undoes exactly that); returns its engine
        priority. A loan (another pool's request on our backend) spends the round's prefill budget but is
        not our traffic: it is not counted among the round's dispatches, is never spaced and never counts
        as a rank seen by the shield. Its prompt's chunks become the backend's most recent (the prefix
        index), and the families count the prompt less the prefix found there (`cost.prefill_tokens`)."""
        chosen, self._chosen = self._chosen, None
        if chosen is not None and chosen[0] is ctx and chosen[1].ticket is ticket and chosen[1].loan == loan:
            ask = chosen[1]  # as `place` weighed it under this decision
        else:
            ask = self.ask(ticket, ctx, loan=loan)  # as it stands when it is chosen
        ticket.cost.cached_tokens = cached = backend.prefix.match(ticket.prefix)
        if ticket.prefix is not None:
            capacity = ctx.budgets.placement.index_tokens or backend.max_total_tokens
            backend.prefix.sent(ticket.prefix, cached, capacity)
            self._placement.placed(ticket, backend)
        for tally in self._tallies:
            tally.commit(ask, backend, ctx)
        return ask.engine_priority

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """Undo `commit` with every family (on the pool that owns the backend, also for a loan), and time
        the freed slot."""
        self._chosen = None  # a slot freed: standing may change
        for tally in self._tallies:
            tally.release(ticket, backend, now)

    def started(self, ticket: Ticket, url: str, now: float) -> None:
        """`ticket`'s first byte came from `url`: its prefill is done (every `FirstByte` family)."""
        for family in self._first_byte:
            family.started(ticket, url, now)

    def decode_share(self, ticket: Ticket, now: float, rate: float) -> float | None:
        """The share of `ticket`'s decode its engine spent on prefill (decode_share.py; once, at its end)."""
        return self._prefill_seen.share(ticket, now, rate)

    # -- rounds ------------------------------------------------------------------------------------

    @property
    def rounds(self) -> Rounds:
        """The current round, to read (`/admin/state`); only the dispatcher's own methods change it."""
        return self._rounds

    def round_open(self, now: float, budgets: PoolBudgets) -> bool:
        return self._rounds.is_open(now, budgets)

    def open_round(self, now: float, budgets: PoolBudgets | None = None) -> None:
        """Start a round (rounds.py: `Rounds.open`), carrying what the last one released beyond its budget."""
        self._rounds.open(now, budgets)

    def round_ends(self, budgets: PoolBudgets) -> float | None:
        return self._rounds.ends(budgets)

    # -- the shield --------------------------------------------------------------------------------

    @property
    def shield(self) -> Shield:
        """The shield family's state, to read (`/admin/state`); only the dispatcher's methods change it."""
        return self._shield

    def begin_pass(self) -> None:
        """A dispatch pass begins: forget that the last one was held by the shield."""
        self._shield.rearm()

    @property
    def held(self) -> bool:
        """A placement was refused by the shield family since the pass began: a first byte may lift it."""
        return self._shield.held

    def next_due(self, now: float) -> float:
        """When a held placement may go with no first byte: a predicted prefill ends, a spaced turn comes."""
        return self._shield.next_due(now)

    def own_top(self, shield: ShieldPolicy, now: float) -> float | None:
        """The top rank this pool dispatched within the shield's hold: what replicas tell each other."""
        return self._shield.own_top(shield, now)

    def above_peers(self, shield: ShieldPolicy, now: float) -> bool:
        """Is this pool's top rank above the peers' last reported one (shield.py)?"""
        return self._shield.above_peers(shield, now)

    def peers(self, rank: float | None, until: float) -> None:
        """The peers' top rank within their hold (None: none), counted as seen until `until`."""
        self._shield.peers(rank, until)

    # -- standing and slots ------------------------------------------------------------------------

    def under_share(self, band: int, tenant: str, ctx: Decision) -> bool:
        """Is `tenant` under its weighted fair share at `band` (standing.py)? The queue orders by it."""
        return self._standing.under_share(band, tenant, ctx)

    def seated(self) -> set[tuple[int, str]]:
        """(band, tenant) of every slot held on the pool's backends."""
        return self._slots.held.tenants()

    def held_by_band(self, url: str) -> dict[int, int]:
        """Slots on `url` per band."""
        return dict(self._slots.held.by_band(url))


def _first_miss(budgets: Iterable[Budget], ask: Ask, backend: BackendState, ctx: Decision) -> Block | None:
    """The first of `budgets` that `ask` misses on `backend` (None: it fits them all)."""
    for budget in budgets:
        miss = budget.miss(ask, backend, ctx)
        if miss is not None:
            return miss
    return None
