"""Knee detection and recommendation on synthetic curves; report rendering (JSON, Markdown, HTML)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from loadtest import html
from loadtest.compare import compare
from loadtest.knee import find_knee, recommend
from loadtest.report import markdown
from loadtest.scrape import Sample, histogram_quantile, parse_prometheus, summarize_samples
from loadtest.sweep import analyse

# The seed article's table: (cap, tokens/s, TTFT P99, TPOT P50, TPOT P99, OOM).
SEED = [
    (8, 620, 220, 28, 45, False),
    (16, 940, 240, 26, 43, False),
    (32, 1280, 255, 27, 49, False),
    (48, 1430, 310, 28, 82, False),
    (64, 1510, 420, 38, 110, False),
    (128, 1550, 780, 52, 260, True),
]


def point(
    thr: float, ttft: float, tpot50: float, tpot99: float, oom: bool, err: float = 0.0
) -> dict[str, Any]:
    series = [{"t": float(t), "qps": 5.0 + t % 3, "completed": 4, "ttft_p99_ms": ttft, "tpot_p99_ms": tpot99}
              for t in range(5)]  # fmt: skip
    return {
        "kind": "run",
        "meta": {"workload": "synthetic"},
        "summary": {
            "output_throughput": thr,
            "request_throughput": thr / 300,
            "ttft_ms": {"p99": ttft},
            "tpot_ms": {"p50": tpot50, "p99": tpot99},
            "error_rate": err,
            "slo_attainment": 0.99,
        },
        "series": series,
        "backend": {
            "kv_usage": {"peak": 0.5},
            "series": [{"t": 0.0, "kv_usage": 0.4, "queued": 3, "running": 8}],
        },
        "oom": {"detected": oom, "crashes": int(oom), "error_bursts": 0},
    }


def seed_sweep(headroom: float = 0.1) -> dict[str, Any]:
    pts = [point(t, a, b, c, o) for _, t, a, b, c, o in SEED]
    return analyse("max-running-requests", [str(r[0]) for r in SEED], pts, {"tpot_ms": 60.0}, headroom)


def test_knee_on_seed_curve_is_32() -> None:
    assert find_knee([r[1] for r in SEED], [r[4] for r in SEED]) == 2


def test_no_knee_on_linear_or_flat_latency_curves() -> None:
    assert find_knee([100, 200, 300, 400], [50, 52, 54, 56]) is None
    assert find_knee([100, 105, 108], [50, 50, 51]) is None  # flat throughput but latency also flat


def test_recommendation_with_reasons() -> None:
    doc = seed_sweep()
    assert doc["recommendation"] == "32" and doc["knee"] == "32"
    assert doc["rejected"]["48"] == "48: TPOT P99 82 ms > 54 ms (60 ms − 10% headroom)"
    assert doc["rejected"]["128"].startswith("128: OOM (1 crashes, 0 error bursts); TPOT P99 260 ms")
    assert set(doc["rejected"]) == {"48", "64", "128"}


def test_headroom_can_reject_a_point_that_meets_the_bare_slo() -> None:
    rec = recommend(
        ["a", "b"], [point(100, 1, 1, 50, False), point(200, 1, 1, 58, False)], {"tpot_ms": 60}, 0.1
    )
    assert rec.index == 0 and rec.reasons == {1: "b: TPOT P99 58 ms > 54 ms (60 ms − 10% headroom)"}
    bare = recommend(["a", "b"], [point(100, 1, 1, 50, False), point(200, 1, 1, 58, False)], {"tpot_ms": 60})
    assert bare.index == 1 and bare.reasons == {}


def test_errors_reject_and_nothing_passing_gives_none() -> None:
    rec = recommend(["x"], [point(100, 1, 1, 10, False, err=0.05)], {"tpot_ms": 60})
    assert rec.index is None and rec.reasons == {0: "x: error rate 5.0% > 1.0%"}


def test_markdown_and_self_contained_html(tmp_path: Path) -> None:
    doc = seed_sweep()
    md = markdown(doc)
    assert "| max-running-requests | tokens/s |" in md
    assert "recommendation: 32" in md and "- rejected 48: TPOT P99 82 ms" in md
    html.write_outputs(doc, tmp_path, md)
    page = (tmp_path / "report.html").read_text()
    assert page.count("<svg") == 4  # the sweep, then the recommended point's requests, latency, engines
    assert "knee: 32" in page and "recommended: 32" in page
    for external in ("<script", "http://", "https://cdn", "<link"):
        namespaces = ('xmlns="http://www.w3.org/2000/svg"', 'xmlns:xlink="http://www.w3.org/1999/xlink"')
        assert external not in page.replace(namespaces[0], "").replace(namespaces[1], "")
    assert orjson.loads((tmp_path / "result.json").read_bytes())["recommendation"] == "32"


def test_compare_flags_regressions() -> None:
    a, b = point(1000, 200, 27, 49, False), point(900, 200, 27, 70, False)
    lines, regressions = compare(a, b)
    assert regressions == 3  # tokens/s, requests/s (10 % down) and TPOT P99 (+43 %)
    assert any(line.startswith("TPOT P99 ms") and "REGRESSION" in line for line in lines)
    assert compare(a, a)[1] == 0


def test_prometheus_parsing_and_backend_summary() -> None:
    text = "\n".join([
        "# HELP sglang:token_usage x",
        'sglang:token_usage{model_name="m",tp_rank="0"} 0.5',
        'sglang:token_usage{model_name="m",tp_rank="1"} 0.75',
        'sglang:num_running_reqs{model_name="m"} 8.0',
        'sglang:num_running_reqs{model_name="m",tp_rank="1"} 2.0',
        'sglang:num_retracted_requests_total{model_name="m"} 3.0',
        'sglang:queue_time_seconds_bucket{le="0.1",model_name="m"} 90.0',
        'sglang:queue_time_seconds_bucket{le="1.0",model_name="m"} 100.0',
        'sglang:queue_time_seconds_bucket{le="+Inf",model_name="m"} 100.0',
    ])  # fmt: skip
    v = parse_prometheus(text)
    assert v["kv_usage"] == 0.75 and v["running"] == 10.0 and v["retractions_total"] == 3.0
    assert histogram_quantile({0.1: 90, 1.0: 100, float("inf"): 100}, 0.99) == 0.1 + 0.9 * 0.9
    later = {**v, "kv_usage": 0.25, "retractions_total": 7.0}
    samples = [Sample(0.0, "a", True, v), Sample(1.0, "a", True, later), Sample(2.0, "a", False, {})]
    s = summarize_samples(samples)
    assert s["kv_usage"] == {"peak": 0.75, "p95": 0.725}
    assert s["retractions"] == 4.0 and s["crashes"] == 1
