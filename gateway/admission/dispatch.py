"""Placement: which waiting request of a pool goes to which backend now, within every budget.

The dispatcher composes the policy families, each in its own module, and asks each what it holds:
- slots.py — concurrency: a slot under the backend's limit (limits.py), less the headroom its band and
  its tenant must leave free;
- rounds.py — the round's prefill budget per backend (fixed, or metered at the engine's measured pace);
- shield.py — the prefill shield and duty spacing;
- budgets.py — the KV watermark and the modality bucket caps;
- standing.py — the rank a tenant under its share gets, and the engine priority that follows.
Every call gets the frozen `Decision` (decision.py) the scheduler built for it; the dispatcher's own
state is only what its dispatches left behind (slots held, the round, prompts not started, turnover).

Among backends that fit: the pool's placement rule (placement.py: by default where the first token is
predicted soonest, the prefix each backend is expected to hold cached counted); the traffic the shield
protects goes where the fewest prompt tokens wait for their prefill. Every prefill budget counts a prompt
less the prefix its backend is expected to hold cached (gateway/backends/prefix_index.py).

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
from gateway.admission.budgets import bucket_full, kv_miss, occupy, own_backends, vacate
from gateway.admission.decision import Decision
from gateway.admission.decode_share import PrefillSeen
from gateway.admission.placement import Placement
from gateway.admission.queue import Entry
from gateway.admission.rounds import Rounds
from gateway.admission.settings import ShieldPolicy
from gateway.admission.shield import Shield
from gateway.admission.slots import Holdings, slot_margin, slot_miss
from gateway.admission.stages import StageBook
from gateway.admission.standing import Standing
from gateway.admission.turnover import SlotTurnover
from gateway.backends.state import BackendState
from gateway.ticket import Ticket


class Dispatcher:
    def __init__(self, engine_priorities: bool = False, stages: StageBook | None = None) -> None:
        self.stages = stages  # per-stage budgets of a staged kind's backends (stages.py)
        self.holdings = Holdings()
        self.standing = Standing(self.holdings, engine_priorities)
        self.rounds = Rounds()
        self.shield = Shield()
        self.turnover: dict[str, SlotTurnover] = {}
        self.prefill_seen = PrefillSeen()  # what each request's decode shared with prefill (the duty)
        self.placement = Placement()

    def joins_round(self, entry: Entry, ctx: Decision) -> bool:
        """May `entry` go in the current round? Always, unless the round is grouped and it came late —
        then only above the round's bar: a higher band, or a tenant under its share where the round
        opened for or released only tenants at or over theirs."""
        if not self.rounds.late(entry.enqueued_at):
            return True
        return self.standing.rank(entry.ticket, ctx) > self.rounds.bar

    def shared_budget_miss(
        self,
        ticket: Ticket,
        backend: BackendState,
        ctx: Decision,
        *,
        metered: bool = True,
        round_budget: bool = True,
        loan: bool = False,
    ) -> Block | None:
        """The first shared budget `ticket` does not fit on `backend` (None: it fits): a slot
        (concurrency, band reserve, tenant share), a stage, the round's prefill, the shield, its spacing,
        the KV watermark. `metered=False` leaves out the round's prefill budget, the shield and the spacing,
        which free themselves in time; `round_budget=False` the round's budget alone (a round opened now
        has it unspent); `loan`: another pool's request, never spaced."""
        limit = ctx.limits[backend.url]
        if self.stages is not None:  # speaking requests hold the talker's places, not the thinker's slots
            limit += self.stages.speaking(backend)
        miss = slot_miss(ticket, backend, limit, ctx.rule, self.holdings)
        if miss is None and self.stages is not None:
            miss = self.stages.miss(ticket, backend)
        if miss is not None:
            return miss
        if metered:
            rank = self.standing.rank(ticket, ctx)
            prio = self.standing.engine_priority(ticket, ctx, rank)
            tokens = ticket.cost.prompt_tokens - backend.prefix.match(ticket.prefix)
            url, shield = backend.url, ctx.budgets.shield
            if round_budget and self.rounds.over_budget(url, prio, tokens, ctx.budgets):
                return Block.ROUND_PREFILL
            if self.shield.shielded(tokens, rank, url, shield, ctx.now):
                return Block.PREFILL_SHIELD
            if not loan and self.shield.spaced(tokens, rank, url, shield, ctx.now):
                return Block.SHIELD_DUTY
        return kv_miss(ticket, backend, ctx.budgets)

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
        opened now would judge it (no grouping, the round's prefill budget unspent); `metered=False`: only
        what lasts — slots, KV, buckets — not the round, the shield or the spacing."""
        if not new_round and not self.joins_round(entry, ctx):
            return {"*": Block.ROUND_GROUP}
        out: dict[str, Block] = {}
        for b in backends:
            if not b.available:
                out[b.url] = Block.UNAVAILABLE
            elif b.url in entry.exclude:
                out[b.url] = Block.EXCLUDED
            elif bucket_full(entry.ticket, b, ctx.budgets):
                out[b.url] = Block.BUCKET_CAP
            elif (
                miss := self.shared_budget_miss(
                    entry.ticket, b, ctx, metered=metered, round_budget=not new_round
                )
            ) is not None:
                out[b.url] = miss
        return out

    def place(
        self, order: Iterable[Entry], backends: Iterable[BackendState], ctx: Decision, *, loan: bool = False
    ) -> tuple[Entry, BackendState] | None:
        """The first entry in `order` that fits somewhere, and where; None when nothing may go now.
        `loan`: `order` is another pool's request (not spaced). A refusal by the shield is remembered
        (`shield.held`): a first byte may lift it."""
        usable = [b for b in backends if b.available]
        shield = ctx.budgets.shield
        for entry in order:
            if not self.joins_round(entry, ctx):
                continue
            own = own_backends(entry.ticket, entry.exclude, usable, ctx.budgets)
            if not own:
                continue
            misses = [self.shared_budget_miss(entry.ticket, b, ctx, loan=loan) for b in own]
            if any(miss is not None and miss.shield for miss in misses):
                self.shield.held = True
            fitting = [b for b, miss in zip(own, misses, strict=True) if miss is None]
            if fitting:
                rank = self.standing.rank(entry.ticket, ctx)
                if shield.tokens is not None and self.shield.on_top(rank, shield, ctx.now):
                    # its prefill starts soonest where the fewest prompts wait for theirs
                    return entry, min(
                        fitting,
                        key=lambda b: (
                            self.shield.unstarted(b.url, ctx.now),
                            b.outstanding_tokens,
                            b.active,
                            b.url,
                        ),
                    )
                placement = ctx.budgets.placement
                unstarted = functools.partial(self.shield.unstarted, now=ctx.now)
                return entry, self.placement.choose(entry.ticket, fitting, placement, unstarted)
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
        still lacking at the pool's turnover (`SlotTurnover`: each usable backend's running requests over
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
            self.stages is not None
            and own
            and all((miss := self.stages.miss(entry.ticket, b)) is not None and miss.speaking for b in own)
        ):
            return None  # it waits for a stream to end somewhere: no slot turnover predicts that
        for b in own:
            if kv_miss(entry.ticket, b, ctx.budgets) is not None:
                continue
            margins.append(slot_margin(entry.ticket, b, ctx.limits[b.url], ctx.rule, self.holdings))
            turnover = self.turnover.get(b.url)
            occupied = b.active + ctx.inbound.get(b.url, 0)  # peers' releases owed to this replica
            rate += (turnover and turnover.rate(occupied, now, max_age_s)) or 0.0
        if not margins:
            return None
        free = sum(m for m in margins if m > 0)
        if ahead < free:
            return 0.0
        lacking = ahead + 1 - free if free else ahead + min(1 - m for m in margins)
        return lacking / rate if rate > 0 else None

    def commit(
        self,
        ticket: Ticket,
        backend: BackendState,
        ctx: Decision,
        *,
        loan: bool = False,
        shield: ShieldPolicy | None = None,
    ) -> int:
        """Account a dispatch on the backend (`release` undoes exactly that) and in the round; returns its
        engine priority. A loan (another pool's request on our backend) spends the round's prefill budget
        but is not our traffic: it neither raises the round's bar nor counts as arrival pressure for the
        window. `shield`: the request is subject to the shield family (shield.py). Its prompt's chunks
        become the backend's most recent (the prefix index), and its budgets count the prompt less the
        prefix found there."""
        rank = self.standing.rank(ticket, ctx)  # as it stood when it was chosen
        prio = self.standing.engine_priority(ticket, ctx, rank)
        ticket.cost.cached_tokens = cached = backend.prefix.match(ticket.prefix)
        if ticket.prefix is not None:
            capacity = ctx.budgets.placement.index_tokens or backend.max_total_tokens
            backend.prefix.sent(ticket.prefix, cached, capacity)
            self.placement.placed(ticket, backend)
        tokens = ticket.cost.prefill_tokens
        self.shield.sent(
            ticket,
            rank,
            backend.url,
            shield=shield,
            prefill_rate=ctx.prefill_rate,
            now=ctx.now,
            loan=loan,
        )
        self.holdings.add(backend.url, ticket)
        self.turnover.setdefault(backend.url, SlotTurnover()).taken(id(ticket), ctx.now)
        if self.stages is not None:
            self.stages.commit(ticket, backend)
        occupy(backend, ticket)
        self.rounds.spend(backend.url, prio, tokens)
        self.prefill_seen.sent(backend.url, tokens)
        if not loan:
            self.rounds.count(ticket.priority, rank, tokens)
        return prio

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """Undo `commit` (on the pool that owns the backend, also for a loan) and time the freed slot."""
        vacate(backend, ticket)
        self.shield.started(backend.url, ticket)
        if self.stages is not None:
            self.stages.release(ticket, backend)
        self.holdings.remove(backend.url, ticket)
        self.turnover[backend.url].freed(id(ticket), now)
