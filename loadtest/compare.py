"""`compare A.json B.json`: the regression check to run on every scheduling change.

Prints each headline metric of both runs with the relative change, flagging changes beyond a
threshold in the bad direction (latency up, throughput or attainment down).
"""

from __future__ import annotations

from typing import Any

from loadtest.knee import dig
from loadtest.report import queue_p99

# (label, path or extractor, higher is better)
METRICS: list[tuple[str, Any, bool]] = [
    ("output tokens/s", "summary.output_throughput", True),
    ("requests/s", "summary.request_throughput", True),
    ("goodput req/s", "summary.goodput", True),
    ("SLO attainment", "summary.slo_attainment", True),
    ("TTFT P50 ms", "summary.ttft_ms.p50", False),
    ("TTFT P99 ms", "summary.ttft_ms.p99", False),
    ("TPOT P50 ms", "summary.tpot_ms.p50", False),
    ("TPOT P99 ms", "summary.tpot_ms.p99", False),
    ("ITL P99 ms", "summary.itl_ms.p99", False),
    ("E2E P99 ms", "summary.e2e_ms.p99", False),
    ("queue P99 ms", queue_p99, False),
    ("rejection rate", "summary.rejection_rate", False),
    ("error rate", "summary.error_rate", False),
    ("KV peak", "backend.kv_usage.peak", False),
    ("retractions", "backend.retractions", False),
]


def _value(doc: dict[str, Any], how: Any) -> float | None:
    v = dig(doc, how) if isinstance(how, str) else how(doc)
    return None if v is None else float(v)


Row = tuple[str, float | None, float | None, float | None, bool]  # label, A, B, relative change, regression


def compare_rows(a: dict[str, Any], b: dict[str, Any], threshold: float = 0.05) -> list[Row]:
    """Each headline metric either run has, with the relative change and whether it is a regression."""
    rows: list[Row] = []
    for label, how, higher_better in METRICS:
        va, vb = _value(a, how), _value(b, how)
        if va is None and vb is None:
            continue
        if va is None or vb is None:
            rows.append((label, va, vb, None, False))
            continue
        change = (vb - va) / abs(va) if va else (0.0 if vb == va else float("inf"))
        worse = change < -threshold if higher_better else change > threshold
        rows.append((label, va, vb, change, worse))
    return rows


def compare(a: dict[str, Any], b: dict[str, Any], threshold: float = 0.05) -> tuple[list[str], int]:
    """Lines of the comparison and the number of regressions beyond `threshold` (relative)."""
    lines = [f"{'metric':<18}{'A':>12}{'B':>12}{'change':>10}"]
    rows = compare_rows(a, b, threshold)
    for label, va, vb, change, worse in rows:
        shown = "n/a" if change is None else f"{change:+.1%}"
        lines.append(f"{label:<18}{num(va):>12}{num(vb):>12}{shown:>10}" + ("  REGRESSION" if worse else ""))
    return lines, sum(row[4] for row in rows)


def num(v: float | None) -> str:
    return "–" if v is None else f"{v:.4g}"
