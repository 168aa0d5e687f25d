"""The pool's state for /admin/state: enough to tell why a request waits.

Read-only: it asks the scheduler for the same budgets, limits and window load its decisions use, so
what it reports is what the next `pump()` would see.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from gateway.admission.dispatch import kv_occupied
from gateway.admission.settings import PoolBudgets
from gateway.policy import Policy

if TYPE_CHECKING:
    from gateway.admission.scheduler import PoolScheduler


def pool_snapshot(s: PoolScheduler) -> dict[str, Any]:
    """Queue per priority (depth, oldest wait), the head of the queue and what stops it per backend
    ("window" while the window holds; "round_group", "concurrency", "round_prefill", "prefill_shield",
    "shield_duty", "kv_watermark", "bucket_cap", "excluded", "unavailable"), the round, the window,
    per-backend budgets, and rejections by reason/class."""
    policy = s.policy_getter()
    now = s.clock()
    budgets = s.metered_budgets(policy, now)
    oldest = s.queue.oldest()
    d = s.dispatcher
    return {
        "pool": s.pool,
        "queue_depth": len(s.queue),
        "queue_by_priority": {str(band): n for band, n in s.queue.depth_by_band().items()},
        "oldest_wait_by_priority": {
            str(band): now - e.enqueued_at
            for band in s.queue.depth_by_band()
            if (e := s.queue.oldest(band)) is not None
        },
        "queued_prefill_tokens": s.queue.prefill_tokens(),
        "oldest_wait_s": 0.0 if oldest is None else now - oldest.enqueued_at,
        "head": _head(s, now, policy, budgets),
        "window_s": s.window.length_s,
        "round": {
            "open": d.round_open(now, budgets),
            "grouped": d.round_grouped,
            "age_s": None if d.round_started is None else now - d.round_started,
            "bar_priority": d.round_bar if math.isfinite(d.round_bar) else None,
            "dispatched_by_priority": {str(band): n for band, n in sorted(d.round_dispatched.items())},
        },
        "in_flight": s.in_flight,
        "borrowed_in_flight": s.borrowed,
        "lent_in_flight": s.lent,
        "preempted": s.preempted,
        "prefill_load": s.pool_level(now, budgets),
        "prefill_tokens_per_s": s.rate.at(now),
        "prefill_tokens_per_round": budgets.prefill_tokens_per_round,
        "rejections": {f"{reason}/{cls}": n for (reason, cls), n in sorted(s.rejections.items())},
        "backends": [
            {
                "url": b.url,
                "available": b.available,
                "limit": s.limits[b.url].limit,
                "active": b.active,
                "outstanding_tokens": b.outstanding_tokens,
                "reserved_kv_tokens": b.reserved_kv_tokens,
                "kv_occupied_tokens": kv_occupied(b),
                "max_total_tokens": b.max_total_tokens,
                "round_prefill_tokens": d.released(b.url),
                "pending_prefill_tokens": d.unstarted(b.url, now=now),
                "buckets": dict(b.bucket_active),
            }
            for b in s.backends
        ],
    }


def _head(s: PoolScheduler, now: float, policy: Policy, budgets: PoolBudgets) -> dict[str, Any] | None:
    """The first waiting request in dispatch order and what holds it. Between rounds: the window, if it
    still holds, else the budgets a round opened now would check."""
    head = next(s.queue.ordered(), None)
    if head is None:
        return None
    _, limits = s.decision(policy)
    if s.dispatcher.round_open(now, budgets):
        blocked = s.dispatcher.blocked_by(head, s.backends, budgets, limits)
    elif s.window.opens_at(s.pool, s.window_load(now, budgets), policy.window) > now:
        blocked = {"*": "window"}
    else:
        blocked = s.dispatcher.blocked_by(head, s.backends, budgets, limits, new_round=True)
    return {
        "id": head.ticket.id,
        "tenant": head.tenant,
        "priority": head.band,
        "wait_s": now - head.enqueued_at,
        "prompt_tokens": head.prompt_tokens,
        "blocked_by": blocked,
    }
