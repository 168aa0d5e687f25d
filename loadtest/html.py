"""Self-contained HTML reports: every table of report.md plus matplotlib charts as inline SVG (loadtest/
charts.py). No script, no external resource: the page opens offline and in viewers that block scripts."""

from __future__ import annotations

import html
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadtest import charts
from loadtest.compare import Row, num
from loadtest.report import (
    Rows,
    cells,
    error_text,
    run_headline,
    run_tables,
    sweep_lines,
    sweep_rows,
    sweep_title,
    write_json,
)

STYLE = (
    "body{font-family:sans-serif;max-width:1280px;margin:1.5em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;font-size:12px;margin:.5em 0 1.5em}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
    "td:first-child,th:first-child{text-align:left}"
    "th{background:#f3f3f3}figure{margin:1em 0 2em}figcaption{font-weight:bold;margin-bottom:.3em}"
    "figure svg{width:100%;height:auto}.flag{color:#b00;font-weight:bold}"
)


def _esc(v: object) -> str:
    return html.escape(str(v))


def table(rows: Rows, first: str, heading: str = "") -> str:
    head, body = cells(rows, first)
    out = f"<h3>{_esc(heading)}</h3>" if heading else ""
    out += "<table><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in head) + "</tr>"
    out += "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in body)
    return out + "</table>"


def figure(chart: charts.Chart, docs: list[dict[str, Any]], titles: list[str] | None = None) -> str:
    caption = f"<figcaption>{_esc(chart.title)}</figcaption>"
    return f'<figure id="chart-{chart.key}">{caption}{charts.svg(chart, docs, titles or [])}</figure>'


def run_body(res: dict[str, Any], heading: str) -> list[str]:
    parts = [heading, f"<p>{_esc(run_headline(res))}</p>"]
    parts += [table(rows, first, h) for h, rows, first in run_tables(res)]
    if (errors := error_text(res)) is not None:
        parts.append(f"<p>{_esc(errors)}</p>")
    return parts + [figure(c, [res]) for c in charts.run_charts(res)]


def sweep_body(doc: dict[str, Any]) -> list[str]:
    parts = [
        f"<h1>{_esc(sweep_title(doc))}</h1>",
        figure(charts.SWEEP_CHART, [doc]),
        table(sweep_rows(doc), doc["param"]),
        "<ul>" + "".join(f"<li>{_esc(line.removeprefix('- '))}</li>" for line in sweep_lines(doc)) + "</ul>",
    ]
    shown = doc["recommendation"] if doc["recommendation"] is not None else doc["values"][-1]
    point = doc["points"][doc["values"].index(shown)]
    parts.append(f"<h2>The run at {_esc(doc['param'])} = {_esc(shown)}</h2>")
    return parts + [figure(c, [point]) for c in charts.run_charts(point)]


def page(title: str, body: list[str]) -> str:
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{_esc(title)}</title>'
        f"<style>{STYLE}</style></head><body>{''.join(body)}</body></html>\n"
    )


def render(doc: dict[str, Any]) -> str:
    if doc.get("kind") == "sweep":
        return page("omnigate loadtest sweep", sweep_body(doc))
    meta = doc["meta"]
    title = f"omnigate loadtest — {meta['workload']} against {meta['url']}"
    return page(title, run_body(doc, f"<h1>{_esc(title)}</h1>"))


def compare_table(rows: list[Row]) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("metric", "A", "B", "change", ""))
    body = "".join(
        f"<tr><td>{_esc(label)}</td><td>{num(va)}</td><td>{num(vb)}</td>"
        f"<td>{'n/a' if change is None else f'{change:+.1%}'}</td>"
        f'<td class="flag">{"REGRESSION" if worse else ""}</td></tr>'
        for label, va, vb, change, worse in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_compare(
    a: dict[str, Any], b: dict[str, Any], sections: list[tuple[str, list[Row]]], names: tuple[str, str]
) -> str:
    """`loadtest compare`: the metrics with their flags, every chart with A and B side by side on shared
    y axes, then each run's tables."""
    titles = [f"A: {names[0]}", f"B: {names[1]}"]
    body = [f"<h1>omnigate loadtest compare — A: {_esc(names[0])}, B: {_esc(names[1])}</h1>"]
    for heading, rows in sections:
        body += [f"<h3>{_esc(heading)}</h3>" if heading else "", compare_table(rows)]
    if a.get("kind") == "sweep":
        body.append(figure(charts.SWEEP_CHART, [a, b], titles))
        return page(
            "omnigate loadtest compare",
            body + [table(sweep_rows(d), d["param"], t) for d, t in ((a, titles[0]), (b, titles[1]))],
        )
    body += [figure(c, [a, b], titles) for c in charts.run_charts(a, b)]
    for doc, name in ((a, titles[0]), (b, titles[1])):
        body += [table(rows, first, f"{name} {heading}".strip()) for heading, rows, first in run_tables(doc)]
    return page("omnigate loadtest compare", body)


def write_page(path: Path, render_page: Callable[[], str]) -> bool:
    """Write the page; False (with the reason printed) where matplotlib, the `report` extra, is missing."""
    try:
        text = render_page()
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        print(
            f"{path} not written: its charts need matplotlib: pip install 'omnigate[report]'", file=sys.stderr
        )
        return False
    path.write_text(text, encoding="utf-8")
    return True


def write_outputs(doc: dict[str, Any], out: Path, md: str) -> list[str]:
    """result.json, report.md and the self-contained report.html in `out`; the names written."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(doc, out / "result.json")
    (out / "report.md").write_text(md, encoding="utf-8")
    return ["result.json", "report.md"] + (
        ["report.html"] if write_page(out / "report.html", lambda: render(doc)) else []
    )
