"""Adaptive batching window: when the next dispatch round of a pool may open.

A round (rounds.py) is the period over which the prefill budget is metered. When no round is open
and requests wait, the window decides how long to hold them so that, under load, one round releases a
group instead of a trickle of single prefills. Load is prefill demand against the round's budget — not
a request count, so a stream of tiny requests is no load and always goes at once:

    level = (prefill tokens released by the current or just-ended round + tokens queued, both at the
             top waiting band and above) / (prefill_tokens_per_round × available backends)

It looks at the top waiting band only, so work of a lower band never holds a higher one:

    level ≤ light_load, or a full round's group already queued (all bands) → open now
    otherwise  w = max_window_s · min(1, (level − light_load) / (full_load − light_load))
               w = min(w, slack_fraction · max(0, slack of the oldest waiting request))
               open at  oldest_enqueued_at + w

Slack = deadline − now − the request's own prefill time, so the window never spends slack the oldest
request does not have. Pools named in `accumulate` (offline) instead hold until `tokens` prefill tokens
are queued or the oldest request waited `max_wait_s`. Pure functions: the scheduler keeps the hold its
last dispatch pass computed (the `window_s` gauge).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.admission.settings import WindowPolicy


@dataclass(frozen=True, slots=True)
class QueueLoad:
    """What the window looks at: the top waiting band of one pool's queue at one instant."""

    band: int
    band_prefill_tokens: int  # queued at the top band
    recent_prefill_tokens: int  # released at the top band and above by the current / just-ended round
    prefill_tokens: int  # queued, every band
    oldest_enqueued_at: float
    oldest_slack_s: float
    round_tokens: int  # prefill budget per round × available backends

    @property
    def level(self) -> float:
        """Prefill demand of the top band against one round's budget (1.0 = a full round)."""
        return (self.recent_prefill_tokens + self.band_prefill_tokens) / self.round_tokens


def under_load(level: float, policy: WindowPolicy) -> bool:
    """Does this prefill load hold requests (window, grouped rounds)? Never when the window is off."""
    return policy.enabled and level > policy.light_load


def opens_at(pool: str, load: QueueLoad, policy: WindowPolicy) -> float:
    """The time the next round may open (at or before now means: open it now)."""
    return load.oldest_enqueued_at + hold(pool, load, policy)


def hold(pool: str, load: QueueLoad, policy: WindowPolicy) -> float:
    """How long after the oldest waiting request's arrival the next round opens."""
    if not policy.enabled:
        return 0.0
    acc = policy.accumulate.get(pool)
    if acc is not None:
        return 0.0 if load.prefill_tokens >= acc.tokens else acc.max_wait_s
    if not under_load(load.level, policy) or load.prefill_tokens >= load.round_tokens:
        return 0.0
    light = policy.light_load
    w = policy.max_window_s * min(1.0, (load.level - light) / (policy.full_load - light))
    return min(w, policy.slack_fraction * max(0.0, load.oldest_slack_s))
