"""Honest early rejection: who may enter a pool's queue, and who must leave it before being served.

Predicted start = now + (prefill tokens the queue dispatches first, SLOQueue.projected) / (per-backend
prefill rate × available backends); predicted first token = start + own prefill tokens / per-backend
rate. A request of a class that sheds by deadline is refused (429 `slo_unattainable`) as soon as its
predicted first token falls after its deadline: at enqueue, and again on every sweep while it waits.
Depth is capped per class; when full, a more urgent arrival displaces the newest request of the lowest
band below it (503 `displaced`), else it is refused (503 `queue_full`). Every class is bounded by its
max wait (503 `queue_timeout`). Every refusal is counted by (reason, class).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass

from gateway.admission.queue import Entry, SLOQueue
from gateway.admission.settings import QueuePolicy
from gateway.errors import ApiError


class PrefillRate:
    """Per-backend prefill throughput in tokens/s, for start-time predictions.

    A request's prompt / TTFT only bounds the engine's prefill rate from below: its TTFT also holds the
    engine's own queue, the decode step in flight and the prefills batched with it. An average of such
    samples runs low, and lowest under load — exactly when a flood of low-priority work then makes
    high-priority requests look unattainable. So the rate is an upper quantile (nearest rank) of the last
    `prefill_rate_window` per-request samples: the requests that met an idle engine measure the engine, the
    others measure their queueing. Until `prefill_rate_min_samples` samples arrived, the policy prior holds.
    """

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self._samples: deque[float] = deque(maxlen=policy.prefill_rate_window)
        self.tokens_per_s = policy.initial_prefill_tokens_per_s

    def configure(self, policy: QueuePolicy) -> None:
        """Apply a reloaded queue policy, keeping the most recent samples that still fit the window."""
        if policy is not self.policy:
            self.policy = policy
            self._samples = deque(self._samples, maxlen=policy.prefill_rate_window)
            self._estimate()

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self._samples.append(tokens / seconds)
            self._estimate()

    def _estimate(self) -> None:
        p = self.policy
        if len(self._samples) < p.prefill_rate_min_samples:
            self.tokens_per_s = p.initial_prefill_tokens_per_s
            return
        ranked = sorted(self._samples)
        self.tokens_per_s = ranked[max(0, math.ceil(p.prefill_rate_quantile * len(ranked)) - 1)]


@dataclass(frozen=True, slots=True)
class Prediction:
    ahead_tokens: int
    start: float
    first_token: float


class QueueGuard:
    def __init__(self, queue: SLOQueue, rate: PrefillRate, pool: str) -> None:
        self.queue = queue
        self.rate = rate
        self.pool = pool
        self.rejections: Counter[tuple[str, str]] = Counter()

    def predict(self, entry: Entry, now: float, backends: int, ahead: int | None = None) -> Prediction:
        """`ahead` defaults to the queue's projection for `entry` (SLOQueue.projected)."""
        per_backend = self.rate.tokens_per_s
        if ahead is None:
            ahead = self.queue.prefill_ahead(entry)
        start = now + ahead / (per_backend * max(1, backends))
        return Prediction(ahead, start, start + entry.prompt_tokens / per_backend)

    def admit(self, entry: Entry, now: float, backends: int) -> Entry | None:
        """Queue `entry` or raise its refusal; returns the entry it displaced (already removed), if any."""
        self.queue.stamp(entry)
        refusal = self._unattainable(entry, now, backends)
        if refusal is not None:
            raise refusal
        cls = entry.ticket.traffic_class
        victim = None
        if self.queue.class_depth(cls) >= entry.slo.max_queue_depth:
            victim = self.queue.newest_of_lowest_band(cls, below=entry.band)
            if victim is None:
                raise self._refuse(
                    "queue_full",
                    cls,
                    ApiError(
                        503,
                        f"The {cls} queue of pool {self.pool} is full ({entry.slo.max_queue_depth} waiting).",
                        code="queue_full",
                        retry_after=1.0,
                    ),
                )
            self.queue.remove(victim)
            self._refuse("displaced", cls, displaced_error())
        self.queue.push(entry)
        return victim

    def sweep(self, now: float, backends: int) -> list[tuple[Entry, ApiError]]:
        """Remove every waiting entry past its max wait or that can no longer meet its deadline."""
        out: list[tuple[Entry, ApiError]] = []
        for entry in self.queue.entries():
            if now - entry.enqueued_at >= entry.slo.max_wait_s:
                self.queue.remove(entry)
                err = ApiError(
                    503,
                    f"Waited {entry.slo.max_wait_s:g}s in the queue of pool {self.pool} unserved.",
                    code="queue_timeout",
                    retry_after=1.0,
                )
                out.append((entry, self._refuse("queue_timeout", entry.ticket.traffic_class, err)))
        shed_tokens = 0  # every entry shed below was projected ahead of the ones after it
        for entry, ahead in list(self.queue.projected()):
            refusal = self._unattainable(entry, now, backends, ahead - shed_tokens)
            if refusal is not None:
                self.queue.remove(entry)
                shed_tokens += entry.prompt_tokens
                out.append((entry, refusal))
        return out

    def _unattainable(
        self, entry: Entry, now: float, backends: int, ahead: int | None = None
    ) -> ApiError | None:
        if not entry.slo.shed_by_deadline:
            return None
        p = self.predict(entry, now, backends, ahead)
        if p.first_token <= entry.deadline:
            return None
        err = ApiError(
            429,
            f"Cannot meet the {entry.ticket.traffic_class} deadline: first token predicted in "
            f"{p.first_token - now:.3f}s, deadline in {entry.deadline - now:.3f}s.",
            code="slo_unattainable",
            retry_after=max(1.0, p.start - now),
        )
        return self._refuse("slo_unattainable", entry.ticket.traffic_class, err)

    def _refuse(self, reason: str, traffic_class: str, err: ApiError) -> ApiError:
        self.rejections[(reason, traffic_class)] += 1
        return err


def displaced_error() -> ApiError:
    return ApiError(
        503, "Displaced from the queue by higher-priority work.", code="displaced", retry_after=1.0
    )
