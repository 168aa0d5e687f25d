"""The dispatcher of one pool: which waiting request goes to which backend, within the four budgets.

A request goes to a backend only if all of these hold for that backend:
- active requests < the backend's concurrency limit (limits.py), less the headroom its band and its
  tenant must leave free (slots.py);
- prefill tokens released to it in the current round + the request's prompt ≤ the pool's prefill budget
  per round, except that a request larger than the whole budget may go alone into an empty round; under
  adaptive metering (`prefill_rate_fraction`) what a round released beyond its budget carries into the
  next rounds (less one budget per round elapsed), so the budget meters the engine's rate even for
  prompts larger than one round's budget;
- KV: max(scraped used tokens, gateway-reserved tokens) + the request's KV tokens ≤ watermark · the
  backend's max_total_tokens. The scrape lags our own dispatches and the reservation misses what others
  (or our under-estimates) hold, so the larger of the two is the occupancy. Until the first scrape tells
  max_total_tokens the KV check is off; a request may always go to a backend with nothing active;
- its modality bucket is under the bucket's cap on that backend.
A tenant holding fewer of the pool's slots at its band than its weighted fair share (`under_share`) is
served first in its band (queue.py). When the pool's engines schedule by priority (`priority_scheduling`),
each dispatch also gets an engine priority (`engine_priority`): its band, doubled, plus one while its
tenant is under its share. The engine serves its waiting requests by that value, so a light tenant's
prefill overtakes a heavy tenant's queued ones instead of waiting behind them; and the round's prefill
budget is metered per engine priority — a request counts only the prefill released (and carried) at its
engine priority and above, the part the engine runs before it.
The prefill shield: an engine forms each prefill batch from the top of its waiting queue down, as far
as its token budget goes, so a light tenant's 100-token prompt that overtakes the heavy tenant's queued
prompts still waits for them — they run in its batch (a 100-token prompt with a 4 k-token multi-image
one: ~650 ms instead of ~20). While a higher-ranked request (`rank`) was dispatched in the pool within
`shield.hold_s`, a lower-ranked one goes to a backend only if the lower-ranked prompts there whose
prefill has not started stay within `shield.tokens` with it, or none wait (`pending`: a stream until
its first byte, a whole request for its predicted prefill time). What remains is the step already in
flight, which no engine preempts: so a lower-ranked prompt too big for the shield (it goes alone) is
also spaced — after one goes to a backend, the next waits there for the first one's predicted prefill
divided by `shield.duty`, which bounds how often a higher-ranked arrival meets such a step in flight and
how long the higher-ranked streams decoding there stall for them. The traffic the shield protects (a
request at the top rank seen within `hold_s`, with lower ranks seen too) goes to the backend where the
fewest prompt tokens wait for their prefill: there its own starts soonest.
Among backends that fit: least outstanding estimated tokens (then fewest active, then URL).

Head-of-line: a request that is out only because of its own constraints (its bucket is at cap on every
backend, or it excludes the backends that have room) is skipped, so a multi_image at its cap never
blocks text. A request that is out because of shared budgets (concurrency, prefill round, KV) blocks
everything after it in the order: otherwise a stream of small requests would starve big ones forever.
A tenant held back by its share (slots.py) is skipped like an own constraint: the slot it may not take is
meant for the other tenants. So is a big lower-ranked prompt waiting for its spaced turn (`shield.duty`):
smaller prompts pass it, the time is the engine's, not theirs to wait for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from gateway.admission.fairness import RecentService
from gateway.admission.queue import Entry
from gateway.admission.settings import PoolBudgets, ShieldPolicy
from gateway.admission.slots import Holdings, SlotRule, SlotTurnover, slot_margin, slot_miss
from gateway.backends.state import BackendState
from gateway.ticket import Ticket


class Pending(NamedTuple):
    """A prompt sent to a backend whose prefill has not started (as far as the gateway can tell)."""

    ticket: Ticket
    rank: float
    tokens: int
    due: float  # a whole request's predicted prefill end; inf for a stream (until its first byte)
    revocable_until: float  # still in the engine's waiting queue until then (`Dispatcher.preempt`)


def kv_occupied(backend: BackendState) -> int:
    scraped = backend.used_tokens
    if scraped is None and backend.token_usage is not None and backend.max_total_tokens is not None:
        scraped = int(backend.token_usage * backend.max_total_tokens)
    return max(scraped or 0, backend.reserved_kv_tokens)


class Dispatcher:
    def __init__(self) -> None:
        self.round_started: float | None = None
        self.round_grouped = False
        self.round_bar = -math.inf  # highest band (`rank`) the round opened for or released
        self.round_prefill: dict[str, dict[int, int]] = {}  # backend → engine priority → tokens
        self.engine_priorities = False  # set by the scheduler: the engines serve waiting work by priority
        self.pool_slots = 0  # set by the scheduler: Σ concurrency limits of the available backends
        self.recent = RecentService()  # charged by the scheduler at dispatch
        self.now = 0.0  # the decision's time and the recent-service window, set by the scheduler
        self.share_window_s = 60.0
        self.round_dispatched: dict[int, int] = {}  # band → dispatches this round
        self.round_band_prefill: dict[int, int] = {}  # band → prefill tokens released this round
        self._rule = SlotRule()
        self._totals: dict[int, tuple[float, float]] = {}  # band → RecentService.totals of its present
        self._totals_as_of: tuple[float, float, int] | None = None
        self.holdings = Holdings()
        self.turnover: dict[str, SlotTurnover] = {}
        self.prefill_rate = math.inf  # tokens/s, set by the scheduler: a whole request's predicted prefill
        # url → id(ticket) (client request ids may repeat) → its prompt not started there
        self.pending: dict[str, dict[int, Pending]] = {}
        self.rank_seen: dict[float, float] = {}  # rank → when our own request of that rank last went
        # url → id(ticket) → when the next big lower-ranked prompt may go there after it (`spaced`)
        self.spacing: dict[str, dict[int, float]] = {}
        self.shield_held = False  # a placement was refused by the shield (a first byte may free it)

    @property
    def rule(self) -> SlotRule:
        """The slot rules of the decision, set by the scheduler from the policy before each one."""
        return self._rule

    @rule.setter
    def rule(self, rule: SlotRule) -> None:
        self._rule = rule
        self._totals_as_of = None

    def round_open(self, now: float, budgets: PoolBudgets) -> bool:
        return self.round_started is not None and now < self.round_started + budgets.round_s

    def round_ends(self, budgets: PoolBudgets) -> float | None:
        return None if self.round_started is None else self.round_started + budgets.round_s

    def recent_prefill(self, now: float, budgets: PoolBudgets, min_band: float = -math.inf) -> int:
        """Prefill tokens released at bands ≥ `min_band` by the current or just-ended round (0 after an
        idle gap of a round): the prefill demand of that priority and above. Tokens, not requests: many
        tiny dispatches are no load."""
        if self.round_started is None or now >= self.round_started + 2 * budgets.round_s:
            return 0
        return sum(n for band, n in self.round_band_prefill.items() if band >= min_band)

    def open_round(
        self,
        now: float,
        *,
        grouped: bool = False,
        top_band: float = -math.inf,
        budgets: PoolBudgets | None = None,
    ) -> None:
        """Start a round. A grouped round (under load) only releases what was waiting when it opened,
        so each round is one bounded group of prefills — except that a later arrival of a band strictly
        above everything the round opened for (`top_band`, the top waiting band) or released joins at
        once: priority never waits behind a lower band's grouping. It raises the bar, so a second arrival
        of that band waits for the next round like any other. With `budgets`, a backend's prefill released
        beyond what the rounds since the last one opened allowed is carried in as already released."""
        self.round_prefill = self._carry(now, budgets) if budgets is not None else {}
        self.round_started = now
        self.round_grouped = grouped
        self.round_bar = top_band
        self.round_dispatched = {}
        self.round_band_prefill = {}

    def _carry(self, now: float, budgets: PoolBudgets) -> dict[str, dict[int, int]]:
        """Per backend and engine priority, the prefill the last round released that the time since it
        opened (one budget per `round_s`) has not paid off: a 4000-token prompt under a 1000-token budget
        spends 4 rounds. The engine works from its highest priority down, so that is what is paid first.
        Only under adaptive metering, where a budget is the engine's measured pace and the carry is the
        time the engine needs for what it was sent; a fixed budget is a burst size (big prompts go alone)."""
        if self.round_started is None or budgets.prefill_rate_fraction is None:
            return {}
        paid = budgets.prefill_tokens_per_round * (now - self.round_started) / budgets.round_s
        paid = round(paid, 6)  # clock arithmetic (1000.1 - 1000.0) must not shift a whole token
        carried: dict[str, dict[int, int]] = {}
        for url, levels in self.round_prefill.items():
            left = paid
            for prio in sorted(levels, reverse=True):
                if levels[prio] > left:
                    carried.setdefault(url, {})[prio] = math.ceil(levels[prio] - left)
                left = max(0.0, left - levels[prio])
        return carried

    def released(self, url: str, min_priority: float = -math.inf) -> int:
        """Prefill tokens the round released (or carried) to `url` at engine priority ≥ `min_priority`."""
        return sum(n for prio, n in self.round_prefill.get(url, {}).items() if prio >= min_priority)

    def under_share(self, band: int, tenant: str) -> bool:
        """Is `tenant` under its weighted fair share at `band` of both scarce things: the pool's slots
        (the slot rule's `tenant_share` × `pool_slots`: running generations cannot be preempted) and its
        recent service in tokens (`RecentService`: the prefill a light tenant waits behind)? Such a tenant
        goes first; the others wait their turn by VTC. Off (nobody under) without tenant headroom."""
        if self.rule.tenant_fraction <= 0:
            return False
        share = self.rule.tenant_share(band, tenant) * self.pool_slots
        if self.holdings.in_pool(band, tenant) >= share:
            return False
        service, weight = self._band_totals(band)
        if tenant not in self.rule.present.get(band, {}):
            w = self.rule.weight_of(tenant)
            service += w * self.recent.value(tenant, self.now, self.share_window_s)
            weight += w
        return self.recent.below(tenant, (service, weight), self.now, self.share_window_s)

    def _band_totals(self, band: int) -> tuple[float, float]:
        """RecentService.totals of the tenants present at `band`, kept until the rule, the clock or the
        service changes: the queue ranks every tenant by `under_share` on every placement, and summing
        over all the present tenants for each would make that quadratic in tenants."""
        as_of = (self.now, self.share_window_s, self.recent.version)
        if as_of != self._totals_as_of:
            self._totals, self._totals_as_of = {}, as_of
        totals = self._totals.get(band)
        if totals is None:
            present = self.rule.present.get(band, {})
            totals = self._totals[band] = self.recent.totals(present, self.now, self.share_window_s)
        return totals

    def rank(self, ticket: Ticket) -> float:
        """The ticket's place in the pool's order across tenants: its band, plus a half while its tenant is
        under its share (queue.py serves those first in their band)."""
        return ticket.priority + (0.5 if self.under_share(ticket.priority, ticket.tenant) else 0.0)

    def engine_priority(self, ticket: Ticket, rank: float | None = None) -> int:
        """The `priority` the engine gets for `ticket` (0 when the engines ignore it): its `rank` doubled —
        the band doubled, plus one while the tenant is under its share."""
        if not self.engine_priorities:
            return 0
        return int(2 * (self.rank(ticket) if rank is None else rank))

    def joins_round(self, entry: Entry) -> bool:
        """May `entry` go in the current round? Always, unless the round is grouped and it came late —
        then only above the round's bar (`rank`): a higher band, or a tenant under its share where the
        round opened for or released only tenants at or over theirs."""
        started = self.round_started
        if not self.round_grouped or started is None or entry.enqueued_at <= started:
            return True
        return self.rank(entry.ticket) > self.round_bar

    def shared_budgets_fit(
        self, ticket: Ticket, backend: BackendState, budgets: PoolBudgets, limit: int
    ) -> bool:
        return self.shared_budget_miss(ticket, backend, budgets, limit) is None

    def shared_budget_miss(
        self,
        ticket: Ticket,
        backend: BackendState,
        budgets: PoolBudgets,
        limit: int,
        *,
        metered: bool = True,
        loan: bool = False,
    ) -> str | None:
        """The first shared budget `ticket` does not fit on `backend` (None: it fits): a slot
        ("concurrency", "band_reserve", "tenant_share"), "round_prefill", "prefill_shield", "shield_duty",
        "kv_watermark". `metered=False` leaves out the round's prefill budget, the shield and the spacing,
        which free themselves in time; `loan`: another pool's request, never spaced (see `commit`)."""
        miss = slot_miss(ticket, backend, limit, self.rule, self.holdings)
        if miss is not None:
            return miss
        rank = self.rank(ticket)
        released = self.released(backend.url, self.engine_priority(ticket, rank))
        if metered and released and released + ticket.cost.prompt_tokens > budgets.prefill_tokens_per_round:
            return "round_prefill"
        if metered and self.shielded(ticket, rank, backend, budgets.shield):
            return "prefill_shield"
        if metered and not loan and self.spaced(ticket, rank, backend, budgets.shield):
            return "shield_duty"
        return _kv_miss(ticket, backend, budgets)

    def shielded(self, ticket: Ticket, rank: float, backend: BackendState, shield: ShieldPolicy) -> bool:
        """Would `ticket` (of `rank`) load the prefill batch of a higher-ranked request: the shield is up
        (a higher rank went within `hold_s`), the lower-ranked prompts not yet started on `backend` plus
        its own exceed `shield.tokens`, and it would not be alone there (higher-ranked prompts waiting
        for their batch count too: it would join theirs)?"""
        if shield.tokens is None:
            return False
        top = self._top_rank(shield)
        if rank >= top:
            return False
        riders = self.unstarted(backend.url, below=top) + ticket.cost.prompt_tokens
        held = riders > shield.tokens and self.unstarted(backend.url) > 0
        self.shield_held |= held
        return held

    def spaced(self, ticket: Ticket, rank: float, backend: BackendState, shield: ShieldPolicy) -> bool:
        """Is `ticket` a lower-ranked prompt too big for the shield whose spaced turn on `backend` has not
        come (`shield.duty`: the last such prompt sent there, predicted prefill / duty ago)?"""
        spacing = self.spacing.get(backend.url, {}).values()  # mostly empty: no scan of the ranks then
        held = any(until > self.now for until in spacing) and self._lone(ticket, rank, shield)
        self.shield_held |= held
        return held

    def _lone(self, ticket: Ticket, rank: float, shield: ShieldPolicy) -> bool:
        """Is `ticket` (of `rank`) spaced by `shield.duty`: below the top rank seen within `hold_s`, with a
        prompt above `shield.tokens` (one that goes alone)?"""
        if shield.duty is None or shield.tokens is None or ticket.cost.prompt_tokens <= shield.tokens:
            return False
        return rank < self._top_rank(shield)

    def _recent_ranks(self, shield: ShieldPolicy) -> list[float]:
        """The ranks our own requests were dispatched at within `shield.hold_s`."""
        return [r for r, at in self.rank_seen.items() if self.now - at <= shield.hold_s]

    def _top_rank(self, shield: ShieldPolicy) -> float:
        """The highest rank dispatched within `shield.hold_s` (-inf: none)."""
        return max(self._recent_ranks(shield), default=-math.inf)

    def _on_top(self, ticket: Ticket, shield: ShieldPolicy) -> bool:
        """Is `ticket` the traffic the shield protects: at or above the top rank seen within hold_s,
        with a lower rank seen too?"""
        rank, recent = self.rank(ticket), self._recent_ranks(shield)
        return any(r < rank for r in recent) and rank >= max(recent)

    def unstarted(self, url: str, below: float = math.inf, now: float | None = None) -> int:
        """Prompt tokens sent to `url` at a rank below `below` whose prefill has not started by `now`
        (default: the decision's time)."""
        now = self.now if now is None else now
        return sum(p.tokens for p in self.pending.get(url, {}).values() if p.rank < below and p.due > now)

    def started(self, url: str, ticket: Ticket) -> None:
        """`ticket`'s prefill on `url` is done (its first byte came): it no longer rides in a new batch."""
        self.pending.get(url, {}).pop(id(ticket), None)

    def next_due(self) -> float:
        """When the next whole request's predicted prefill ends or a big lower-ranked prompt's spaced
        turn comes (a shield may fall then); inf: none."""
        dues = [p.due for waiting in self.pending.values() for p in waiting.values()]
        dues += [until for spaced in self.spacing.values() for until in spaced.values()]
        return min((t for t in dues if t > self.now), default=math.inf)

    def blocked_by(
        self,
        entry: Entry,
        backends: Iterable[BackendState],
        budgets: PoolBudgets,
        limits: Mapping[str, int],
        *,
        new_round: bool = False,
    ) -> dict[str, str]:
        """Why `entry` is not going to each backend now, for ops (empty: nothing stops it). `new_round`:
        as a round opened now would judge it (no grouping, the round's prefill budget unspent)."""
        if not new_round and not self.joins_round(entry):
            return {"*": "round_group"}
        cap = budgets.bucket_caps.get(entry.ticket.bucket)
        out: dict[str, str] = {}
        for b in backends:
            if not b.available:
                out[b.url] = "unavailable"
            elif b.url in entry.exclude:
                out[b.url] = "excluded"
            elif cap is not None and b.bucket_active.get(entry.ticket.bucket, 0) >= cap:
                out[b.url] = "bucket_cap"
            elif (
                miss := self.shared_budget_miss(
                    entry.ticket, b, budgets, limits[b.url], metered=not new_round
                )
            ) is not None:
                out[b.url] = miss
        return out

    def place(
        self,
        order: Iterable[Entry],
        backends: Iterable[BackendState],
        budgets: PoolBudgets,
        limits: Mapping[str, int],
        *,
        loan: bool = False,
    ) -> tuple[Entry, BackendState] | None:
        """The first entry in `order` that fits somewhere, and where; None when nothing may go now.
        `loan`: `order` is another pool's request (not spaced, see `commit`)."""
        usable = [b for b in backends if b.available]
        for entry in order:
            if not self.joins_round(entry):
                continue
            own = _own_backends(entry, usable, budgets)
            if not own:
                continue
            misses = [
                self.shared_budget_miss(entry.ticket, b, budgets, limits[b.url], loan=loan) for b in own
            ]
            fitting = [b for b, miss in zip(own, misses, strict=True) if miss is None]
            if fitting:
                if budgets.shield.tokens is not None and self._on_top(entry.ticket, budgets.shield):
                    # its prefill starts soonest where the fewest prompts wait for theirs
                    return entry, min(
                        fitting, key=lambda b: (self.unstarted(b.url), b.outstanding_tokens, b.active, b.url)
                    )
                return entry, min(fitting, key=lambda b: (b.outstanding_tokens, b.active, b.url))
            if any(miss not in ("tenant_share", "shield_duty") for miss in misses):
                return None
        return None

    def slot_wait(
        self,
        entry: Entry,
        backends: Iterable[BackendState],
        budgets: PoolBudgets,
        limits: Mapping[str, int],
        now: float,
        max_age_s: float,
        ahead: int = 0,
    ) -> float | None:
        """Seconds until a backend could take `entry` by every budget but the round's prefill budget
        (which frees itself within `round_s`), with `ahead` requests to be placed before it: 0.0 when the
        slots its rules leave free (over the backends it may use) cover them and it; else the releases
        still lacking at the pool's recent turnover (`SlotTurnover`: the backends' release rates add up);
        None when nothing can be predicted (KV full, no recent releases, own constraints). What the guard
        asks before refusing a request by prediction: past the head, slots — not prefill — are what a
        tenant held to its share, or any request when decodes fill every slot, waits for."""
        margins: list[int] = []
        rate = 0.0
        for b in _own_backends(entry, [b for b in backends if b.available], budgets):
            if _kv_miss(entry.ticket, b, budgets) is not None:
                continue
            margins.append(slot_margin(entry.ticket, b, limits[b.url], self.rule, self.holdings))
            turnover = self.turnover.get(b.url)
            gap = None if turnover is None else turnover.gap(now, max_age_s)
            rate += 1 / gap if gap else 0.0
        if not margins:
            return None
        free = sum(m for m in margins if m > 0)
        if ahead < free:
            return 0.0
        lacking = ahead + 1 - free if free else ahead + min(1 - m for m in margins)
        return lacking / rate if rate > 0 else None

    def preempt(self, ticket: Ticket, backend: BackendState, shield: ShieldPolicy) -> list[Ticket]:
        """The lower-ranked prompts to take back from `backend` before `ticket` (the traffic the shield
        protects) goes there, biggest first, until those left waiting there fit `shield.tokens`: the
        engine would run them in `ticket`'s prefill batch. Only prompts sent within `shield.revoke_s` to
        a busy engine qualify: those still wait for the engine's current step (a decode step, tens of ms)
        to end, so the engine drops them at no cost (SGLang's abort of a queued request); an older one
        may be in its prefill step, which an abort would waste without speeding `ticket` up. A prompt is
        taken back once at most. Call before `commit`; they leave `pending` (and the backend's spacing:
        they never ran) at once."""
        if shield.tokens is None or shield.revoke_s is None or not self._on_top(ticket, shield):
            return []
        rank, waiting = self.rank(ticket), self.pending.get(backend.url, {})
        movable = [p for p in waiting.values() if p.rank < rank and p.due > self.now]
        left = sum(p.tokens for p in movable)  # what `unstarted(below=rank)` counts
        victims: list[Ticket] = []
        for p in sorted(movable, key=lambda p: -p.tokens):
            if left <= shield.tokens:
                break
            if p.revocable_until > self.now and not p.ticket.preempted:
                p.ticket.preempted = True
                victims.append(p.ticket)
                left -= p.tokens
                del waiting[id(p.ticket)]
                self.spacing.get(backend.url, {}).pop(id(p.ticket), None)  # it never ran
        return victims

    def commit(
        self, ticket: Ticket, backend: BackendState, *, loan: bool = False, shield: ShieldPolicy | None = None
    ) -> int:
        """Account a dispatch on the backend (`release` undoes exactly that) and in the round; returns its
        engine priority. A loan (another pool's request on our backend) spends the round's prefill budget
        but is not our traffic: it neither raises the round's bar nor counts as arrival pressure for the
        window. `shield`: the request can be taken back (`preempt`) for `shield.preempt_s` if the backend
        is busy, and a big lower-ranked prompt of our own starts the backend's spacing (`spaced`). Loans
        are neither spaced nor space ours: they run only below the lender's `max_load` and are given
        back as soon as its own requests wait — spacing them too cost the offline pool 15 points of the
        capacity left over in the benchmark's lending run (79–83 % instead of 96–97 %), for no
        interactive gain (100 % either way)."""
        cost = ticket.cost
        rank = self.rank(ticket)  # as it stood when it was chosen
        prio = self.engine_priority(ticket, rank)
        revoke_s = None if shield is None else shield.preempt_s
        revocable_until = self.now + revoke_s if revoke_s is not None and backend.active else -math.inf
        if shield is not None and not loan and self._lone(ticket, rank, shield):
            assert shield.duty is not None  # _lone
            spaced = self.spacing.setdefault(backend.url, {})
            for key in [key for key, until in spaced.items() if until <= self.now]:
                del spaced[key]
            spaced[id(ticket)] = self.now + cost.prompt_tokens / self.prefill_rate / shield.duty
        self.holdings.add(backend.url, ticket)
        backend.active += 1
        backend.outstanding_tokens += cost.total_tokens
        backend.reserved_kv_tokens += cost.total_tokens
        backend.bucket_active[ticket.bucket] = backend.bucket_active.get(ticket.bucket, 0) + 1
        levels = self.round_prefill.setdefault(backend.url, {})
        levels[prio] = levels.get(prio, 0) + cost.prompt_tokens
        # a stream's prefill ends with its first byte (`started`); a whole request's only by prediction
        due = math.inf if ticket.stream else self.now + cost.prompt_tokens / self.prefill_rate
        pending = Pending(ticket, rank, cost.prompt_tokens, due, revocable_until)
        self.pending.setdefault(backend.url, {})[id(ticket)] = pending
        if loan:
            return prio
        self.rank_seen[rank] = self.now
        band = ticket.priority
        self.round_dispatched[band] = self.round_dispatched.get(band, 0) + 1
        self.round_band_prefill[band] = self.round_band_prefill.get(band, 0) + cost.prompt_tokens
        self.round_bar = max(self.round_bar, rank)
        return prio

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """Undo `commit` (on the pool that owns the backend, also for a loan) and time the freed slot."""
        release(ticket, backend)
        self.started(backend.url, ticket)
        self.holdings.remove(backend.url, ticket)
        self.turnover.setdefault(backend.url, SlotTurnover()).released(now)


def _kv_miss(ticket: Ticket, backend: BackendState, budgets: PoolBudgets) -> str | None:
    total = backend.max_total_tokens
    if total is None or backend.active == 0:
        return None
    if kv_occupied(backend) + ticket.cost.total_tokens > budgets.kv_watermark * total:
        return "kv_watermark"
    return None


def _own_backends(entry: Entry, usable: list[BackendState], budgets: PoolBudgets) -> list[BackendState]:
    """The usable backends `entry`'s own constraints allow: not excluded, its bucket under its cap."""
    bucket = entry.ticket.bucket
    cap = budgets.bucket_caps.get(bucket)
    return [
        b
        for b in usable
        if b.url not in entry.exclude and (cap is None or b.bucket_active.get(bucket, 0) < cap)
    ]


def backend_load(backend: BackendState, limit: int, budgets: PoolBudgets) -> float:
    """How full a backend is, 0..1+: the larger of active / limit and KV occupancy / watermark."""
    load = backend.active / limit
    if backend.max_total_tokens:
        load = max(load, kv_occupied(backend) / (budgets.kv_watermark * backend.max_total_tokens))
    return load


def release(ticket: Ticket, backend: BackendState) -> None:
    cost = ticket.cost
    backend.active -= 1
    backend.outstanding_tokens -= cost.total_tokens
    backend.reserved_kv_tokens -= cost.total_tokens
    left = backend.bucket_active[ticket.bucket] - 1
    if left:
        backend.bucket_active[ticket.bucket] = left
    else:
        del backend.bucket_active[ticket.bucket]
