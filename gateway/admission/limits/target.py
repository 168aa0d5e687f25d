"""TargetLimit: aim the measured tail of the TPOT ratio at the SLO, not at a latency gradient.

    ratio = TPOT / the class's TPOT target            (`signal.tpot_ratio`)
    tail  = clamp(Q99(last tail_window ratios) / Q90(same), 1, MAX_TAIL)   the distribution's shape
    aim   = headroom / tail                       the Q90 that puts the Q99 at headroom × objective
    error = clamp(aim / Q90(last window ratios), 1/2, 2)
    limit ← limit · error^gain                    per sample; growth only while in use (in_flight ≥ limit/2)
    drop:   limit ← limit · backoff               at most once per cooldown_s

    step  = ratio · (1 − prefill share of its decode)   the decode step alone, in units of the objective
    duty  = clamp(1 − median(last window steps) / headroom, MIN_DUTY, 1)   `prefill_duty`

The objective is a P99, but the P99 of a few dozen samples is their maximum — one stalled short answer.
The recent Q90 moves with the load within seconds; the P99/P90 ratio is a property of the workload's
mix (answer lengths, prefill stalls) that changes slowly, so it is read over a longer window. A small
`gain` spreads one window's correction over several windows: a request's TPOT reflects the batch over
its whole decode, so the signal lags the limit by a decode's length. Until `window` samples exist the
limit stays where it started.

Only TPOT: the concurrency limit sets the decode batch, and the batch sets TPOT. What the engine adds to
a first token beyond the prompt's own prefill is the prefill queued ahead of it — the round's prefill
budget meters that, the queue's deadline prediction holds the TTFT objective by refusing what would miss
it, and the engine's own cap (`ceiling`) keeps requests from queueing inside the engine. Steering the
limit on TTFT as well squeezed it to its minimum on bursts of prefill that no smaller batch would have
shortened (decision 0450).

The limit sets the decode step; what stretches a TPOT beyond it is the prefill the engine runs between
two of the request's tokens (prefill goes before decode), and the TPOT tail is a short answer caught by a
burst of prompts. A request's TPOT is its step / (1 − the share of its decode time spent on prefill), so a
decoding request keeps the objective while prefill takes at most `1 − step / (headroom × objective)` of
the engine: that is the duty the round's metered prefill budget is scaled by (rounds.py), the step
recovered from each sample's TPOT and the prefill the gateway sent its engine while it decoded
(decision 0450). Until `window` samples exist the duty is 1.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, insort
from collections import deque
from itertools import islice

from gateway.admission.limits.base import Bounded, Sample
from gateway.admission.settings import ControllerPolicy

MAX_TAIL = 3.0  # a tail estimate beyond this is a handful of outliers, not the mix's shape
MIN_DUTY = 0.2  # a step alone over the aim is the limit's to cut; the queue's prefill still moves


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of sorted `values` (non-empty)."""
    return values[min(len(values), max(1, math.ceil(q * len(values)))) - 1]


class TargetLimit(Bounded):
    def __init__(self, policy: ControllerPolicy, start: float | None = None) -> None:
        super().__init__(policy, start)
        self._ratios: deque[float] = deque(maxlen=policy.tail_window)
        self._sorted: list[float] = []  # the same ratios in order: quantiles without a sort per sample
        self._steps: deque[float] = deque(maxlen=policy.window)  # decode steps / objective
        self._duty = 1.0
        self.aim: float | None = None  # observable: the Q90 aimed at, and the Q90 last measured
        self.recent_q90: float | None = None

    def update(self, sample: Sample) -> None:
        p = self.policy
        if sample.dropped:
            if self._may_decrease(sample.now):
                self._set(self._value * p.backoff, sample.now)
            return
        if sample.tpot_ratio is None:
            return
        ratio = max(sample.tpot_ratio, 1e-9)
        if len(self._ratios) == self._ratios.maxlen:
            del self._sorted[bisect_left(self._sorted, self._ratios[0])]
        self._ratios.append(ratio)
        insort(self._sorted, ratio)
        if sample.prefill_share is not None and p.duty:
            self._steps.append(sample.tpot_ratio * (1.0 - sample.prefill_share))
            if len(self._steps) == p.window:
                step = statistics.median(self._steps)
                self._duty = min(1.0, max(MIN_DUTY, 1.0 - step / p.headroom))
        if len(self._ratios) < p.window:
            return
        whole = self._sorted
        recent = sorted(islice(self._ratios, len(self._ratios) - p.window, None))
        tail = min(MAX_TAIL, max(1.0, quantile(whole, 0.99) / quantile(whole, 0.9))) if p.tail_shape else 1.0
        self.aim = p.headroom / tail
        self.recent_q90 = quantile(recent, 0.9)
        error = min(2.0, max(0.5, self.aim / self.recent_q90))
        if error > 1.0 and sample.in_flight * 2 < self.limit:
            return  # app-limited: low latency at low use says nothing about a higher limit
        self._set(self._value * error**p.gain, sample.now)

    @property
    def prefill_duty(self) -> float:
        return self._duty
