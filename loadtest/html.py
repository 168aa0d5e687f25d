"""Self-contained HTML report: inline SVG charts drawn here, no scripts, no CDN, opens offline."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from loadtest.knee import dig
from loadtest.report import COLUMNS, fmt, write_json

W, H, PAD = 640, 280, 48
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e")
Series = tuple[str, list[tuple[float, float]]]
Mark = tuple[float, float, str, str]


def _scale(lo: float, hi: float, a: float, b: float) -> Any:
    span = (hi - lo) or 1.0
    return lambda v: a + (v - lo) / span * (b - a)


def chart(title: str, series: list[Series], xlabel: str, ylabel: str, marks: list[Mark] | None = None) -> str:
    """A line chart with points; `marks` ring chosen points (knee, recommendation) with a label."""
    pts = [p for _, s in series for p in s] + [(x, y) for x, y, _, _ in marks or []]
    if not pts:
        return f"<p>{html.escape(title)}: no data</p>"
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    sx = _scale(min(xs), max(xs), PAD, W - 12)
    sy = _scale(min(0.0, min(ys)), max(ys) * 1.05 or 1.0, H - PAD, 16)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img">']
    out.append(f'<text x="{W / 2}" y="12" text-anchor="middle" font-size="13">{html.escape(title)}</text>')
    out.append(f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 12}" y2="{H - PAD}" stroke="#333"/>')
    out.append(f'<line x1="{PAD}" y1="16" x2="{PAD}" y2="{H - PAD}" stroke="#333"/>')
    y_top = max(ys) * 1.05 or 1.0
    for i in range(5):
        xv = min(xs) + (max(xs) - min(xs)) * i / 4
        yv = min(0.0, min(ys)) + (y_top - min(0.0, min(ys))) * i / 4
        out.append(
            f'<text x="{sx(xv):.1f}" y="{H - PAD + 14}" text-anchor="middle" font-size="10">{xv:.3g}</text>'
        )
        out.append(
            f'<text x="{PAD - 4}" y="{sy(yv) + 3:.1f}" text-anchor="end" font-size="10">{yv:.3g}</text>'
        )
    out.append(
        f'<text x="{W / 2}" y="{H - 8}" text-anchor="middle" font-size="11">{html.escape(xlabel)}</text>'
    )
    out.append(
        f'<text x="12" y="{H / 2}" transform="rotate(-90 12 {H / 2})" text-anchor="middle" '
        f'font-size="11">{html.escape(ylabel)}</text>'
    )
    for i, (name, s) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        out.append(
            f'<text x="{W - 14}" y="{28 + 13 * i}" text-anchor="end" font-size="11" fill="{color}">'
            f"{html.escape(name)}</text>"
        )
    for x, y, label, color in marks or []:
        out.append(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="7" fill="none" stroke="{color}" stroke-width="2"/>'
        )
        out.append(
            f'<text x="{sx(x) + 9:.1f}" y="{sy(y) - 9:.1f}" font-size="11" fill="{color}">'
            f"{html.escape(label)}</text>"
        )
    out.append("</svg>")
    return "".join(out)


def _series(rows: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [(r["t"], float(r[key])) for r in rows if r.get(key) is not None]


def time_series_charts(res: dict[str, Any]) -> list[str]:
    rows = res.get("series", [])
    backend = dig(res, "backend.series") or []
    charts = [
        chart(
            "Offered QPS and completions per second",
            [("sent/s", _series(rows, "qps")), ("completed/s", _series(rows, "completed"))],
            "t (s)",
            "requests/s",
        ),
        chart(
            "Latency P99 per second",
            [("TTFT P99 ms", _series(rows, "ttft_p99_ms")), ("TPOT P99 ms", _series(rows, "tpot_p99_ms"))],
            "t (s)",
            "ms",
        ),
    ]
    if backend:
        charts.append(
            chart(
                "Engine queue depth",
                [("queued", _series(backend, "queued")), ("running", _series(backend, "running"))],
                "t (s)",
                "requests",
            )
        )
        charts.append(
            chart("KV cache usage", [("KV usage", _series(backend, "kv_usage"))], "t (s)", "fraction")
        )
    return charts


def _table(rows: list[tuple[str, dict[str, Any]]], first: str) -> str:
    cols = [(h, f, d) for h, f, d in COLUMNS if any(f(r) is not None for _, r in rows)]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in [first, *(c[0] for c in cols)])
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(fmt(v, d))}</td>" for v, d in [(label, 0), *((f(r), d) for _, f, d in cols)]
        )
        + "</tr>"
        for label, r in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def sweep_body(doc: dict[str, Any]) -> list[str]:
    values, points = doc["values"], doc["points"]
    lat_key = doc["knee_latency"]
    curve = [
        (dig(p, "summary.output_throughput") or 0.0, dig(p, f"summary.{lat_key}") or 0.0) for p in points
    ]
    marks: list[Mark] = []
    for label, color, which in (
        ("knee", "#ff7f0e", doc["knee"]),
        ("recommended", "#2ca02c", doc["recommendation"]),
    ):
        if which is not None:
            x, y = curve[values.index(which)]
            marks.append((x, y, f"{label}: {which}", color))
    parts = [
        f"<h1>Sweep of {html.escape(doc['param'])}</h1>",
        chart(
            f"Throughput vs {lat_key}", [(f"{doc['param']} ladder", curve)], "output tokens/s", lat_key, marks
        ),
        _table([(str(v), p) for v, p in zip(values, points, strict=True)], doc["param"]),
        f"<p>Knee: <b>{html.escape(str(doc['knee']))}</b>. Recommendation: "
        f"<b>{html.escape(str(doc['recommendation']))}</b>.</p>",
        "<ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in doc["rejected"].values()) + "</ul>",
    ]
    shown = doc["recommendation"] if doc["recommendation"] is not None else values[-1]
    parts.append(f"<h2>Time series at {html.escape(doc['param'])} = {html.escape(str(shown))}</h2>")
    parts += time_series_charts(points[values.index(shown)])
    return parts


def render(doc: dict[str, Any]) -> str:
    if doc.get("kind") == "sweep":
        body = sweep_body(doc)
    else:
        body = [f"<h1>Run: {html.escape(doc['meta']['workload'])}</h1>", _table([("all", doc)], "slice")]
        body += time_series_charts(doc)
    style = (
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse;"
        "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        "svg{display:block;margin:1em 0}"
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>omnigate loadtest</title>'
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )


def write_outputs(doc: dict[str, Any], out: Path, md: str) -> None:
    """result.json, report.md and the self-contained report.html in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(doc, out / "result.json")
    (out / "report.md").write_text(md, encoding="utf-8")
    (out / "report.html").write_text(render(doc), encoding="utf-8")
