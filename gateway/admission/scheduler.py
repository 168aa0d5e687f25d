"""The anyio shell of one pool: requests wait here until the dispatcher gives them a backend.

Dispatch happens on events: every `acquire`, every lease release and `pump()` (the lead calls it when
backend health or scrapes change) run the dispatcher at once. `run()` is a small timer task for what no
event announces: a window or round that opens later, and the periodic re-check that sheds requests that
can no longer meet their deadline. Settings are read through `settings()` at every decision, so a reload
applies to new decisions while queued and running requests keep the class SLO they were admitted with.
Each decision is one frozen `Decision` (decision.py) built here and handed to the dispatcher.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio

from gateway.admission.blocks import Block
from gateway.admission.budgets import backend_load, full_buckets
from gateway.admission.decision import Decision, SlotRule
from gateway.admission.dispatch import Dispatcher
from gateway.admission.engine_stages import StageBook
from gateway.admission.fairness import VirtualTokenCounters, token_charge
from gateway.admission.lease import DROP_OUTCOMES, Lease, Waiter
from gateway.admission.lending import Loans
from gateway.admission.limits import Limit, Sample, latency_ratio, make_limit, tpot_ratio
from gateway.admission.queue import Entry, SLOQueue, effective_deadline
from gateway.admission.replica_shares import Fairness, ReplicaShares
from gateway.admission.rounds import BudgetCopy, Metering
from gateway.admission.settings import AdmissionSettings
from gateway.admission.shedding import PrefillRate, QueueGuard, SlotWait, displaced_error
from gateway.admission.standing import RecentService
from gateway.admission.state import PoolView, pool_snapshot
from gateway.admission.turnover import capacity_lost
from gateway.admission.window import hold
from gateway.backends.state import BackendState
from gateway.request.errors import ApiError, ErrorCode
from gateway.request.ticket import Outcome, Ticket, Usage

__all__ = ["DROP_OUTCOMES", "Lease", "PoolScheduler"]  # Lease and DROP_OUTCOMES live in lease.py


class PoolScheduler:
    """One pool's queue, dispatcher and limits; `acquire` returns a `Lease` on a backend."""

    def __init__(
        self,
        pool: str,
        backends: list[BackendState],
        settings: Callable[[], AdmissionSettings],
        *,
        clock: Callable[[], float] = time.monotonic,
        weight_of: Callable[[str], float | None] | None = None,
        engine_priorities: bool = False,
        stages: StageBook | None = None,
    ) -> None:
        self.pool = pool
        self.backends = backends
        self.settings = settings
        self.clock = clock
        self.weight_of = weight_of
        current = settings()
        self.counters = VirtualTokenCounters()
        self.recent = RecentService()  # the tenants' decayed service: their standing (standing.py)
        self.stages = stages  # a staged kind's stage budgets, which the dispatcher places by
        self.dispatcher = Dispatcher(engine_priorities, stages, self.recent)
        self.queue = SLOQueue(self.counters, standing=self._under_share)
        self.rate = PrefillRate(current.queue)
        lost = functools.partial(capacity_lost, pool, backends)
        self.guard = QueueGuard(self.queue, self.rate, pool, capacity_lost=lost)
        self.metering = Metering()
        self.limits: dict[str, Limit] = {}
        self.window_s = 0.0  # the window's hold as the last dispatch pass computed it (a gauge)
        self._ctx: Decision | None = None  # the last decision: the queue's standing is judged by it
        self._waiters: dict[Entry, Waiter] = {}
        self._leases: set[Lease] = set()
        self._next_wake = math.inf
        self._next_sweep = -math.inf
        self._wake = anyio.Event()
        self._lender: PoolScheduler | None = None
        self._loans = Loans()  # another pool's requests on our backends, oldest first
        self._top_seen = -math.inf  # when a top-band request last arrived (the band reserve's hold)
        self.shares: ReplicaShares | None = None  # set when replicas share the engines (coordination)
        self._shared_budgets = BudgetCopy()  # the round's budget scaled to this replica's share
        self._sync_limits(current)

    @property
    def rejections(self) -> dict[tuple[str, str], int]:
        """Refusals by (reason, traffic class), for the lead's metrics."""
        return self.guard.rejections

    @property
    def in_flight(self) -> int:
        return len(self._leases)

    @property
    def waiting(self) -> int:
        """Callers parked in `acquire` (queued, or woken and not yet resumed)."""
        return len(self._waiters)

    @property
    def borrowed(self) -> int:
        """This pool's requests running on a lender's backends."""
        return sum(1 for lease in self._leases if lease.loan)

    @property
    def lent(self) -> int:
        """Another pool's requests running on this pool's backends."""
        return len(self._loans)

    @property
    def next_wake(self) -> float:
        """When the timer task pumps next (inf: only an event will)."""
        return self._next_wake

    async def acquire(self, ticket: Ticket, *, exclude: Iterable[str] = (), requeued: bool = False) -> Lease:
        """Wait until `ticket` is dispatched; raises ApiError when refused, shed or displaced. `requeued`:
        it was dispatched and taken back (a loan revoked, or its backend failed before the first byte) —
        admitted already, it is neither refused nor shed nor displaced again."""
        settings = self.settings()
        slo = settings.queue.classes.get(ticket.traffic_class)
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
        top = settings.queue.priorities.top
        if top is not None and ticket.priority >= top:
            self._top_seen = now
        weight = self._weight(settings, ticket.tenant)
        fair = settings.fairness
        cost = ticket.cost
        charge = token_charge(
            cost.prompt_tokens, cost.expected_output_tokens, weight, fair.input_weight, fair.output_weight
        )
        deadline = effective_deadline(ticket, slo)
        if self.stages is not None:  # speech must leave the queue in time for its first audio
            deadline -= self.stages.first_audio_lag(ticket)
        usable = (b for b in self.backends if b.url not in excluded)
        cached = max((b.prefix.match(ticket.prefix) for b in usable), default=0)  # where it will likely go
        entry = Entry(
            ticket, slo, deadline, weight, now, charge, exclude=excluded, requeued=requeued, cached=cached
        )
        self.rate.configure(settings.queue)
        decided: list[Decision] = []
        slot_wait = self._arrival_slot_wait(settings, decided)
        victim = self.guard.admit(entry, now, self.capacity(), self._full_buckets(settings), slot_wait)
        waiter = self._waiters[entry] = Waiter()
        if victim is not None:
            self._fail(victim, displaced_error())
        self.pump(decided[0] if decided and victim is None else None)
        if entry.queued and not requeued and self._over_max_queued(ticket):
            self._abandon(entry, waiter)
            self.guard.rejections[(ErrorCode.QUEUED_EXCEEDED, ticket.traffic_class)] += 1
            raise ApiError(
                429,
                f"Tenant {ticket.tenant} already has {ticket.max_queued} request(s) waiting in pool "
                f"{self.pool} (max_queued).",
                code=ErrorCode.QUEUED_EXCEEDED,
                retry_after=1.0,
            )
        try:
            await waiter.event.wait()
        except BaseException:
            self._abandon(entry, waiter)
            raise
        if waiter.error is not None:
            raise waiter.error
        assert waiter.lease is not None
        return waiter.lease

    def borrow_from(self, lender: PoolScheduler) -> None:
        """Let this pool (the offline one) run whole requests on `lender`'s backends while the lender's
        `budgets.lend` policy allows (off by default): see lending.py."""
        self._lender = lender

    def lend(self, entry: Entry, now: float) -> tuple[BackendState, int] | None:
        """A backend of this pool for a borrower's request, already accounted, and the request's engine
        priority there; or None. A loan starts only while lending is enabled, none of this pool's own
        requests wait, and a backend is below `lend.max_load` and fits this pool's budgets (the loan
        spends this pool's round prefill budget). Once our requests wait, `pump` takes loans back."""
        settings = self.settings()
        if not settings.budgets.for_pool(self.pool).lend.enabled or self.queue:
            return None
        ctx = self.decision(settings, (entry.band, entry.tenant))
        budgets = ctx.budgets
        idle = [
            b for b in self.backends if backend_load(b, ctx.limits[b.url], budgets) < budgets.lend.max_load
        ]
        if not self.dispatcher.round_open(now, budgets):
            self.dispatcher.open_round(now, budgets)
        placed = self.dispatcher.place([entry], idle, ctx, loan=True)
        if placed is None:
            return None
        backend = placed[1]
        return backend, self.dispatcher.commit(entry.ticket, backend, ctx, loan=True)

    def on_loan(self, lease: Lease) -> None:
        """A borrower's lease on one of our backends (from `lend`) began."""
        self._loans.add(lease)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """Feed one observed prefill (prompt tokens, seconds to first token) to the pool's rate estimate."""
        self.rate.configure(self.settings().queue)
        self.rate.observe(tokens, seconds, self.clock())

    def prefill_started(self, lease: Lease) -> None:
        """A lease on our backends (ours or a loan) saw its first byte: its prefill no longer waits in
        the engine, and a placement the shield held may go now."""
        now = self.clock()
        self.dispatcher.started(lease.ticket, lease.backend.url, now)
        if not lease.loan:  # a borrower's request was judged by its own pool's guard
            self.guard.calibrate(lease.entry, now)
        if self.dispatcher.held and self.queue:
            self.pump()  # only then: a pump on every first byte would move rounds and windows

    def settle(
        self, lease: Lease, usage: Usage | None, outcome: Outcome, ttft_s: float | None, tpot_s: float | None
    ) -> None:
        """A lease on our backends (ours or a loan) ended: give back its budgets, and learn from the work —
        the engine that did it feeds this pool's prefill rate and the backend's concurrency limit."""
        ticket, backend, entry = lease.ticket, lease.backend, lease.entry
        if lease.loan:
            self._loans.remove(lease)
        in_flight = backend.active + backend.peer_active  # the engine's, when replicas share it
        self.dispatcher.release(ticket, backend, self.clock())
        prompt = ticket.cost.prefill_tokens  # what the engine computed: the prompt less its cached prefix
        if usage is not None and usage.prompt_tokens:
            told = usage.cached_tokens  # the engine's own count of it, else the expected one
            prompt = usage.prompt_tokens - (ticket.cost.cached_tokens if told is None else told)
        if outcome == Outcome.OK and ttft_s is not None:
            self.observe_prefill(prompt, ttft_s)
        now = self.clock()
        share = self.dispatcher.decode_share(ticket, now, self.rate.at(now))
        limit = self.limits.get(backend.url)
        if limit is not None and (outcome == Outcome.OK or outcome in DROP_OUTCOMES):
            shared = None if entry.slo.tpot_p99_s is not None else self._batch_tpot_target(backend)
            ratio = latency_ratio(entry.slo, ttft_s, tpot_s, prompt / self.rate.at(now), shared)
            tpot = tpot_ratio(entry.slo, tpot_s, shared)
            limit.update(Sample(now, in_flight, ratio, outcome in DROP_OUTCOMES, tpot, share))
            backend.concurrency_limit = limit.limit

    def pump(self, decided: Decision | None = None) -> None:
        """Shed what must go, then dispatch everything the window, rounds and budgets allow right now.
        `decided`: an arrival's pass (`_arrival_slot_wait`) — the decision its slot wait was judged by, at
        its `now`, with nothing changed since but its entry queued (which the decision counted present
        already): this pass runs at that `now` and decides by it, unless a sweep changes the queue first."""
        settings = self.settings()
        now = self.clock() if decided is None else decided.now
        self.rate.configure(settings.queue)
        swept_now = len(self.queue) > 0 and now >= self._next_sweep
        if swept_now:
            swept = self.guard.sweep(now, self.capacity())
            for entry, err in swept:
                self._fail(entry, err)
            self._next_sweep = now + settings.queue.recheck_interval_s
            self.recent.forget(now, settings.fairness.share_window_s)
            decided = None
        dispatcher = self.dispatcher
        dispatcher.begin_pass()
        if not self.queue:  # nothing to place: the limits follow the policy, the rest waits for a pass
            self._sync_limits(settings)  # that has something to decide
            self.window_s = 0.0
            return
        ctx = self.decision(settings) if decided is None else decided
        budgets = ctx.budgets
        if swept_now:
            self._rush(now, ctx)
        wake = math.inf
        while self.queue:
            if not dispatcher.round_open(now, budgets):
                self.window_s = hold(self.pool, self.queue.prefill_tokens(), settings.window)
                opens = self._oldest_enqueued_at() + self.window_s
                if opens > now:
                    wake = opens
                    break
                dispatcher.open_round(now, budgets)
            placed = dispatcher.place(self.queue.ordered(), self.backends, ctx)
            if placed is not None:
                entry, backend = placed
                prio = dispatcher.commit(entry.ticket, backend, ctx)
                self._dispatch(entry, backend, now, prio, loan=False)
                continue
            borrowed = self._borrow(now)
            if borrowed is None:
                ends = dispatcher.round_ends(budgets)
                wake = math.inf if ends is None else ends
                if dispatcher.held:  # a whole request's predicted prefill ends then
                    wake = min(wake, dispatcher.next_due(ctx.now))
                break
            entry, backend, prio = borrowed
            self._dispatch(entry, backend, now, prio, loan=True)
        if not self.queue:
            self.window_s = 0.0
        else:
            wake = min(wake, self._next_sweep)
            if self._loans:
                self._reclaim(ctx)
            if self.shares is not None:
                self.shares.nudge()
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
        """State for /admin/state (state.py): why the head request waits, per backend. A read: it builds
        its own decision and changes nothing, so two reads in a row agree."""
        settings = self.settings()
        now = self.clock()
        ctx = self._decide(settings, now, None, keep=False)
        head = next(self.queue.ordered(), None)
        view = PoolView(
            pool=self.pool,
            now=now,
            ctx=ctx,
            queue=self.queue,
            dispatcher=self.dispatcher,
            backends=tuple(self.backends),
            head=head,
            head_blocked=None if head is None else self._blocked(head, ctx, settings, now),
            window_s=self.window_s,
            in_flight=self.in_flight,
            borrowed=self.borrowed,
            lent=self.lent,
            rejections=dict(self.rejections),
            limit_values={url: lim.value for url, lim in self.limits.items()},
            prefill_duties={url: lim.prefill_duty for url, lim in self.limits.items()},
            refusal_factor=self.guard.refusal_factor(now),
            shared=None
            if self.shares is None
            else {b.url: self.shares.describe(b.url, self.limits[b.url].limit) for b in self.backends},
        )
        return pool_snapshot(view)

    # -- decision inputs ---------------------------------------------------------------------------

    def _oldest_enqueued_at(self) -> float:
        """When the oldest request of the top waiting band came: an accumulating pool's hold runs from it."""
        oldest = self.queue.oldest(self.queue.top_band())
        assert oldest is not None
        return oldest.enqueued_at

    def decision(
        self,
        settings: AdmissionSettings,
        candidate: tuple[int, str] | None = None,
        now: float | None = None,
    ) -> Decision:
        """The context of a decision under `settings` at `now` (None: the clock's): current limits and
        slot rules (headroom for the top band and for tenants under their share; `candidate` (band,
        tenant) counts as present) and the pool's budgets (the round's prefill budget as metered now). The
        queue judges standing by it until the next one."""
        self._sync_limits(settings)
        at = self.clock() if now is None else now
        ctx = self._ctx = self._decide(settings, at, candidate, keep=True)
        self.queue.as_of(ctx.now, settings.queue.lifo_after_fraction)
        return ctx

    # -- internals ---------------------------------------------------------------------------------

    def _decide(
        self, settings: AdmissionSettings, now: float, candidate: tuple[int, str] | None, *, keep: bool
    ) -> Decision:
        """A decision's context from the state as it is (limits not synced; `keep`: let the metering keep
        its budgets copy)."""
        available = [b for b in self.backends if b.available]
        limits = {url: lim.limit for url, lim in self.limits.items()}
        rate = self.rate.at(now)
        metered = rate * self._prefill_duty(available)
        budgets = self.metering.budgets(settings.budgets.for_pool(self.pool), metered, keep=keep)
        inbound: dict[str, int] = {}
        if self.shares is not None:  # replicas share the engines: dispatch within this one's share
            fraction = self.shares.fraction([b.url for b in self.backends], limits)
            if self.dispatcher.above_peers(budgets.shield, now):
                fraction = 1.0  # the engine runs our prompts before any peer's: meter as one replica
            tokens = max(1, int(budgets.prefill_tokens_per_round * fraction))
            budgets = self._shared_budgets.with_tokens(budgets, tokens, keep=keep)
            limits = {url: self.shares.granted(url, limit) for url, limit in limits.items()}
            inbound = {url: n for url in limits if (n := self.shares.inbound(url))}
        return Decision(
            now=now,
            budgets=budgets,
            limits=limits,
            rule=self._slot_rule(settings, candidate, now),
            pool_slots=sum(limits[b.url] for b in available),
            prefill_rate=rate,
            share_window_s=settings.fairness.share_window_s,
            inbound=inbound,
        )

    def _prefill_duty(self, available: list[BackendState]) -> float:
        """The share of the measured prefill rate the round budget meters out: the tightest duty of the
        `available` backends' limits (limits/target.py), 1 without one."""
        limits = self.limits
        return min((limits[b.url].prefill_duty for b in available if b.url in limits), default=1.0)

    def _blocked(
        self, head: Entry, ctx: Decision, settings: AdmissionSettings, now: float
    ) -> dict[str, Block]:
        """What holds the head request: in a round, its budgets; between rounds the window, if it still
        holds, else the budgets a round opened now would check."""
        budgets = ctx.budgets
        if self.dispatcher.round_open(now, budgets):
            return self.dispatcher.blocked_by(head, self.backends, ctx)
        if self._oldest_enqueued_at() + hold(self.pool, self.queue.prefill_tokens(), settings.window) > now:
            return {"*": Block.WINDOW}
        return self.dispatcher.blocked_by(head, self.backends, ctx, new_round=True)

    def _under_share(self, band: int, tenant: str) -> bool:
        """The queue's standing of a tenant, judged by the last decision (none yet: nobody is under)."""
        ctx = self._ctx
        return ctx is not None and self.dispatcher.under_share(band, tenant, ctx)

    def _over_max_queued(self, ticket: Ticket) -> bool:
        """The tenant's `max_queued` quota: more of its requests would wait here than it allows."""
        return ticket.max_queued is not None and self.queue.depth_of(ticket.tenant) > ticket.max_queued

    def _weight(self, settings: AdmissionSettings, tenant: str) -> float:
        weight = settings.fairness.weights.get(tenant)
        if weight is None and self.weight_of is not None:
            weight = self.weight_of(tenant)
        return weight if weight is not None and weight > 0 else settings.default_weight

    def _available(self) -> int:
        return sum(1 for b in self.backends if b.available)

    def _full_buckets(self, settings: AdmissionSettings) -> frozenset[str]:
        return full_buckets(self.backends, settings.budgets.for_pool(self.pool))

    def capacity(self) -> float:
        """The available backends this pool's queue drains into: all of them, or this replica's part of
        them (its shares) when replicas share the engines — each queue then predicts at its own pace —
        times the prefill duty under adaptive metering (the rounds send prompts at that share of the rate)."""
        usable = [b for b in self.backends if b.available]
        available = float(len(usable))
        if self.settings().budgets.for_pool(self.pool).prefill_rate_fraction is not None:
            available *= self._prefill_duty(usable)
        if self.shares is None:
            return available
        limits = {url: lim.limit for url, lim in self.limits.items()}
        return available * self.shares.pace([b.url for b in self.backends], limits)

    def top_reserve(self, limit: int) -> tuple[int, int]:
        """(slots of `limit` the bands below the top leave free for it, the top band): (0, 0) while no
        reserve is held. What replicas keep engine-wide (the allocator caps the lower bands' claims)."""
        rule = self._slot_rule(self.settings(), None, self.clock())
        reserve = rule.band_reserve(-math.inf, limit)
        return (reserve, int(rule.top_band)) if reserve > 0 else (0, 0)

    # -- the replicas' side (shares.SharedPool) ---------------------------------------------------

    def share(self, shares: ReplicaShares) -> None:
        """Replicas share the engines: dispatch within `shares`, and keep the fairness changes."""
        self.shares = shares
        self.counters.share()
        self.recent.share()

    def local_limit(self, url: str) -> int:
        return self.limits[url].limit

    def demand(self, url: str) -> dict[int, int]:
        demand = self.queue.depth_by_band()
        for band, n in self.dispatcher.held_by_band(url).items():
            demand[band] = demand.get(band, 0) + n
        return demand

    def peers_shield(self, rank: float | None, until: float) -> None:
        self.dispatcher.peers(rank, until)

    def take_fairness(self) -> Fairness:
        now, window_s = self.clock(), self.settings().fairness.share_window_s
        recent = self.recent.take_pending(now, window_s)
        return Fairness(self.counters.take_pending(), recent, now, window_s)

    def restore_fairness(self, taken: Fairness) -> None:
        self.counters.restore(taken.counters)
        self.recent.restore(taken.recent, taken.now, taken.window_s)

    def merge_fairness(self, taken: Fairness, counters: dict[str, float], recent: dict[str, float]) -> None:
        self.counters.merge(counters)
        self.recent.merge(recent, self.clock(), taken.window_s)

    def shield_top(self) -> float | None:
        """The top rank this pool dispatched within the shield's hold (None: none): what replicas sharing
        the engines tell each other (shield.py)."""
        shield = self.settings().budgets.for_pool(self.pool).shield
        return self.dispatcher.own_top(shield, self.clock())

    def _arrival_slot_wait(self, settings: AdmissionSettings, decided: list[Decision]) -> SlotWait:
        """When could a backend take an arriving entry (round prefill budget aside)? See QueueGuard. The
        decision it is judged by, made at the arrival's `now` with the entry counted present, is put in
        `decided`: the arrival's dispatch pass that follows decides by it rather than again (`pump`)."""
        max_age = settings.queue.prefill_rate_max_age_s

        def slot_wait(entry: Entry, now: float, ahead: int) -> float | None:
            ctx = self.decision(settings, (entry.band, entry.tenant), now)
            decided.append(ctx)
            return self.dispatcher.slot_wait(entry, self.backends, ctx, now, max_age, ahead)

        return slot_wait

    def _slot_rule(
        self, settings: AdmissionSettings, candidate: tuple[int, str] | None, now: float
    ) -> SlotRule:
        top = settings.queue.priorities.top
        tenant_fraction = settings.fairness.reserve_fraction
        present: dict[int, dict[str, float]] = {}
        if tenant_fraction > 0:
            seats = self.queue.tenants() | self.dispatcher.seated()
            if candidate is not None:
                seats.add(candidate)
            for band, tenant in seats:
                present.setdefault(band, {})[tenant] = self._weight(settings, tenant)
        priorities = settings.queue.priorities
        reserve_hold = priorities.reserve_hold_s
        held = reserve_hold is None or now - self._top_seen <= reserve_hold
        return SlotRule(
            top_band=-math.inf if top is None else top,
            band_fraction=priorities.reserve_fraction if held else 0.0,
            tenant_fraction=tenant_fraction,
            present=present,
            weight_of=lambda tenant: self._weight(settings, tenant),
        )

    def _batch_tpot_target(self, backend: BackendState) -> float | None:
        """The tightest TPOT target among this pool's requests running on `backend`."""
        targets = [
            t
            for lease in self._leases
            if lease.backend is backend and (t := lease.entry.slo.tpot_p99_s) is not None
        ]
        return min(targets, default=None)

    def _sync_limits(self, settings: AdmissionSettings) -> None:
        controller = settings.controller
        for b in self.backends:
            current = self.limits.get(b.url)
            if current is None:
                current = self.limits[b.url] = make_limit(controller)
            elif current.policy is not controller:
                if current.policy == controller:  # a reload that left the controller alone
                    current.policy = controller  # (compare by identity from now on: cheaper)
                else:
                    current = self.limits[b.url] = make_limit(controller, current.value)
            if self.shares is not None and controller.algorithm != "fixed":
                owned = self.shares.follows(b.url)  # another replica owns the engine's limit: follow it
                if owned is not None and owned != int(current.value):
                    current = self.limits[b.url] = make_limit(controller, owned)
            current.ceiling = b.max_running_requests  # the engine's own cap: more would queue in it
            b.concurrency_limit = current.limit

    def _borrow(self, now: float) -> tuple[Entry, BackendState, int] | None:
        """Our own backends are full: offer the first request this round may release to the lender —
        the first whole one: a loan must be revocable, and a stream cannot be taken back once it has
        started (lending.py)."""
        if self._lender is None:
            return None
        head = next((e for e in self.queue.ordered() if not e.ticket.stream), None)
        loan = None if head is None else self._lender.lend(head, now)
        return None if head is None or loan is None else (head, *loan)

    def _reclaim(self, ctx: Decision) -> None:
        """Our own head request waits, and on no backend would a round opened now take it: take back
        loans that hold what it lacks (lending.py). Loans start only while none of our requests wait
        (`lend`); this is the other half: they do not hold the backend once ours wait."""
        head = next(self.queue.ordered(), None)
        if head is None:
            return
        blocked = self.dispatcher.blocked_by(head, self.backends, ctx, new_round=True, metered=False)
        if len(blocked) < len(self.backends):
            return  # it fits somewhere: the round or the window holds it, not a loan
        self._loans.reclaim(blocked)

    def _dispatch(
        self,
        entry: Entry,
        backend: BackendState,
        now: float,
        engine_priority: int,
        *,
        loan: bool,
    ) -> None:
        """Hand `entry` its lease (the dispatcher, or the lender for a loan, has already accounted it).
        A loan is revocable (`Lease`)."""
        assert self._ctx is not None  # the pass that placed it decided first
        self.queue.remove(entry)
        ticket = entry.ticket
        self.counters.served(ticket.tenant)
        self.counters.charge(ticket.tenant, entry.charge)
        self.recent.charge(ticket.tenant, entry.charge, now, self._ctx.share_window_s)
        lease = Lease(entry, backend, entry.charge, loan, self._release, engine_priority, self._started)
        lease.dispatched_at = now
        self._leases.add(lease)
        if loan and self._lender is not None:
            self._lender.on_loan(lease)
        waiter = self._waiters.pop(entry)
        waiter.lease = lease
        waiter.event.set()

    def _rush(self, now: float, ctx: Decision) -> None:
        """Send every rushed request (QueueGuard.rushed: its slack under `rush_slack_fraction` of its
        budget) that a slot and the round's prefill budget take, in the queue's order, past the shield and
        its spacing (a round opens for it if none is). Those shape who goes first; they must not hold a
        request the round and a slot have room for until its deadline is lost. The round's prefill budget
        still holds it: it is what keeps decode's share of the engine (TPOT)."""
        budgets = ctx.budgets
        for entry in [e for e in self.queue.ordered() if self.guard.rushed(e, now)]:
            if not self.dispatcher.round_open(now, budgets):
                self.dispatcher.open_round(now, budgets)
            placed = self.dispatcher.place([entry], self.backends, ctx, paced=False)
            if placed is not None:
                backend = placed[1]
                prio = self.dispatcher.commit(entry.ticket, backend, ctx)
                self._dispatch(entry, backend, now, prio, loan=False)

    def _owner(self, lease: Lease) -> PoolScheduler:
        """The pool whose backend runs `lease`: the lender for a loan."""
        return self._lender if lease.loan and self._lender is not None else self

    def _started(self, lease: Lease) -> None:
        self._owner(lease).prefill_started(lease)

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
        """The lease's callback: the backend's owner settles the work; this pool, whose request it was,
        corrects the tenant's fairness charge by the actual usage."""
        self._leases.discard(lease)
        ticket, entry = lease.ticket, lease.entry
        fair = self.settings().fairness
        self._owner(lease).settle(lease, usage, outcome, ttft_s, tpot_s)
        if usage is not None:
            actual = token_charge(
                usage.prompt_tokens,
                usage.completion_tokens,
                entry.weight,
                fair.input_weight,
                fair.output_weight,
            )
            self.counters.charge(ticket.tenant, actual - lease.charged)
            self.recent.charge(
                ticket.tenant,
                actual - lease.charged,
                self.clock(),
                fair.share_window_s,
                at=lease.dispatched_at,
            )
        self.pump()
        if lease.loan and self._lender is not None:
            self._lender.pump()  # its own waiting requests may take the freed slot
