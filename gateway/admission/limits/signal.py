"""The controllers' signals: a finished request's latency relative to its class objectives.

    tpot_ratio    = TPOT / TPOT target
    latency_ratio = max(tpot_ratio, (TTFT − estimated prefill time) / TTFT target)

1.0 means "exactly at the class SLO". TTFT counts only its queueing part: the prefill a long prompt
needs is not the engine being overloaded. The target limit steers `tpot_ratio` alone (see target.py).
"""

from __future__ import annotations

from gateway.admission.settings import SLOClass


def latency_ratio(
    slo: SLOClass,
    ttft_s: float | None,
    tpot_s: float | None,
    prefill_s: float,
    shared_tpot_p99_s: float | None = None,
) -> float | None:
    """None when no target applies. A class without a TPOT target is judged by `shared_tpot_p99_s`,
    the tightest target among the requests that share its backend's decode batch: its TPOT is theirs."""
    tpot = tpot_ratio(slo, tpot_s, shared_tpot_p99_s)
    parts = [] if tpot is None else [tpot]
    if slo.ttft_p99_s is not None and ttft_s is not None:
        parts.append(max(0.0, ttft_s - prefill_s) / slo.ttft_p99_s)
    return max(parts) if parts else None


def tpot_ratio(slo: SLOClass, tpot_s: float | None, shared_tpot_p99_s: float | None = None) -> float | None:
    """TPOT / the class target (or the shared decode batch's, as in `latency_ratio`); None without one."""
    target = slo.tpot_p99_s if slo.tpot_p99_s is not None else shared_tpot_p99_s
    return None if target is None or tpot_s is None else tpot_s / target
