"""When the next dispatch round of a pool may open: at once, unless the pool accumulates.

A round (rounds.py) is the period over which the prefill budget is metered; it opens as soon as requests
wait. Pools named in `window.accumulate` (offline) instead hold until `tokens` prefill tokens are queued or
the oldest waiting request waited `max_wait_s`, so batch traffic reaches the engine in large groups. A
pure function: the scheduler keeps the hold its last dispatch pass computed (the `window_s` gauge).
"""

from __future__ import annotations

from gateway.admission.settings import WindowPolicy


def hold(pool: str, queued_tokens: int, policy: WindowPolicy) -> float:
    """How long after the oldest waiting request's arrival the next round opens, with `queued_tokens`
    prefill tokens waiting in `pool`."""
    acc = policy.accumulate.get(pool)
    if acc is None or queued_tokens >= acc.tokens:
        return 0.0
    return acc.max_wait_s
