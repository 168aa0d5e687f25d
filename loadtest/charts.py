"""report.html's charts: matplotlib figures rendered to inline SVG, so the page needs no script and opens
offline. Each chart draws one document into given axes, so a comparison draws A and B side by side on
shared y axes with the same code. Series carry an SVG id (`gid`) that the browser test looks for.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadtest.knee import dig

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

OFFERED, COMPLETED, ERRORS, SLO, P50, P99 = "#1f77b4", "#2ca02c", "#444444", "#d62728", "#9ecae1", "#08519c"
REFUSED = ("#ff7f0e", "#e6550d", "#fdae6b", "#a63603", "#fd8d3c", "#7f2704")
DIMENSIONS = ("bucket", "tenant", "priority", "class", "backend")


@dataclass(frozen=True, slots=True)
class Chart:
    key: str  # the figure's id in the page: chart-<key>
    title: str
    panels: int  # axes side by side within one document's row
    height: float  # inches
    draw: Callable[[Sequence[Axes], dict[str, Any]], None]


def _xy(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["t"], float(r[key])) for r in rows if r.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def _no_data(ax: Axes, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what}", ha="center", va="center", transform=ax.transAxes, color="#888888")


def _slo_line(ax: Axes, value: float | None, label: str) -> None:
    if value is not None:
        ax.axhline(value, color=SLO, linestyle="--", linewidth=1.2, label=label, gid="slo")


def _percentiles(ax: Axes, rows: list[dict[str, Any]], name: str, unit: str, slo: float | None) -> None:
    drawn = False
    for q, color in (("p50", P50), ("p99", P99)):
        x, y = _xy(rows, f"{name}_{q}{unit}")
        if x:
            ax.plot(x, y, color=color, marker=".", linewidth=1.2, label=q.upper(), gid=f"{name}-{q}")
            drawn = True
    if not drawn:
        _no_data(ax, name.upper())
        return
    _slo_line(ax, slo, f"SLO {slo:g}" if slo is not None else "")
    ax.legend(fontsize=8, loc="upper left", framealpha=0.85)


def draw_requests(axes: Sequence[Axes], doc: dict[str, Any]) -> None:
    """Offered and completed per second as lines; refused (by error code) and errors as stacked bars."""
    (ax,) = axes
    rows = doc.get("series") or []
    if not rows:
        _no_data(ax, "requests")
        return
    t = [r["t"] for r in rows]
    codes = sorted({c for r in rows for c in r.get("rejected_by", {})})
    bottom = [0.0] * len(rows)
    for i, code in enumerate(codes):
        h = [float(r.get("rejected_by", {}).get(code, 0)) for r in rows]
        color = REFUSED[i % len(REFUSED)]
        ax.bar(
            t,
            h,
            0.9,
            bottom=bottom,
            align="edge",
            color=color,
            label=f"refused: {code}",
            gid=f"refused-{code}",
        )
        bottom = [b + v for b, v in zip(bottom, h, strict=True)]
    errors = [float(r.get("errors", 0)) for r in rows]
    if any(errors):
        ax.bar(t, errors, 0.9, bottom=bottom, align="edge", color=ERRORS, label="errors", gid="errors")
    ax.plot(t, [r["qps"] for r in rows], color=OFFERED, linewidth=1.5, label="offered", gid="offered")
    ax.plot(
        t, [r["completed"] for r in rows], color=COMPLETED, linewidth=1.5, label="completed", gid="completed"
    )
    ax.set_xlabel("t (s)")
    ax.set_ylabel("requests / s")
    ax.legend(fontsize=8, loc="upper left", framealpha=0.85)


def draw_latency(axes: Sequence[Axes], doc: dict[str, Any]) -> None:
    """TTFT and TPOT percentiles per second, each on its own axis with its SLO line."""
    rows, slo = doc.get("series") or [], dig(doc, "summary.slo") or {}
    for ax, name, label in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "tpot", "TPOT (ms)")):
        _percentiles(ax, rows, name, "_ms", slo.get(f"{name}_ms"))
        ax.set_xlabel("t (s)")
        ax.set_ylabel(label)


def draw_speech(axes: Sequence[Axes], doc: dict[str, Any]) -> None:
    """Time to first audio and real-time factor per second (answers that speak), with their SLO lines."""
    rows, slo = doc.get("series") or [], dig(doc, "summary.slo") or {}
    _percentiles(axes[0], rows, "ttfa", "_ms", slo.get("ttfa_ms"))
    axes[0].set_ylabel("time to first audio (ms)")
    _percentiles(axes[1], rows, "rtf", "", slo.get("rtf"))
    axes[1].set_ylabel("real-time factor")
    for ax in axes:
        ax.set_xlabel("t (s)")


def draw_engines(axes: Sequence[Axes], doc: dict[str, Any]) -> None:
    """The engines' KV cache use, running and queued requests, from the /metrics scrapes."""
    rows = dig(doc, "backend.series") or []
    if not rows:
        for ax in axes:
            _no_data(ax, "engine scrapes")
        return
    t = [r["t"] for r in rows]
    axes[0].plot(
        t, [r["kv_usage"] * 100 for r in rows], color="#6a3d9a", linewidth=1.5, label="KV used", gid="kv"
    )
    axes[0].set_ylim(0, 100)
    axes[0].set_ylabel("KV cache used (%)")
    axes[1].plot(
        t, [r["running"] for r in rows], color=COMPLETED, linewidth=1.5, label="running", gid="running"
    )
    axes[1].plot(
        t, [r["queued"] for r in rows], color=REFUSED[0], linewidth=1.5, label="queued", gid="queued"
    )
    axes[1].set_ylabel("requests")
    for ax in axes:
        ax.set_xlabel("t (s)")
        ax.legend(fontsize=8, loc="upper left", framealpha=0.85)


def _slice_draw(dim: str) -> Callable[[Sequence[Axes], dict[str, Any]], None]:
    def draw(axes: Sequence[Axes], doc: dict[str, Any]) -> None:
        groups = dig(doc, f"breakdowns.{dim}") or {}
        if not groups:
            for ax in axes:
                _no_data(ax, dim)
            return
        names = list(groups)
        att = [100 * (groups[n].get("slo_attainment") or 0.0) for n in names]
        good = [groups[n].get("goodput") or 0.0 for n in names]
        axes[0].bar(names, att, color=COMPLETED, gid="attainment")
        axes[0].set_ylim(0, 100)
        axes[0].set_ylabel("SLO attainment (%)")
        axes[1].bar(names, good, color=OFFERED, gid="goodput")
        axes[1].set_ylabel("goodput (req/s)")
        for ax in axes:
            ax.set_xlabel(dim)
            ax.tick_params(axis="x", labelrotation=20, labelsize=8)

    return draw


def draw_sweep(axes: Sequence[Axes], doc: dict[str, Any]) -> None:
    """Throughput and the knee latency against the swept value, the SLO line, the knee and the pick."""
    values, points, lat = doc["values"], doc["points"], doc["knee_latency"]
    x = list(range(len(values)))
    thr = [dig(p, "summary.output_throughput") or 0.0 for p in points]
    tail = [dig(p, f"summary.{lat}") or 0.0 for p in points]
    axes[0].plot(x, thr, color=OFFERED, marker="o", linewidth=1.5, gid="throughput")
    axes[0].set_ylabel("output tokens / s")
    axes[1].plot(x, tail, color=P99, marker="o", linewidth=1.5, gid="latency")
    axes[1].set_ylabel(lat.replace("_ms.", " ").upper() + " (ms)")
    slo = (doc.get("slo") or {}).get(lat.split(".")[0])
    _slo_line(axes[1], slo, f"SLO {slo:g}" if slo is not None else "")
    for label, color, which in (
        ("knee", REFUSED[0], doc.get("knee")),
        ("recommended", COMPLETED, doc.get("recommendation")),
    ):
        if which is None:
            continue
        i = values.index(which)
        for ax, ys in ((axes[0], thr), (axes[1], tail)):
            ax.plot(
                [i],
                [ys[i]],
                "o",
                markersize=14,
                markerfacecolor="none",
                markeredgecolor=color,
                markeredgewidth=2,
                label=f"{label}: {which}",
                gid=label,
            )
    for ax in axes:
        ax.set_xticks(x, [str(v) for v in values])
        ax.set_xlabel(doc["param"])
        ax.legend(fontsize=8, loc="upper left", framealpha=0.85)


def _has_series(key: str) -> Callable[[dict[str, Any]], bool]:
    return lambda doc: any(r.get(key) is not None for r in doc.get("series") or [])


# (chart, whether a run document has anything to draw for it)
RUN_CHARTS: list[tuple[Chart, Callable[[dict[str, Any]], bool]]] = [
    (
        Chart("requests", "Offered, completed and refused (by reason) per second", 1, 3.4, draw_requests),
        lambda d: bool(d.get("series")),
    ),
    (
        Chart("latency", "TTFT and TPOT per second (P50, P99) against the SLO", 2, 3.0, draw_latency),
        _has_series("ttft_p99_ms"),
    ),
    (
        Chart("speech", "Answers that speak: time to first audio and real-time factor", 2, 3.0, draw_speech),
        _has_series("ttfa_p99_ms"),
    ),
    (
        Chart(
            "engines", "Engines: KV cache use, running and queued requests (scraped)", 2, 2.6, draw_engines
        ),
        lambda d: bool(dig(d, "backend.series")),
    ),
    *(
        (
            Chart(f"slo-{dim}", f"SLO attainment and goodput per {dim}", 2, 2.4, _slice_draw(dim)),
            lambda d, dim=dim: bool(dig(d, f"breakdowns.{dim}")),
        )
        for dim in DIMENSIONS
    ),
]
SWEEP_CHART = Chart("sweep", "Throughput and tail latency against the swept value", 2, 3.2, draw_sweep)


def run_charts(*docs: dict[str, Any]) -> list[Chart]:
    """The charts with something to draw for any of the documents."""
    return [chart for chart, has in RUN_CHARTS if any(has(d) for d in docs)]


def svg(chart: Chart, docs: Sequence[dict[str, Any]], titles: Sequence[str] = ()) -> str:
    """The chart for one document, or for several side by side (one column block each, y axes shared
    across them so A and B read on the same scale), as an inline <svg> element."""
    from matplotlib import rc_context

    # Text stays text (small, searchable); a short font list, as the SVG repeats it on every label.
    fonts = ["DejaVu Sans", "Arial", "Helvetica"]
    with rc_context(
        {"svg.fonttype": "none", "font.size": 9, "font.sans-serif": fonts, "svg.hashsalt": chart.key}
    ):
        fig = _figure(chart, docs, titles)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata=dict.fromkeys(("Date", "Creator", "Format", "Type")))
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _figure(chart: Chart, docs: Sequence[dict[str, Any]], titles: Sequence[str]) -> Figure:
    from matplotlib.figure import Figure

    cols = chart.panels * len(docs)
    fig = Figure(figsize=(4.8 * cols if cols > 1 else 9.6, chart.height), layout="constrained")
    axes = fig.subplots(1, cols, squeeze=False)[0]
    if len(docs) > 1:
        for p in range(chart.panels):  # panel p of every document on one y scale
            for d in range(1, len(docs)):
                axes[d * chart.panels + p].sharey(axes[p])
    for d, doc in enumerate(docs):
        block = axes[d * chart.panels : (d + 1) * chart.panels]
        chart.draw(block, doc)
        if d < len(titles):
            block[0].set_title(titles[d], loc="left", fontsize=10, fontweight="bold")
    for ax in axes:  # every quantity drawn is >= 0: start at zero, after every document drew (shared axes)
        ax.grid(True, color="#e5e5e5", linewidth=0.6)
        ax.set_axisbelow(True)
        if ax.get_ylim()[0] != 0:
            ax.set_ylim(bottom=0)
    return fig
