"""report.html and compare.html: every table of report.md, every chart with its series, no key anywhere,
nothing fetched. The pages as a browser draws them: tests/loadtest/test_report_browser.py."""

from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import orjson
import pytest

from loadtest import html
from loadtest.cli import main
from loadtest.compare import compare_rows
from loadtest.report import markdown, write_json
from loadtest.workload import key_fingerprint
from tests.loadtest.report_docs import ALICE_KEY, BOB_KEY, run_doc, sweep_doc

ROW = re.compile(r"<tr>(.*?)</tr>")
CELL = re.compile(r"<t[dh]>(.*?)</t[dh]>")


def html_rows(page: str) -> list[list[str]]:
    return [[c.replace("&amp;", "&") for c in CELL.findall(row)] for row in ROW.findall(page)]


def md_rows(md: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in md.splitlines()
        if line.startswith("| ") and not line.startswith("|---")
    ]


def figure(page: str, key: str) -> str:
    match = re.search(rf'<figure id="chart-{key}">(.*?)</figure>', page, re.S)
    assert match, f"chart-{key} missing"
    return match.group(1)


def gids(svg: str) -> set[str]:
    return set(re.findall(r'<g id="([a-z][a-z0-9_:-]*)"', svg))


def yticks(svg: str) -> list[list[str]]:
    """The y tick labels of each axes of a figure, in drawing order."""
    parts = re.split(r'<g id="axes_\d+">', svg)[1:]
    return [re.findall(r'<g id="ytick_\d+">.*?>([^<>]+)</text>', part, re.S) for part in parts]


def test_every_table_row_of_report_md_is_a_row_of_report_html() -> None:
    doc = run_doc()
    md, page = markdown(doc), html.render(doc)
    expected = md_rows(md)
    assert len(expected) == 5 + 1 + 3 + 2 + 2 + 2  # 5 headers; all, then bucket 3, tenant, priority, class 2
    shown = html_rows(page)
    assert [row for row in expected if row not in shown] == []
    assert "errors: backend_status × 1, requests_per_minute_exceeded × 6, slo_unattainable × 4" in page
    for heading in ("by bucket", "by tenant", "by priority", "by class"):
        assert f"<h3>{heading}</h3>" in page and f"### {heading}" in md


def test_a_run_page_draws_every_chart_with_its_series_and_slo_lines() -> None:
    page = html.render(run_doc())
    expected = {
        "requests": {"offered", "completed", "errors", "refused-requests_per_minute_exceeded",
                     "refused-slo_unattainable"},
        "latency": {"ttft-p50", "ttft-p99", "tpot-p50", "tpot-p99", "slo"},
        "speech": {"ttfa-p50", "ttfa-p99", "rtf-p50", "rtf-p99", "slo"},
        "engines": {"kv", "running", "queued"},
        "slo-bucket": {"attainment", "goodput"},
        "slo-tenant": {"attainment", "goodput"},
        "slo-priority": {"attainment", "goodput"},
        "slo-class": {"attainment", "goodput"},
    }  # fmt: skip
    assert re.findall(r'<figure id="chart-([a-z-]+)">', page) == list(expected)
    for key, series in expected.items():
        svg = figure(page, key)
        assert series <= gids(svg), (key, series - gids(svg))
    latency = figure(page, "latency")
    assert "SLO 500" in latency and "SLO 60" in latency  # each on its own axis, with its own line
    assert "SLO 800" in figure(page, "speech") and "SLO 1" in figure(page, "speech")
    for label in ("alice", "key:bob"):
        assert f">{label}<" in figure(page, "slo-tenant")


def test_the_page_is_self_contained_and_opens_offline() -> None:
    page = html.render(run_doc())
    assert "<script" not in page and "<link" not in page and "<img" not in page
    assert re.findall(r'(?:src|href)="(?!#)[^"]*"', page) == []  # only in-page references
    urls = set(re.findall(r"https?://[^\"'<> ]+", page))
    assert urls == {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink", "http://127.0.0.1:9"}


def test_tenants_are_named_by_id_or_key_fingerprint_never_by_key(tmp_path: Path) -> None:
    from loadtest.workload import RequestFactory, Workload

    w = Workload.model_validate(
        {"seed": 3, "tenants": [{"name": ALICE_KEY, "id": "alice"}, {"name": BOB_KEY}], "mix": {"text": 1}}
    )
    factory = RequestFactory(w, media=None)  # type: ignore[arg-type]  # text only: no media drawn
    sent = [factory.next() for _ in range(40)]
    assert {r.tenant for r in sent} == {"alice", key_fingerprint(BOB_KEY)}
    assert {r.headers["authorization"] for r in sent} == {f"Bearer {ALICE_KEY}", f"Bearer {BOB_KEY}"}
    assert key_fingerprint(BOB_KEY) == "key:" + hashlib.sha256(BOB_KEY.encode()).hexdigest()[:8]
    doc = run_doc()
    html.write_outputs(doc, tmp_path, markdown(doc))
    for name in ("result.json", "report.md", "report.html"):
        text = (tmp_path / name).read_text()
        assert ALICE_KEY not in text and BOB_KEY not in text, name
    spec = orjson.loads((tmp_path / "result.json").read_bytes())["meta"]["workload_spec"]
    assert spec["tenants"] == [
        {"name": key_fingerprint(ALICE_KEY), "share": 1.0, "id": "alice"},
        {"name": key_fingerprint(BOB_KEY), "share": 1.0, "id": None},
    ]


def test_a_sweep_page_marks_the_knee_and_the_recommendation_against_the_slo() -> None:
    doc = sweep_doc()
    page = html.render(doc)
    svg = figure(page, "sweep")
    assert {"throughput", "latency", "slo", "knee", "recommended"} <= gids(svg)
    assert "recommended: 16" in svg and "knee: 32" in svg and "SLO 60" in svg
    assert [row for row in md_rows(markdown(doc)) if row not in html_rows(page)] == []
    assert "rejected 64: TTFT P99 1256 ms &gt; 450 ms" in page
    assert "<h2>The run at max-running-requests = 16</h2>" in page and 'id="chart-engines"' in page


def test_compare_draws_a_and_b_side_by_side_on_shared_axes_and_flags_regressions() -> None:
    a, b = run_doc(name="before"), run_doc(slow=3.0, name="after")
    rows = compare_rows(a, b)
    page = html.render_compare(a, b, [("", rows)], ("a.json", "b.json"))
    flagged = {r[0] for r in rows if r[4]}
    assert {"TTFT P99 ms", "TPOT P99 ms"} <= flagged
    for label in flagged:
        assert re.search(rf"<tr><td>{label}</td>.*?<td class=\"flag\">REGRESSION</td></tr>", page)
    svg = figure(page, "latency")
    assert svg.count('<g id="tpot-p99"') == 2 and "A: a.json" in svg and "B: b.json" in svg
    # shared y axes: B's TPOT P99 (90 ms) sets both TPOT panels' scale (alone A's would stop at 60)
    ttft_a, tpot_a, ttft_b, tpot_b = yticks(svg)
    assert tpot_a == tpot_b and tpot_a[-1] == "80" and ttft_a == ttft_b
    shown = html_rows(page)
    assert [row for row in md_rows(markdown(a)) if row not in shown] == []
    assert [row for row in md_rows(markdown(b)) if row not in shown] == []


def test_cli_compare_writes_compare_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_json(run_doc(), tmp_path / "a.json")
    write_json(run_doc(slow=3.0), tmp_path / "b.json")
    code = main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "o")])
    assert code == 1  # regressions
    page = (tmp_path / "o" / "compare.html").read_text()
    assert 'id="chart-latency"' in page and "REGRESSION" in page
    assert f"wrote {tmp_path / 'o' / 'compare.html'}" in capsys.readouterr().err


def test_without_matplotlib_the_json_and_markdown_are_written_and_the_page_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    doc = run_doc()
    assert html.write_outputs(doc, tmp_path, markdown(doc)) == ["result.json", "report.md"]
    assert not (tmp_path / "report.html").exists()
    assert "pip install 'omnigate[report]'" in capsys.readouterr().err
