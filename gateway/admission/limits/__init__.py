"""Adaptive concurrency limits, one per backend, behind one interface (after Netflix concurrency-limits).

`limit.update(sample)` feeds one finished request (`base.Sample`: plain numbers); `limit.limit` is the
current cap on active requests, within the policy's [min, max] and under the engine's own cap
(`ceiling`); `limit.value` is the state another replica can follow. One module per algorithm, each
opening with its formula: `fixed`, `aimd`, `gradient` (Gradient2), `target` (the SLO-aimed default);
`signal.latency_ratio` is the sample's latency relative to the class objectives.
"""

from __future__ import annotations

from gateway.admission.limits.aimd import AIMDLimit
from gateway.admission.limits.base import Limit, Sample
from gateway.admission.limits.fixed import FixedLimit
from gateway.admission.limits.gradient import GradientLimit
from gateway.admission.limits.signal import latency_ratio, tpot_ratio
from gateway.admission.limits.target import TargetLimit
from gateway.admission.settings import ControllerPolicy

_ALGORITHMS: dict[str, type[FixedLimit | AIMDLimit | GradientLimit | TargetLimit]] = {
    "fixed": FixedLimit,
    "aimd": AIMDLimit,
    "gradient": GradientLimit,
    "target": TargetLimit,
}


def make_limit(policy: ControllerPolicy, start: float | None = None) -> Limit:
    """A limit of the policy's algorithm; `start` carries the current value over a policy reload."""
    return _ALGORITHMS[policy.algorithm](policy, None if policy.algorithm == "fixed" else start)


__all__ = [
    "AIMDLimit",
    "FixedLimit",
    "GradientLimit",
    "Limit",
    "Sample",
    "TargetLimit",
    "latency_ratio",
    "make_limit",
    "tpot_ratio",
]
