"""JSON and Markdown renderings of run and sweep documents (the HTML lives in html.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from loadtest.knee import dig


def to_json(doc: dict[str, Any]) -> bytes:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.write_bytes(to_json(doc))


def load_json(path: Path) -> dict[str, Any]:
    data = orjson.loads(path.read_bytes())
    if not isinstance(data, dict) or data.get("kind") not in ("run", "sweep"):
        raise ValueError(f"{path}: not an omnigate loadtest result (kind run or sweep)")
    return data


def fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def queue_p99(res: dict[str, Any]) -> float | None:
    """Gateway-reported queue P99 when the gateway is in front, else the engine's own histogram."""
    return dig(res, "summary.queue_ms.p99") or dig(res, "backend.engine_queue_ms.p99")


# (header, extractor, digits): one row per run or sweep point, the seed's full table.
COLUMNS: list[tuple[str, Any, int]] = [
    ("tokens/s", lambda r: dig(r, "summary.output_throughput"), 0),
    ("req/s", lambda r: dig(r, "summary.request_throughput"), 2),
    ("TTFT P50", lambda r: dig(r, "summary.ttft_ms.p50"), 0),
    ("TTFT P99", lambda r: dig(r, "summary.ttft_ms.p99"), 0),
    ("TPOT P50", lambda r: dig(r, "summary.tpot_ms.p50"), 1),
    ("TPOT P95", lambda r: dig(r, "summary.tpot_ms.p95"), 1),
    ("TPOT P99", lambda r: dig(r, "summary.tpot_ms.p99"), 1),
    ("ITL P99", lambda r: dig(r, "summary.itl_ms.p99"), 1),
    ("E2E P99", lambda r: dig(r, "summary.e2e_ms.p99"), 0),
    ("queue P99", queue_p99, 0),
    ("TTFA P99", lambda r: dig(r, "summary.ttfa_ms.p99"), 0),
    ("RTF P99", lambda r: dig(r, "summary.rtf.p99"), 2),
    ("stalled", lambda r: _pct(dig(r, "summary.stalled_rate")), 1),
    ("audio s/s", lambda r: dig(r, "summary.audio_seconds_per_s"), 2),
    ("SLO att.", lambda r: _pct(dig(r, "summary.slo_attainment")), 0),
    ("goodput", lambda r: dig(r, "summary.goodput"), 2),
    ("reject", lambda r: _pct(dig(r, "summary.rejection_rate")), 1),
    ("error", lambda r: _pct(dig(r, "summary.error_rate")), 1),
    ("KV peak", lambda r: _pct(dig(r, "backend.kv_usage.peak")), 0),
    ("mem peak GiB", lambda r: _gib(dig(r, "backend.memory_bytes.peak")), 1),
    ("KV P95", lambda r: _pct(dig(r, "backend.kv_usage.p95")), 0),
    ("retract", lambda r: dig(r, "backend.retractions"), 0),
    ("OOM", lambda r: "yes" if dig(r, "oom.detected") else "no", 0),
    ("GPU·s/ok", lambda r: dig(r, "summary.gpu_seconds_per_success"), 2),
]


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100


def _gib(v: float | None) -> float | None:
    return None if v is None else v / (1 << 30)


Rows = list[tuple[str, dict[str, Any]]]  # (label, run document) per row


def cells(rows: Rows, first: str) -> tuple[list[str], list[list[str]]]:
    """Header and formatted cells of one table; columns no row has a value for are left out."""
    cols = [(h, f, d) for h, f, d in COLUMNS if any(f(r) is not None for _, r in rows)]
    head = [first, *(h for h, _, _ in cols)]
    return head, [[label, *(fmt(f(res), d) for _, f, d in cols)] for label, res in rows]


def table(rows: Rows, first: str) -> str:
    """Markdown table: one row per (label, run document)."""
    head, body = cells(rows, first)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def run_tables(res: dict[str, Any]) -> list[tuple[str, Rows, str]]:
    """Every table of a run's report, (heading, rows, first column): the whole run, then each breakdown."""
    out: list[tuple[str, Rows, str]] = [("", [("all", res)], "slice")]
    for dim, groups in res.get("breakdowns", {}).items():
        out.append((f"by {dim}", [(k, {"summary": v}) for k, v in groups.items()], dim))
    return out


def sweep_rows(doc: dict[str, Any]) -> Rows:
    rows = [(str(v), p) for v, p in zip(doc["values"], doc["points"], strict=True)]
    return rows + [(str(label), p) for label, p in doc.get("gateway_rows") or []]  # validate-seed's rows


def run_headline(res: dict[str, Any]) -> str:
    meta, s = res["meta"], res["summary"]
    return (
        f"{s['requests']} requests, {s['completed']} completed, {s['rejected']} rejected, "
        f"{s['errors']} errors over {s['duration_s']:.1f} s "
        f"(seed {meta['seed']}, time scale {meta['time_scale']:g}). "
        f"SLO {_slo_text(s['slo'])}. Client send lag P99 {fmt(dig(res, 'client.send_lag_ms.p99'), 2)} ms."
    )


def error_text(res: dict[str, Any]) -> str | None:
    codes = res["summary"]["error_codes"]
    return "errors: " + ", ".join(f"{k} × {v}" for k, v in sorted(codes.items())) if codes else None


def run_markdown(res: dict[str, Any]) -> str:
    meta = res["meta"]
    out = [f"## omnigate loadtest — {meta['workload']} against {meta['url']}", "", run_headline(res)]
    for heading, rows, first in run_tables(res):
        out += ["", f"### {heading}", ""] if heading else [""]
        out.append(table(rows, first))
    if (errors := error_text(res)) is not None:
        out += ["", errors]
    return "\n".join(out) + "\n"


def _slo_text(slo: dict[str, Any]) -> str:
    parts = [
        f"RTF ≤ {v:g}" if k == "rtf" else f"{k.removesuffix('_ms').upper()} P99 < {v:g} ms"
        for k, v in slo.items()
        if v is not None
    ]
    return ", ".join(parts) or "none set"


def sweep_lines(doc: dict[str, Any]) -> list[str]:
    """The knee, the recommendation and why every other point was rejected."""
    rec = doc.get("recommendation")
    return [
        f"knee ({doc['knee_latency']}): {doc['knee'] if doc['knee'] is not None else 'not found'}",
        f"recommendation: {rec if rec is not None else 'none — every point was rejected'}",
        *(f"- rejected {reason}" for reason in doc["rejected"].values()),
    ]


def sweep_title(doc: dict[str, Any]) -> str:
    return f"sweep of {doc['param']} — SLO {_slo_text(doc['slo'])}, headroom {doc['headroom']:.0%}"


def sweep_markdown(doc: dict[str, Any]) -> str:
    out = [f"## {sweep_title(doc)}", "", table(sweep_rows(doc), doc["param"]), "", *sweep_lines(doc)]
    return "\n".join(out) + "\n"


def markdown(doc: dict[str, Any]) -> str:
    return sweep_markdown(doc) if doc.get("kind") == "sweep" else run_markdown(doc)
