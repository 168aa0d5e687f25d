"""The pool's state for /admin/state: enough to tell why a request waits.

A rendering of a `PoolView` the scheduler hands over (`PoolScheduler.snapshot`): the scheduler builds
the view's decision the way its dispatch passes do, but without keeping anything, so what this reports
is what the next `pump()` would see and reading it changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.admission.blocks import Block
from gateway.admission.budgets import kv_occupied
from gateway.admission.decision import Decision
from gateway.admission.dispatch import Dispatcher
from gateway.admission.queue import Entry, SLOQueue
from gateway.backends.state import BackendState


@dataclass(frozen=True, slots=True)
class PoolView:
    """What one read of a pool's scheduler sees."""

    pool: str
    now: float
    ctx: Decision
    queue: SLOQueue
    dispatcher: Dispatcher
    backends: tuple[BackendState, ...]
    head: Entry | None  # the first waiting request in dispatch order
    head_blocked: dict[str, Block] | None  # what holds it, per backend ("*": all of them)
    window_s: float
    in_flight: int
    borrowed: int
    lent: int
    rejections: Mapping[tuple[str, str], int]
    limit_values: Mapping[str, float]  # each backend's limit unrounded: the controller's state
    prefill_duties: Mapping[str, float]  # each backend's share of the prefill rate the rounds meter out
    refusal_factor: float  # what a predicted wait is scaled by before it may refuse (WaitCalibration)
    shared: Mapping[str, dict[str, Any]] | None = None  # per backend URL, when replicas share the engines


def pool_snapshot(v: PoolView) -> dict[str, Any]:
    """Queue per priority (depth, oldest wait), the head of the queue and what stops it per backend
    (a `Block`), the round, the window, per-backend budgets, and rejections by reason/class."""
    now, q, d, budgets = v.now, v.queue, v.dispatcher, v.ctx.budgets
    oldest = q.oldest()
    return {
        "pool": v.pool,
        "queue_depth": len(q),
        "queue_by_priority": {str(band): n for band, n in q.depth_by_band().items()},
        "oldest_wait_by_priority": {
            str(band): now - e.enqueued_at for band in q.depth_by_band() if (e := q.oldest(band)) is not None
        },
        "queued_prefill_tokens": q.prefill_tokens(),
        "oldest_wait_s": 0.0 if oldest is None else now - oldest.enqueued_at,
        "head": _head(v),
        "window_s": v.window_s,
        "round": d.rounds.view(now, budgets),
        "in_flight": v.in_flight,
        "borrowed_in_flight": v.borrowed,
        "lent_in_flight": v.lent,
        "prefill_tokens_per_s": v.ctx.prefill_rate,
        "refusal_wait_factor": round(v.refusal_factor, 3),
        "prefill_tokens_per_round": budgets.prefill_tokens_per_round,
        "rejections": {f"{reason}/{cls}": n for (reason, cls), n in sorted(v.rejections.items())},
        "backends": [
            {
                "url": b.url,
                "available": b.available,
                "limit": v.ctx.limits[b.url],
                "limit_value": round(v.limit_values[b.url], 3),
                "prefill_duty": round(v.prefill_duties[b.url], 3),
                "active": b.active,
                "outstanding_tokens": b.outstanding_tokens,
                "reserved_kv_tokens": b.reserved_kv_tokens,
                "kv_occupied_tokens": kv_occupied(b),
                "max_total_tokens": b.max_total_tokens,
                "round_prefill_tokens": d.rounds.released(b.url),
                "pending_prefill_tokens": d.shield.unstarted(b.url, now),
                "prefix_index": b.prefix.snapshot(),
                "buckets": dict(b.bucket_active),
            }
            | ({} if v.shared is None else {"shared": v.shared[b.url]})
            for b in v.backends
        ],
    }


def _head(v: PoolView) -> dict[str, Any] | None:
    head = v.head
    if head is None:
        return None
    return {
        "id": head.ticket.id,
        "tenant": head.tenant,
        "priority": head.band,
        "wait_s": v.now - head.enqueued_at,
        "prompt_tokens": head.prompt_tokens,
        "blocked_by": v.head_blocked,
    }
