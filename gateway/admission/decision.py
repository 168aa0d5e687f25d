"""The frozen context of one dispatch decision: everything placement reads that changes between decisions.

The scheduler builds one per decision (`PoolScheduler.decision`) from the policy, the limits, the queue and
the clock, and hands it to every dispatcher call of that decision; nothing is set on the dispatcher from
outside. `/admin/state` builds its own the same way without touching the scheduler's state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.admission.settings import PoolBudgets
from gateway.admission.slots import SlotRule


@dataclass(frozen=True, slots=True)
class Decision:
    now: float
    budgets: PoolBudgets  # the pool's budgets, the round's prefill budget as metered now
    limits: Mapping[str, int]  # backend URL → its concurrency limit
    rule: SlotRule = field(default_factory=SlotRule)  # headroom for the top band and tenants under share
    pool_slots: int = 0  # Σ concurrency limits of the available backends
    prefill_rate: float = math.inf  # per-backend tokens/s: a whole request's predicted prefill
    share_window_s: float = 60.0  # time constant of the tenants' recent service
    inbound: Mapping[str, int] = field(default_factory=dict)  # URL → peers' slots whose releases come here
