"""Honest early rejection: who may enter a pool's queue, and who must leave it before being served.

Predicted start = now + (prefill tokens the queue dispatches first, queue.Ahead: a request whose bucket is at
its cap everywhere holds up only requests of its bucket) / (per-backend prefill rate × available backends —
this replica's part of them when replicas share the engines, one backend's worth when none is available);
predicted first token = start + own prefill tokens / per-backend rate. A request of a class that sheds by
deadline is refused at enqueue when its predicted first token falls after its deadline even with its
predicted wait cut by the predictor's recent error (`WaitCalibration`: a point prediction of a queue that
changes behind it is often too slow, and a refusal must be one that would have missed) — 429
`slo_unattainable` while the pool has its whole capacity, 503 `capacity_unavailable` once it has lost a
backend (turnover.capacity_lost: the server's loss, not the client's excess) — unless nothing is queued
ahead of it (the head) and either a backend has room, when it starts now whatever the prediction, or it
waits only for a slot that the backends' turnover frees in time for its own prefill at the engine's nominal
rate. Past the head the slots are predicted too: the requests ahead take the free slots first, and the
ones lacking free at the pool's turnover — when decodes hold every slot (or a tenant is held to its share),
that, not prefill, is the wait. Once queued, a request is shed by deadline (the same refusal, from a sweep)
only when it is late even if sent at once (its slack below 0): a prediction decides who enters, never who
is turned out after waiting. Under a backlog adaptive LIFO (queue.py) serves the newest first, so the
requests that run out of slack are the oldest, not a random share of all.
Depth is capped per class; when full, a more urgent arrival displaces the newest request of the lowest
band below it (503 `displaced`), else it is refused (503 `queue_full`). Every class is bounded by its
max wait (503 `queue_timeout`). A request queued again after its dispatch (`Entry.requeued`: a loan
revoked, or its backend failed before the first byte) was admitted: it is never
refused, shed by deadline or displaced, and bound by its max wait only while no backend is available (it
would wait for nothing). Every refusal is counted by (reason, class). An admitted request keeps the first
token it was judged by (`Ticket.predicted_first_token`; its response says it, `x-omnigate-predicted-ttft-ms`),
so the predictor's calibration is measurable from outside (bench/family.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from gateway.admission.queue import Entry, SLOQueue
from gateway.admission.samples import RecentSamples
from gateway.admission.settings import QueuePolicy
from gateway.request.errors import ApiError, ErrorCode

SLACK_HEADER = "x-omnigate-slack-ms"
"""On a deadline refusal: ms the request could still have waited had it then prefilled at once at the
engine's nominal rate; negative, it could not have met its deadline even dispatched at the refusal."""

SlotWait = Callable[[Entry, float, int], float | None]
"""(entry, now, requests ahead of it) → seconds until a backend could take it (Dispatcher.slot_wait)."""


class PrefillRate:
    """Per-backend prefill throughput in tokens/s, for start-time predictions.

    A request's prompt / TTFT only bounds the engine's prefill rate from below: its TTFT also holds the
    engine's own queue, the decode step in flight, the prefills batched with it — and the gateway's own
    delays between dispatch and the first byte. An average of such samples runs low, and lowest under
    load — exactly when a flood of low-priority work then makes high-priority requests look unattainable.
    So the rate is an upper quantile (nearest rank) of the recent per-request samples: the requests that
    met an idle engine measure the engine, the others measure their queueing. Three guards keep one bad
    spell (an overloaded gateway reads every TTFT as prefill time) from becoming a permanent outage:
    prompts under `prefill_rate_min_prompt_tokens` give no sample (their TTFT is fixed overhead), samples
    expire after `prefill_rate_max_age_s`, and the rate never falls below `prefill_rate_floor_fraction` of
    the policy prior. Until `prefill_rate_min_samples` live samples exist, the prior holds.
    """

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self._samples = RecentSamples(policy.prefill_rate_window, policy.prefill_rate_max_age_s)
        self.tokens_per_s = policy.initial_prefill_tokens_per_s

    def configure(self, policy: QueuePolicy) -> None:
        """Apply a reloaded queue policy, keeping the most recent samples that still fit the window."""
        if policy is not self.policy:
            self.policy = policy
            self._samples.resize(policy.prefill_rate_window, policy.prefill_rate_max_age_s)
            self._estimate()

    def observe(self, tokens: int, seconds: float, now: float) -> None:
        """One request's prompt tokens and seconds from dispatch to its first token, seen at `now`."""
        if tokens >= self.policy.prefill_rate_min_prompt_tokens and seconds > 0:
            self._samples.add(tokens / seconds, now)
            self._estimate()

    def at(self, now: float) -> float:
        """The rate as of `now`, once the samples that aged out are forgotten (a cache refresh, not a
        change: the rate is a function of the samples seen and `now`, whoever asks first)."""
        if self._samples.expire(now):
            self._estimate()
        return self.tokens_per_s

    def nominal(self, now: float) -> float:
        """The engine's own rate, not the queue-polluted measure: the larger of the measured rate and the
        policy prior (a request that goes next; the fastest plausible prefill)."""
        return max(self.at(now), self.policy.initial_prefill_tokens_per_s)

    def _estimate(self) -> None:
        p = self.policy
        if len(self._samples) < p.prefill_rate_min_samples:
            self.tokens_per_s = p.initial_prefill_tokens_per_s
            return
        measured = self._samples.quantile(p.prefill_rate_quantile)
        self.tokens_per_s = max(measured, p.prefill_rate_floor_fraction * p.initial_prefill_tokens_per_s)


class WaitCalibration:
    """How admission's predictions turned out: for admitted streams that were judged by a wait (not
    started at once), their time from queueing to the first byte, actual ÷ predicted (a whole answer shows
    no first byte, so only streams measure).

    A prediction is a point estimate of a queue that changes behind it (requests ahead are shed, cancelled
    or finish early; arrivals pass it), so refusing every request whose point estimate misses its deadline
    turns away many that would have met it. Admission refuses only when the request would miss its
    deadline even had it waited as little, against its prediction, as the quickest `1 − refusal_confidence`
    share of recent admitted requests did: the factor is that quantile of the ratios, at most 1 (a
    pessimistic record never makes admission stricter than the prediction). Until
    `calibration_min_samples` recent samples exist, the factor is 1.
    """

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self._samples = RecentSamples(policy.calibration_window, policy.prefill_rate_max_age_s)

    def configure(self, policy: QueuePolicy) -> None:
        if policy is not self.policy:
            self.policy = policy
            self._samples.resize(policy.calibration_window, policy.prefill_rate_max_age_s)

    def observe(self, predicted_s: float, actual_s: float, now: float) -> None:
        """One admitted request's predicted and actual seconds from queueing to its first token."""
        if predicted_s > 0 and actual_s >= 0:
            self._samples.add(actual_s / predicted_s, now)

    def factor(self, now: float) -> float:
        """What a predicted wait is multiplied by before it may refuse a request (≤ 1)."""
        confidence = self.policy.refusal_confidence
        self._samples.expire(now)
        if confidence is None or len(self._samples) < self.policy.calibration_min_samples:
            return 1.0
        return min(1.0, self._samples.quantile(1.0 - confidence))


@dataclass(frozen=True, slots=True)
class Prediction:
    ahead_tokens: int
    start: float
    first_token: float


class QueueGuard:
    """Admission and shedding of one pool's queue. `slot_wait(entry, now)` tells when a backend could take
    `entry` (Dispatcher.slot_wait: 0.0 now, seconds at the recent slot turnover, None unknown).

    The head — nothing queued ahead of it — is judged by that, not by the queue prediction: with room
    now it is never refused (it would start at once, so a wrong rate estimate must not turn it away, and
    could never be corrected if it did); waiting only for a slot, it is kept while the predicted slot
    plus its own prefill at the engine's nominal rate (the larger of the measured rate and the policy
    prior: the head goes next, and the measured rate is a lower bound polluted by queueing) still meets
    its deadline. Without a turnover to predict from, the queue prediction decides as for any entry."""

    def __init__(
        self,
        queue: SLOQueue,
        rate: PrefillRate,
        pool: str,
        slot_wait: SlotWait | None = None,
        capacity_lost: Callable[[], str | None] = lambda: None,
    ) -> None:
        self.queue = queue
        self.rate = rate
        self.pool = pool
        self.slot_wait = slot_wait
        self.capacity_lost = capacity_lost  # what the pool lost (turnover.capacity_lost); None: whole
        self.calibration = WaitCalibration(rate.policy)
        self.rejections: Counter[tuple[str, str]] = Counter()

    def predict(self, entry: Entry, now: float, backends: float, ahead: int | None = None) -> Prediction:
        """`ahead` defaults to the queue's projection for `entry` (SLOQueue.prefill_ahead)."""
        per_backend = self.rate.at(now)
        if ahead is None:
            ahead = self.queue.prefill_ahead(entry)
        start = now + ahead / (per_backend * (backends if backends > 0 else 1))
        return Prediction(ahead, start, start + entry.prompt_tokens / per_backend)

    def admit(
        self,
        entry: Entry,
        now: float,
        backends: float,
        full: frozenset[str] = frozenset(),
        slot_wait: SlotWait | None = None,
    ) -> Entry | None:
        """Queue `entry` or raise its refusal; returns the entry it displaced (already removed), if any.
        `full`: the buckets at their cap on every backend (their requests are passed by, queue.Ahead);
        `slot_wait` replaces the guard's own for this entry (the scheduler's keeps the decision it made)."""
        self.queue.stamp(entry)
        if entry.requeued:
            self.queue.push(entry)
            return None
        entries_ahead, ahead = self.queue.ahead_of(entry, full)
        slot_wait = slot_wait or self.slot_wait
        refusal, first = self._unattainable(entry, now, backends, ahead, entries_ahead, slot_wait)
        if refusal is not None:
            raise refusal
        entry.ticket.predicted_first_token = first
        cls = entry.ticket.traffic_class
        victim = None
        if self.queue.class_depth(cls) >= entry.slo.max_queue_depth:
            victim = self.queue.newest_of_lowest_band(cls, below=entry.band)
            if victim is None:
                raise self._refuse(
                    ErrorCode.QUEUE_FULL,
                    cls,
                    ApiError(
                        503,
                        f"The {cls} queue of pool {self.pool} is full ({entry.slo.max_queue_depth} waiting).",
                        code=ErrorCode.QUEUE_FULL,
                        retry_after=1.0,
                    ),
                )
            self.queue.remove(victim)
            self._refuse(ErrorCode.DISPLACED, cls, displaced_error())
        self.queue.push(entry)
        return victim

    def refusal_factor(self, now: float) -> float:
        """What a predicted wait is scaled by before it may refuse a request (WaitCalibration.factor)."""
        self.calibration.configure(self.queue_policy)
        return self.calibration.factor(now)

    def calibrate(self, entry: Entry, now: float) -> None:
        """`entry`, admitted on a predicted wait, saw its first byte at `now`: how its prediction held."""
        predicted = entry.ticket.predicted_first_token
        if entry.judged_by_wait and not entry.requeued and predicted is not None:
            self.calibration.configure(self.queue_policy)
            self.calibration.observe(predicted - entry.enqueued_at, now - entry.enqueued_at, now)

    def sent_now(self, entry: Entry, now: float) -> float:
        """`entry`'s first token if it were dispatched at `now` and prefilled at the engine's nominal rate."""
        return now + entry.prompt_tokens / self.rate.nominal(now)

    def slack(self, entry: Entry, now: float) -> float:
        """Seconds `entry` could still wait and meet its deadline if it then prefilled at once at the
        engine's nominal rate (negative: late even if dispatched now)."""
        return entry.deadline - self.sent_now(entry, now)

    def rushed(self, entry: Entry, now: float) -> bool:
        """Has `entry`'s slack fallen under `rush_slack_fraction` of its deadline budget, and not below 0?
        Only a request with a first-token deadline it can still meet: the pacing that held it must now
        yield to that deadline (one that cannot meet it even sent at once is not worth the pacing)."""
        fraction = self.queue_policy.rush_slack_fraction
        if fraction is None or entry.slo.ttft_p99_s is None:
            return False
        return 0.0 <= self.slack(entry, now) < fraction * (entry.deadline - entry.ticket.arrival)

    @property
    def queue_policy(self) -> QueuePolicy:
        return self.rate.policy

    def sweep(self, now: float, backends: float) -> list[tuple[Entry, ApiError]]:
        """Remove every waiting entry past its max wait, and every one that became late even if sent at
        once (`_became_late`): a queued request is shed by deadline only once it certainly cannot meet it,
        so no prediction error turns away one that would have. Which queued requests make it is the
        queue's order to settle (adaptive LIFO serves a backlogged tenant newest first; the oldest run out
        of slack and go)."""
        out: list[tuple[Entry, ApiError]] = []
        for entry in self.queue.entries():
            if now - entry.enqueued_at >= entry.slo.max_wait_s and (not entry.requeued or not backends):
                self.queue.remove(entry)
                err = ApiError(
                    503,
                    f"Waited {entry.slo.max_wait_s:g}s in the queue of pool {self.pool} unserved.",
                    code=ErrorCode.QUEUE_TIMEOUT,
                    retry_after=1.0,
                )
                out.append((entry, self._refuse(ErrorCode.QUEUE_TIMEOUT, entry.ticket.traffic_class, err)))
            elif entry.slo.shed_by_deadline and not entry.requeued and self._became_late(entry, now):
                self.queue.remove(entry)
                p = Prediction(0, now, self.sent_now(entry, now))
                out.append((entry, self._deadline_refusal(entry, now, p, None, "late even if sent now")))
        return out

    def _became_late(self, entry: Entry, now: float) -> bool:
        """Is `entry` late even if sent at once, and was not when it was queued? (One late already then was
        let in as the head with a backend's room: it starts at once whatever the rate says.)"""
        return self.slack(entry, now) < 0 <= self.slack(entry, entry.enqueued_at)

    def _unattainable(
        self,
        entry: Entry,
        now: float,
        backends: float,
        ahead: int,
        entries_ahead: int,
        slot_wait: SlotWait | None,
    ) -> tuple[ApiError | None, float | None]:
        """The refusal of an entry predicted to miss its deadline (None when it may wait), and the first
        token predicted for one that may (None for a class that does not shed by deadline). `ahead`:
        prefill tokens, `entries_ahead`: requests, dispatched before it (0: the head)."""
        if not entry.slo.shed_by_deadline or entry.requeued:
            return None, None

        def ask() -> float | None:  # asked only where it decides: it costs a dispatcher decision
            return None if slot_wait is None else slot_wait(entry, now, entries_ahead)

        head = entries_ahead == 0
        wait = ask() if head else None
        p = self.predict(entry, now, backends, ahead)
        if head and wait == 0.0:  # room now: it starts at once, whatever the rate says
            return None, self._first_token(entry, now, p, wait)
        factor = self.refusal_factor(now)
        entry.judged_by_wait = True
        if (
            head
            and wait is not None
            and self._in_time(entry, now, self._after_slot(entry, now, wait), factor)
        ):
            return None, self._first_token(entry, now, p, wait)
        if self._in_time(entry, now, p.first_token, factor):
            if head:
                return None, self._first_token(entry, now, p, wait)
            wait = ask()
            if wait is None or self._in_time(entry, now, self._after_slot(entry, now, wait), factor):
                return None, self._first_token(entry, now, p, wait)
        elif not head:
            wait = ask()  # for the refusal's words
        return self._deadline_refusal(entry, now, p, wait), None

    @staticmethod
    def _in_time(entry: Entry, now: float, first_token: float, factor: float) -> bool:
        """Does a first token predicted at `first_token` meet `entry`'s deadline, its wait from `now`
        scaled by the calibration `factor` (WaitCalibration: a refusal needs the prediction to miss by
        more than its recent error)?"""
        return now + (first_token - now) * factor <= entry.deadline

    def _first_token(self, entry: Entry, now: float, p: Prediction, wait: float | None) -> float:
        """The predicted first token: the queue's prediction, or later when a slot frees only `wait`
        seconds from now and the prompt then prefills at the engine's nominal rate."""
        if wait is None:
            return p.first_token
        return max(p.first_token, self._after_slot(entry, now, wait))

    def _after_slot(self, entry: Entry, now: float, wait: float) -> float:
        """`entry`'s first token if a slot frees `wait` seconds from now and it then prefills at the
        engine's nominal rate."""
        return self.sent_now(entry, now) + wait

    def _deadline_refusal(
        self, entry: Entry, now: float, p: Prediction, wait: float | None, slot: str | None = None
    ) -> ApiError:
        """429 `slo_unattainable` while the pool has its whole capacity (the client asks more than it
        can serve in time); 503 `capacity_unavailable` once it has lost backends (the server's loss: a
        client that backs off as from a 429 would wait for nothing it caused). Either names the predicted
        slot and first token against the deadline; Retry-After is when the predicted wait ends, and
        `x-omnigate-slack-ms` the request's slack (`slack`; negative: late even if sent at once)."""
        cls = entry.ticket.traffic_class
        first = self._first_token(entry, now, p, wait)
        if slot is None:
            slot = "no slot turnover measured" if wait is None else f"a slot free in {wait:.3f}s"
        budget = entry.slo.deadline_budget_s
        said = (
            f"{slot}, first token predicted in {first - now:.3f}s; the deadline is in "
            f"{entry.deadline - now:.3f}s" + ("" if budget is None else f" (SLO {budget:g}s)")
        )
        retry_after = max(1.0, p.start - now, wait or 0.0)
        lost = self.capacity_lost()
        if lost is None:
            status, code, message = 429, ErrorCode.SLO_UNATTAINABLE, f"Cannot meet the {cls} deadline"
        else:
            status, code = 503, ErrorCode.CAPACITY_UNAVAILABLE
            message = f"Capacity lost ({lost}), the {cls} deadline cannot be met"
        slack = {SLACK_HEADER: f"{self.slack(entry, now) * 1000:.1f}"}
        err = ApiError(status, f"{message}: {said}.", code=code, retry_after=retry_after, headers=slack)
        return self._refuse(code, cls, err)

    def _refuse(self, reason: str, traffic_class: str, err: ApiError) -> ApiError:
        self.rejections[(reason, traffic_class)] += 1
        return err


def displaced_error() -> ApiError:
    return ApiError(
        503, "Displaced from the queue by higher-priority work.", code=ErrorCode.DISPLACED, retry_after=1.0
    )
