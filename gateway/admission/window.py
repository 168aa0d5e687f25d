"""Adaptive batching window: when the next dispatch round of a pool may open.

A round (dispatch.py) is the period over which the prefill budget is metered. When no round is open
and requests wait, the window decides how long to hold them so one round releases a group instead of
a trickle of single prefills. It looks at the top waiting band only (depth, oldest request), so work of
a lower band never holds a higher one:

    light load (depth ≤ light_load_queue_depth) or a full round's group already queued → open now
    otherwise  w = max_window_s · min(1, (depth − light) / full_window_depth)
               w = min(w, slack_fraction · max(0, slack of the oldest waiting request))
               open at  oldest_enqueued_at + w

Slack = deadline − now − the request's own prefill time, so the window never spends slack the oldest
request does not have. Pools named in `accumulate` (offline) instead hold until `tokens` prefill tokens
are queued or the oldest request waited `max_wait_s`. `length_s` is the last computed hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admission.settings import WindowPolicy


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """What the window looks at: the top waiting band of one pool's queue at one instant."""

    band: int
    depth: int
    prefill_tokens: int
    oldest_enqueued_at: float
    oldest_slack_s: float
    round_tokens: int  # prefill budget per round × available backends


class BatchWindow:
    def __init__(self) -> None:
        self.length_s = 0.0

    def opens_at(self, pool: str, load: QueueLoad, policy: WindowPolicy) -> float:
        """The time the next round may open (at or before now means: open it now)."""
        self.length_s = self._length(pool, load, policy)
        return load.oldest_enqueued_at + self.length_s

    @staticmethod
    def _length(pool: str, load: QueueLoad, policy: WindowPolicy) -> float:
        if not policy.enabled:
            return 0.0
        acc = policy.accumulate.get(pool)
        if acc is not None:
            return 0.0 if load.prefill_tokens >= acc.tokens else acc.max_wait_s
        if load.depth <= policy.light_load_queue_depth or load.prefill_tokens >= load.round_tokens:
            return 0.0
        w = policy.max_window_s * min(
            1.0, (load.depth - policy.light_load_queue_depth) / policy.full_window_depth
        )
        return min(w, policy.slack_fraction * max(0.0, load.oldest_slack_s))
