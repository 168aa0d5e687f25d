"""The anyio shell of one pool: requests wait here until the dispatcher gives them a backend.

Dispatch happens on events: every `acquire`, every lease release and `pump()` (the lead calls it when
backend health or scrapes change) run the pure dispatcher at once. `run()` is a small timer task for
what no event announces: a window or round that opens later, and the periodic re-check that sheds
requests that can no longer meet their deadline. Policy is read through `policy_getter()` at every
decision, so a reload applies to new decisions while queued and running requests keep the class SLO
they were admitted with.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio

from gateway.admission.dispatch import Dispatcher, backend_load
from gateway.admission.fairness import VirtualTokenCounters, token_charge
from gateway.admission.lease import DROP_OUTCOMES, Lease, Waiter
from gateway.admission.limits import Limit, Sample, latency_ratio, make_limit
from gateway.admission.queue import Entry, SLOQueue, effective_deadline
from gateway.admission.settings import PoolBudgets
from gateway.admission.shedding import PrefillRate, QueueGuard, SlotWait, displaced_error
from gateway.admission.slots import SlotRule
from gateway.admission.state import pool_snapshot
from gateway.admission.window import BatchWindow, QueueLoad, under_load
from gateway.backends.state import BackendState
from gateway.errors import ApiError, ErrorCode
from gateway.policy import Policy
from gateway.ticket import Outcome, Ticket, Usage

__all__ = ["DROP_OUTCOMES", "Lease", "PoolScheduler"]  # Lease and DROP_OUTCOMES live in lease.py

_RECLAIMABLE = frozenset({"concurrency", "band_reserve", "tenant_share", "kv_watermark", "bucket_cap"})
"""Why a request waits that a loan on the backend may be the cause of (not the round, the window...)."""


class PoolScheduler:
    """One pool's queue, dispatcher, window and limits; `acquire` returns a `Lease` on a backend."""

    def __init__(
        self,
        pool: str,
        backends: list[BackendState],
        policy_getter: Callable[[], Policy],
        *,
        clock: Callable[[], float] = time.monotonic,
        weight_of: Callable[[str], float | None] | None = None,
        engine_priorities: bool = False,
    ) -> None:
        self.pool = pool
        self.backends = backends
        self.policy_getter = policy_getter
        self.clock = clock
        self.weight_of = weight_of
        policy = policy_getter()
        self.counters = VirtualTokenCounters()
        self.dispatcher = Dispatcher()
        self.dispatcher.engine_priorities = engine_priorities
        self.queue = SLOQueue(self.counters, standing=self.dispatcher.under_share)
        self.rate = PrefillRate(policy.queue)
        self.guard = QueueGuard(self.queue, self.rate, pool, slot_wait=self._slot_wait)
        self.window = BatchWindow()
        self.limits: dict[str, Limit] = {}
        self._waiters: dict[Entry, Waiter] = {}
        self._leases: set[Lease] = set()
        self._next_wake = math.inf
        self._next_sweep = -math.inf
        self._wake = anyio.Event()
        self._lender: PoolScheduler | None = None
        self._top_seen = -math.inf  # when a top-band request last arrived (the band reserve's hold)
        self._metered: tuple[PoolBudgets, int, PoolBudgets] | None = None  # (budgets, tokens, their copy)
        self._loans: list[Lease] = []  # another pool's requests on our backends, oldest first
        self.lent = 0  # this pool's backends running another pool's requests
        self.borrowed = 0  # this pool's requests running on a lender's backends
        self.preempted = 0  # requests taken back from a backend for higher-ranked work (`_preempt`)
        self._sync_limits(policy)

    @property
    def rejections(self) -> dict[tuple[str, str], int]:
        """Refusals by (reason, traffic class), for the lead's metrics."""
        return self.guard.rejections

    @property
    def in_flight(self) -> int:
        return len(self._leases)

    async def acquire(self, ticket: Ticket, *, exclude: Iterable[str] = (), requeued: bool = False) -> Lease:
        """Wait until `ticket` is dispatched; raises ApiError when refused, shed or displaced. `requeued`:
        it was dispatched and taken back (a loan revoked, a prompt preempted) — admitted already, it is
        neither refused nor shed nor displaced again."""
        policy = self.policy_getter()
        slo = policy.queue.classes.get(ticket.traffic_class)
        if slo is None:
            raise ApiError(
                400,
                f"Unknown traffic class {ticket.traffic_class!r}.",
                code=ErrorCode.INVALID_TRAFFIC_CLASS,
                param="x-omnigate-class",
            )
        excluded = frozenset(exclude)
        if all(b.url in excluded for b in self.backends):
            self.guard.rejections[(ErrorCode.NO_BACKEND, ticket.traffic_class)] += 1
            raise ApiError(
                503,
                f"No backend of pool {self.pool} left to try.",
                code=ErrorCode.NO_BACKEND,
                retry_after=1.0,
            )
        now = self.clock()
        top = policy.queue.priorities.top
        if top is not None and ticket.priority >= top:
            self._top_seen = now
        weight = self._weight(policy, ticket.tenant)
        fair = policy.fairness
        cost = ticket.cost
        charge = token_charge(
            cost.prompt_tokens, cost.expected_output_tokens, weight, fair.input_weight, fair.output_weight
        )
        deadline = effective_deadline(ticket, slo)
        entry = Entry(ticket, slo, deadline, weight, now, charge, exclude=excluded, requeued=requeued)
        self.rate.configure(policy.queue)
        victim = self.guard.admit(entry, now, self._available())
        waiter = self._waiters[entry] = Waiter(anyio.Event())
        if victim is not None:
            self._fail(victim, displaced_error())
        self.pump()
        try:
            await waiter.event.wait()
        except BaseException:
            self._abandon(entry, waiter)
            raise
        if waiter.error is not None:
            raise waiter.error
        assert waiter.lease is not None
        return waiter.lease

    def lend_to(self, borrower: PoolScheduler) -> None:
        """Let `borrower` (the offline pool) run requests on this pool's backends while this pool's
        `budgets.lend` policy allows (off by default): see `lend`."""
        borrower._lender = self

    def lend(self, entry: Entry, now: float) -> tuple[BackendState, int] | None:
        """A backend of this pool for a borrower's request, already accounted, and the request's engine
        priority there; or None. A loan starts only while lending is enabled, none of this pool's own
        requests wait, and a backend is below `lend.max_load` and fits this pool's budgets (the loan
        spends this pool's round prefill budget). Once our requests wait, `_reclaim` takes loans back."""
        policy = self.policy_getter()
        if not policy.budgets.for_pool(self.pool).lend.enabled or self.queue:
            return None
        budgets, limits = self.decision(policy, (entry.band, entry.tenant))
        idle = [b for b in self.backends if backend_load(b, limits[b.url], budgets) < budgets.lend.max_load]
        if not self.dispatcher.round_open(now, budgets):
            self.dispatcher.open_round(now, budgets=budgets)
        placed = self.dispatcher.place([entry], idle, budgets, limits, loan=True)
        if placed is None:
            return None
        backend = placed[1]
        prio = self.dispatcher.commit(entry.ticket, backend, loan=True, shield=budgets.shield)
        self.lent += 1
        return backend, prio

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """Feed one observed prefill (prompt tokens, seconds to first token) to the pool's rate estimate."""
        self.rate.configure(self.policy_getter().queue)
        self.rate.observe(tokens, seconds, self.clock())

    def pump(self) -> None:
        """Shed what must go, then dispatch everything the window, rounds and budgets allow right now."""
        policy = self.policy_getter()
        now = self.clock()
        self.rate.configure(policy.queue)
        if self.queue and now >= self._next_sweep:
            for entry, err in self.guard.sweep(now, self._available(), self._sweep_slot_wait(policy)):
                self._fail(entry, err)
            self._next_sweep = now + policy.queue.recheck_interval_s
            self.dispatcher.recent.forget(now, policy.fairness.share_window_s)
        budgets, limits = self.decision(policy)
        wake = math.inf
        self.dispatcher.shield_held = False
        while self.queue:
            if not self.dispatcher.round_open(now, budgets):
                load = self.window_load(now, budgets)
                opens = self.window.opens_at(self.pool, load, policy.window)
                if opens > now:
                    wake = opens
                    break
                grouped = under_load(self.pool_level(now, budgets), policy.window)
                self.dispatcher.open_round(now, grouped=grouped, top_band=load.band, budgets=budgets)
            placed = self.dispatcher.place(self.queue.ordered(), self.backends, budgets, limits)
            if placed is not None:
                entry, backend = placed
                self._preempt(entry.ticket, backend, budgets)
                prio = self.dispatcher.commit(entry.ticket, backend, shield=budgets.shield)
                revocable = budgets.shield.preempt_s is not None
                self._dispatch(entry, backend, now, prio, loan=False, revocable=revocable)
                continue
            borrowed = self._borrow(now)
            if borrowed is None:
                ends = self.dispatcher.round_ends(budgets)
                wake = math.inf if ends is None else ends
                if self.dispatcher.shield_held:  # a whole request's predicted prefill ends then
                    wake = min(wake, self.dispatcher.next_due())
                break
            entry, backend, prio = borrowed
            self._dispatch(entry, backend, now, prio, loan=True)
        if not self.queue:
            self.window.length_s = 0.0
        else:
            wake = min(wake, self._next_sweep)
            if self._loans:
                self._reclaim(budgets, limits)
        if wake < self._next_wake:
            self._wake.set()
        self._next_wake = wake

    async def run(self) -> None:
        """Timer task: pump when a window/round opens or a re-check is due. Runs until cancelled."""
        while True:
            if self._next_wake <= self.clock():
                self.pump()
            self._wake = anyio.Event()
            delay = self._next_wake - self.clock()
            with anyio.move_on_after(delay if math.isfinite(delay) else None):
                await self._wake.wait()

    def snapshot(self) -> dict[str, Any]:
        """State for /admin/state (`state.pool_snapshot`): why the head request waits, per backend."""
        return pool_snapshot(self)

    # -- decision inputs (shared with state.pool_snapshot) --------------------------------------------

    def window_load(self, now: float, budgets: PoolBudgets) -> QueueLoad:
        """The window judges the top waiting band, so a lower band's load never holds a higher band: its
        queued prefill tokens plus those the current / just-ended round released at that band and above
        (a steady stream that never piles up still reads as load, in tokens: tiny requests are none),
        and the slack of its oldest request. Queued tokens of every band count towards a full round."""
        band = self.queue.top_band()
        oldest = self.queue.oldest(band)
        assert band is not None and oldest is not None
        slack = oldest.deadline - now - oldest.prompt_tokens / self.rate.at(now)
        return QueueLoad(
            band=band,
            band_prefill_tokens=self.queue.prefill_tokens(band),
            recent_prefill_tokens=self.dispatcher.recent_prefill(now, budgets, band),
            prefill_tokens=self.queue.prefill_tokens(),
            oldest_enqueued_at=oldest.enqueued_at,
            oldest_slack_s=slack,
            round_tokens=self._round_tokens(budgets),
        )

    def pool_level(self, now: float, budgets: PoolBudgets) -> float:
        """Prefill load of the whole pool (every band): a round opened above light load is grouped."""
        demand = self.dispatcher.recent_prefill(now, budgets) + self.queue.prefill_tokens()
        return demand / self._round_tokens(budgets)

    def decision(
        self, policy: Policy, candidate: tuple[int, str] | None = None
    ) -> tuple[PoolBudgets, dict[str, int]]:
        """Ready the dispatcher for decisions under `policy`: current limits and slot rules (headroom
        for the top band and for tenants under their share; `candidate` (band, tenant) counts as present).
        Returns the pool's budgets (the round's prefill budget as metered now) and the limit per backend."""
        self._sync_limits(policy)
        self.dispatcher.rule = self._slot_rule(policy, candidate)
        limits = {url: lim.limit for url, lim in self.limits.items()}
        self.dispatcher.pool_slots = sum(limits[b.url] for b in self.backends if b.available)
        self.dispatcher.now = self.queue.now = self.clock()
        self.dispatcher.prefill_rate = self.rate.at(self.dispatcher.now)
        self.dispatcher.share_window_s = policy.fairness.share_window_s
        self.queue.lifo_after_fraction = policy.queue.lifo_after_fraction
        return self.metered_budgets(policy, self.clock()), limits

    def metered_budgets(self, policy: Policy, now: float) -> PoolBudgets:
        """The pool's budgets; with `prefill_rate_fraction`, the round's prefill budget follows the
        measured prefill rate (never above the configured one, at least one token)."""
        budgets = policy.budgets.for_pool(self.pool)
        fraction = budgets.prefill_rate_fraction
        if fraction is None:
            return budgets
        metered = int(fraction * self.rate.at(now) * budgets.round_s)
        if metered >= budgets.prefill_tokens_per_round:
            return budgets
        tokens = max(1, metered)
        cached = self._metered
        if cached is None or cached[0] is not budgets or cached[1] != tokens:
            # a pydantic copy per decision was a tenth of the admission path's CPU: one per change
            cached = self._metered = (
                budgets,
                tokens,
                budgets.model_copy(update={"prefill_tokens_per_round": tokens}),
            )
        return cached[2]

    # -- internals ---------------------------------------------------------------------------------

    def _weight(self, policy: Policy, tenant: str) -> float:
        weight = policy.fairness.weights.get(tenant)
        if weight is None and self.weight_of is not None:
            weight = self.weight_of(tenant)
        return weight if weight is not None and weight > 0 else policy.tenant_defaults.weight

    def _available(self) -> int:
        return sum(1 for b in self.backends if b.available)

    def _round_tokens(self, budgets: PoolBudgets) -> int:
        return budgets.prefill_tokens_per_round * max(1, self._available())

    def _slot_wait(self, entry: Entry, now: float, ahead: int = 0) -> float | None:
        """When could a backend take `entry` (round prefill budget aside)? See QueueGuard."""
        policy = self.policy_getter()
        budgets, limits = self.decision(policy, (entry.band, entry.tenant))
        max_age = policy.queue.prefill_rate_max_age_s
        return self.dispatcher.slot_wait(entry, self.backends, budgets, limits, now, max_age, ahead)

    def _sweep_slot_wait(self, policy: Policy) -> SlotWait:
        """`_slot_wait` for one sweep: every entry it judges is queued, so its tenant is already present
        and one decision serves them all — until the sweep sheds one (a tenant may leave with it)."""
        inputs: dict[int, tuple[PoolBudgets, dict[str, int]]] = {}
        max_age = policy.queue.prefill_rate_max_age_s

        def slot_wait(entry: Entry, now: float, ahead: int) -> float | None:
            depth = len(self.queue)
            if depth not in inputs:
                inputs.clear()
                inputs[depth] = self.decision(policy)
            budgets, limits = inputs[depth]
            return self.dispatcher.slot_wait(entry, self.backends, budgets, limits, now, max_age, ahead)

        return slot_wait

    def _slot_rule(self, policy: Policy, candidate: tuple[int, str] | None) -> SlotRule:
        top = policy.queue.priorities.top
        tenant_fraction = policy.fairness.reserve_fraction
        present: dict[int, dict[str, float]] = {}
        if tenant_fraction > 0:
            seats = self.queue.tenants() | self.dispatcher.holdings.tenants()
            if candidate is not None:
                seats.add(candidate)
            for band, tenant in seats:
                present.setdefault(band, {})[tenant] = self._weight(policy, tenant)
        priorities = policy.queue.priorities
        hold = priorities.reserve_hold_s
        held = hold is None or self.clock() - self._top_seen <= hold
        return SlotRule(
            top_band=-math.inf if top is None else top,
            band_fraction=priorities.reserve_fraction if held else 0.0,
            tenant_fraction=tenant_fraction,
            present=present,
            weight_of=lambda tenant: self._weight(policy, tenant),
        )

    def _batch_tpot_target(self, backend: BackendState) -> float | None:
        """The tightest TPOT target among this pool's requests running on `backend`."""
        targets = [
            t
            for lease in self._leases
            if lease.backend is backend and (t := lease.entry.slo.tpot_p99_s) is not None
        ]
        return min(targets, default=None)

    def _sync_limits(self, policy: Policy) -> None:
        for b in self.backends:
            current = self.limits.get(b.url)
            if current is None:
                current = self.limits[b.url] = make_limit(policy.controller)
            elif current.policy is not policy.controller:
                if current.policy == policy.controller:  # a reload that left the controller alone
                    current.policy = policy.controller  # (compare by identity from now on: cheaper)
                else:
                    current = self.limits[b.url] = make_limit(policy.controller, current.limit)
            b.concurrency_limit = current.limit

    def _borrow(self, now: float) -> tuple[Entry, BackendState, int] | None:
        """Our own backends are full: offer the first request this round may release to the lender —
        the first whole one: a loan must be revocable, and a stream cannot be taken back once it has
        started (see `_reclaim`)."""
        if self._lender is None:
            return None
        head = next(
            (e for e in self.queue.ordered() if self.dispatcher.joins_round(e) and not e.ticket.stream),
            None,
        )
        loan = None if head is None else self._lender.lend(head, now)
        return None if head is None or loan is None else (head, *loan)

    def _reclaim(self, budgets: PoolBudgets, limits: dict[str, int]) -> None:
        """Our own head request waits, and on no backend would a round opened now take it; where a
        loan holds what it lacks (a slot, KV, its bucket), revoke the newest loan — one at a time per
        backend, so each revocation is seen freed before the next. Loans start only while none of our
        requests wait (`lend`); this is the other half: they do not hold the backend once ours wait."""
        head = next(self.queue.ordered(), None)
        if head is None:
            return
        blocked = self.dispatcher.blocked_by(head, self.backends, budgets, limits, new_round=True)
        if len(blocked) < len(self.backends):
            return  # it fits somewhere: the round or the window holds it, not a loan
        for url, reason in blocked.items():
            if reason not in _RECLAIMABLE:
                continue
            loans = [lease for lease in self._loans if lease.backend.url == url]
            if loans and not any(lease.revoked for lease in loans):
                loans[-1].revoke()

    def _preempt(self, ticket: Ticket, backend: BackendState, budgets: PoolBudgets) -> None:
        """Take back the prompts that would ride in `ticket`'s prefill batch (`Dispatcher.preempt`): their
        pipelines abandon the upstream call (the engine aborts it) and queue them again."""
        victims = {id(t) for t in self.dispatcher.preempt(ticket, backend, budgets.shield)}
        if not victims:
            return
        for lease in [*self._leases, *self._loans]:
            if id(lease.ticket) in victims:
                lease.revoke()
                self.preempted += 1

    def _dispatch(
        self,
        entry: Entry,
        backend: BackendState,
        now: float,
        engine_priority: int,
        *,
        loan: bool,
        revocable: bool = False,
    ) -> None:
        """Hand `entry` its lease (the dispatcher, or the lender for a loan, has already accounted it).
        A loan is always revocable; `revocable`: our own request may be preempted too."""
        self.queue.remove(entry)
        ticket = entry.ticket
        if loan:
            self.borrowed += 1
        self.counters.served(ticket.tenant)
        self.counters.charge(ticket.tenant, entry.charge)
        self.dispatcher.recent.charge(ticket.tenant, entry.charge, now, self.dispatcher.share_window_s)
        ticket.backend = backend.url
        ticket.dispatched_at = now
        lease = Lease(entry, backend, entry.charge, loan, self._release, engine_priority, self._started)
        lease.dispatched_at = now
        lease.revocable = loan or revocable
        self._leases.add(lease)
        if loan and self._lender is not None:
            self._lender._loans.append(lease)
        waiter = self._waiters.pop(entry)
        waiter.lease = lease
        waiter.event.set()

    def _started(self, lease: Lease) -> None:
        """The lease's first byte came: its prefill no longer waits in the engine (the prefill shield)."""
        owner = self._lender if lease.loan and self._lender is not None else self
        owner.dispatcher.started(lease.backend.url, lease.ticket)
        if owner.dispatcher.shield_held and owner.queue:
            owner.pump()  # only then: a pump on every first byte would move rounds and windows

    def _fail(self, entry: Entry, err: ApiError) -> None:
        waiter = self._waiters.pop(entry)
        waiter.error = err
        waiter.event.set()

    def _abandon(self, entry: Entry, waiter: Waiter) -> None:
        """The caller was cancelled while waiting: leave the queue, or give back a lease it never saw."""
        self._waiters.pop(entry, None)
        if waiter.lease is not None:
            waiter.lease.release(Usage(0, 0), Outcome.CANCELLED)
        elif self.queue.remove(entry):
            self.pump()

    def _release(
        self, lease: Lease, usage: Usage | None, outcome: Outcome, ttft_s: float | None, tpot_s: float | None
    ) -> None:
        self._leases.discard(lease)
        if lease.loan and self._lender is not None:
            self._lender._loans.remove(lease)
        ticket, backend, entry = lease.ticket, lease.backend, lease.entry
        policy = self.policy_getter()
        in_flight = backend.active
        owner = self._lender if lease.loan and self._lender is not None else self
        owner.dispatcher.release(ticket, backend, self.clock())
        if usage is not None:
            fair = policy.fairness
            actual = token_charge(
                usage.prompt_tokens,
                usage.completion_tokens,
                entry.weight,
                fair.input_weight,
                fair.output_weight,
            )
            self.counters.charge(ticket.tenant, actual - lease.charged)
            self.dispatcher.recent.charge(
                ticket.tenant,
                actual - lease.charged,
                self.clock(),
                policy.fairness.share_window_s,
                at=lease.dispatched_at,
            )
        prompt = (
            usage.prompt_tokens if usage is not None and usage.prompt_tokens else ticket.cost.prompt_tokens
        )
        # the engine that did the work learns from it: a loan's samples go to the lender's rate and limit
        if outcome == Outcome.OK and ttft_s is not None:
            owner.observe_prefill(prompt, ttft_s)
        limit = owner.limits.get(backend.url)
        if limit is not None and (outcome == Outcome.OK or outcome in DROP_OUTCOMES):
            shared = None if entry.slo.tpot_p99_s is not None else owner._batch_tpot_target(backend)
            ratio = latency_ratio(entry.slo, ttft_s, tpot_s, prompt / owner.rate.at(self.clock()), shared)
            limit.update(Sample(self.clock(), in_flight, ratio, dropped=outcome in DROP_OUTCOMES))
            backend.concurrency_limit = limit.limit
        self.pump()
        if lease.loan and self._lender is not None:
            self.borrowed -= 1
            self._lender.lent -= 1
            self._lender.pump()  # its own waiting requests may take the freed slot
