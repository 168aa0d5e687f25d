"""Knee detection and the SLO-constrained recommendation over a sweep's points (pure functions).

Knee: walking up the ladder, the first step whose relative throughput gain falls below `min_gain`
while the tail latency rises by more than `min_rise` (relative); the knee is the point *before* that
step — the last one where more capacity still bought throughput cheaply.

Recommendation (the seed's rule): the highest-throughput point that meets every SLO with a headroom
margin (P99 ≤ SLO × (1 − headroom)), has no OOM and an error rate within bounds. Every rejected point
gets a reason a human can read, e.g. "48: TPOT P99 82 ms > 60 ms".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SLO_LABELS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "E2E"}


def dig(doc: dict[str, Any], path: str) -> Any:
    """doc["a"]["b"]["c"] for path "a.b.c"; None when any step is missing."""
    node: Any = doc
    for part in path.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return None
        node = node[part]
    return node


def find_knee(
    throughputs: list[float], latencies: list[float], min_gain: float = 0.15, min_rise: float = 0.3
) -> int | None:
    """Index of the knee point, or None when throughput never flattens against a steep latency rise."""
    for i in range(1, len(throughputs)):
        prev_t, prev_l = throughputs[i - 1], latencies[i - 1]
        if prev_t <= 0 or prev_l <= 0:
            continue
        gain = (throughputs[i] - prev_t) / prev_t
        rise = (latencies[i] - prev_l) / prev_l
        if gain < min_gain and rise > min_rise:
            return i - 1
    return None


@dataclass(slots=True)
class Recommendation:
    index: int | None
    reasons: dict[int, str] = field(default_factory=dict)


def _fmt(v: float) -> str:
    return f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}"


def rejection(
    label: str,
    summary: dict[str, Any],
    oom: dict[str, Any],
    slo: dict[str, float | None],
    headroom: float,
    max_error_rate: float,
) -> str | None:
    """Why this point fails, or None if it passes."""
    problems = []
    if oom.get("detected"):
        problems.append(f"OOM ({oom.get('crashes', 0)} crashes, {oom.get('error_bursts', 0)} error bursts)")
    err = summary.get("error_rate", 0.0)
    if err > max_error_rate:
        problems.append(f"error rate {err:.1%} > {max_error_rate:.1%}")
    for key, name in SLO_LABELS.items():
        limit = slo.get(key)
        if limit is None:
            continue
        p99 = dig(summary, f"{key}.p99")
        bound = limit * (1 - headroom)
        if p99 is None:
            problems.append(f"no {name} measured")
        elif p99 > bound:
            margin = f" ({_fmt(limit)} ms − {headroom:.0%} headroom)" if headroom else ""
            problems.append(f"{name} P99 {_fmt(p99)} ms > {_fmt(bound)} ms{margin}")
    return f"{label}: " + "; ".join(problems) if problems else None


def recommend(
    labels: list[str],
    results: list[dict[str, Any]],
    slo: dict[str, float | None],
    headroom: float = 0.0,
    max_error_rate: float = 0.01,
    throughput_key: str = "summary.output_throughput",
) -> Recommendation:
    """Pick the highest-throughput passing point; `results` are run documents (see results.py)."""
    rec = Recommendation(None)
    best = -1.0
    for i, (label, res) in enumerate(zip(labels, results, strict=True)):
        reason = rejection(label, res.get("summary", {}), res.get("oom", {}), slo, headroom, max_error_rate)
        if reason:
            rec.reasons[i] = reason
            continue
        thr = dig(res, throughput_key) or 0.0
        if thr > best:
            best, rec.index = thr, i
    return rec
