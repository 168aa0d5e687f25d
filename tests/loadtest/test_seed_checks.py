"""validate-seed's judgement: point-by-point shapes, distances from the seed, the gateway rows' verdict."""

from __future__ import annotations

from typing import Any

import pytest

from loadtest import seed_table as seed
from loadtest.sim.profile import load_profile
from loadtest.sim.replay import physics

GIB = 1 << 30


def test_rises_allows_a_dip_up_to_the_tolerance_at_every_step() -> None:
    assert seed.rises([28, 26, 27, 28, 38, 52])  # the seed's TPOT P50: 26 is 7 % under 28
    assert not seed.rises([100, 120, 107, 200])  # 120 → 107 falls 10.8 %
    assert seed.rises([100, 120, 108, 200])  # exactly 10 %
    assert seed.rises([38, 45, None, 76])  # a missing point (the seed's OOM row) is skipped
    assert not seed.rises([1, 100, 50, 200])  # judged point by point, not last against first


def test_flattens_wants_each_gain_no_larger_than_the_one_before_plus_the_tolerance() -> None:
    assert seed.flattens([620, 940, 1280, 1430, 1510, 1550])  # +52 %, +36 %, +12 %, +6 %, +3 %
    assert seed.flattens([100, 150, 160, 176])  # +50 %, +6.7 %, +10 % (≤ 6.7 + 10)
    assert not seed.flattens([100, 150, 160, 200])  # +25 % after +6.7 %


def _point(row: dict[str, str], **over: float) -> dict[str, Any]:
    """A run document holding the seed's own figures for one cap (memory in GiB → bytes)."""
    values = {
        "thr": float(row["tokens_per_s"]),
        "ttft": float(row["ttft_p99_ms"]),
        "p50": float(row["tpot_p50_ms"]),
        "p99": float(row["tpot_p99_ms"]),
        "queue": float(row["queue_p99_ms"]),
        "mem": float(row["memory_peak_gb"] or 79),
    } | over
    return {
        "summary": {
            "output_throughput": values["thr"],
            "tpot_ms": {"p50": values["p50"], "p99": values["p99"]},
            "rejection_rate": 0.0,
        },
        "backend": {
            "engine_ttft_ms": {"p99": values["ttft"]},
            "engine_queue_ms": {"p99": values["queue"]},
            "memory_bytes": {"peak": values["mem"] * GIB},
            "kv_usage": {"peak": 0.5},
            "retractions": 0,
        },
        "oom": {"detected": False},
    }


def _seeds(*recommendations: str, median: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    per_seed = [
        {"seed": 42 + i, "recommendation": r, "tpot_p99_ms": {"32": 40.0, "48": 70.0}}
        for i, r in enumerate(recommendations)
    ]
    return {"per_seed": per_seed, "median": median}


def _doc(table: dict[str, dict[str, str]], **changes: dict[str, float]) -> dict[str, Any]:
    values = [str(v) for v in seed.VALUES]
    return {
        "values": values,
        "points": [_point(table[v], **changes.get(v, {})) for v in values],
        "slo": {"tpot_ms": 60.0},
        "headroom": 0.1,
        "knee": "32",
        "recommendation": "32",
        "rejected": {},
        "seeds": _seeds("32", "32", "48", "32", "32"),
    }


def test_the_seeds_own_table_passes_every_shape_check() -> None:
    table = seed.seed_table()
    checks = seed.shape_checks(_doc(table), table)
    assert all(ok for ok, _ in checks), [t for ok, t in checks if not ok]
    texts = [t for _, t in checks]
    assert (
        "TPOT P50 rises point by point, no step down > 10%: 28.0 → 26.0 → 27.0 → 28.0 → 38.0 → 52.0" in texts
    )
    assert "recommendation 32 on 4 of 5 workload seeds (needs 4)" in texts
    assert "64: no OOM, as the seed" in texts
    assert "128: no OOM, as the seed" not in texts  # the seed's 128 ran out of memory: not held to "no"


def test_shapes_are_judged_on_the_seed_median_when_there_is_one() -> None:
    table = seed.seed_table()
    doc = _doc(table, **{"48": {"ttft": 200.0}})  # this run's 48 dips 22 % under 32's 255 ms
    assert not all(ok for ok, _ in seed.shape_checks(doc, table))
    median = [_point(table[str(v)]) for v in seed.VALUES]  # the five seeds' medians rise
    doc["seeds"] = _seeds("32", "32", "32", "32", "32", median=median)
    checks = seed.shape_checks(doc, table)
    assert all(ok for ok, _ in checks)
    assert (
        "TTFT P99 rises point by point, no step down > 10% (median of 5 workload seeds): "
        "220 → 240 → 255 → 310 → 420 → 780"
    ) in [t for _, t in checks]


def test_a_dip_an_oom_the_wrong_recommendation_or_a_minority_of_seeds_fails() -> None:
    table = seed.seed_table()
    doc = _doc(table, **{"48": {"ttft": 200.0}})  # 255 → 200: a 22 % step down
    doc["points"][1]["oom"]["detected"] = True
    doc["recommendation"] = "48"
    doc["seeds"] = _seeds("32", "48", "48", "32", "32")
    failed = [t for ok, t in seed.shape_checks(doc, table) if not ok]
    assert failed == [
        "TTFT P99 rises point by point, no step down > 10%: 220 → 240 → 255 → 200 → 420 → 780",
        "16: no OOM, as the seed",
        "recommendation 48 == 32",
        "recommendation 32 on 3 of 5 workload seeds (needs 4)",
    ]


def test_distances_print_every_ratio_and_the_reason_only_where_far() -> None:
    table = seed.seed_table()
    doc = _doc(table, **{"8": {"ttft": 660.0}})  # 3× the seed's 220 ms
    lines = seed.distances(doc, table, physics(load_profile("default")))
    assert lines[0] == "tok/s: ×1.00 ×1.00 ×1.00 ×1.00 ×1.00 ×1.00"
    assert lines[1].startswith("TTFT P99: ×3.00 ×1.00 ×1.00 ×1.00 ×1.00 ×1.00 — far: one A100 prefills")
    assert lines[5] == "mem GB: ×1.00 ×1.00 ×1.00 ×1.00 ×1.00 –"  # no seed figure at 128, no reason
    assert len(lines) == 7 and lines[6].startswith("OOM at 128: seed yes, ours no")


def test_the_seeds_oom_at_128_is_reported_with_our_memory_when_we_do_not_run_out() -> None:
    table = seed.seed_table()
    doc = _doc(table, **{"128": {"mem": 28.8}})
    f = physics(load_profile("default"))
    oom = [line for line in seed.distances(doc, table, f) if line.startswith("OOM at 128")]
    assert oom == [
        "OOM at 128: seed yes, ours no — memory in use peaks at 28.8 of 79.25 GiB: the KV pool SGLang "
        "derives (918 k tokens) peaks at 459 k, and a prefill step's activations (at most one 8 k-token "
        "chunk and one request's images) stay within the 12.8 GiB outside the pool"
    ]


def _gateway_doc(tpot: float, thr: float, retractions: int) -> dict[str, Any]:
    table = seed.seed_table()
    doc = _doc(table)
    row = _point(table["128"], p99=tpot, thr=thr)
    row["backend"]["retractions"] = retractions
    doc["gateway_rows"] = [("128 + omnigate", row)]
    doc["physics"] = physics(load_profile("default"))
    return doc


def test_gateway_rows_are_judged_against_the_slo_memory_and_the_32_rows_throughput() -> None:
    assert seed.gateway_checks(_gateway_doc(tpot=59.0, thr=1280.0, retractions=0)) == [
        (True, "128 + omnigate: TPOT P99 59.0 ms < 60 ms"),
        (True, "128 + omnigate: no OOM or retraction (0)"),
        (True, "128 + omnigate: tok/s 1280 ≥ the 32 row's 1280"),
    ]
    assert [ok for ok, _ in seed.gateway_checks(_gateway_doc(tpot=61.0, thr=1279.0, retractions=3))] == [
        False,
        False,
        False,
    ]


@pytest.mark.parametrize(("mode", "code"), [("report", 0), ("enforce", 1)])
def test_gateway_verdict_counts_only_when_enforced(
    mode: seed.GatewayCheck, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert seed.report(_gateway_doc(tpot=75.0, thr=1300.0, retractions=0), mode) == code
    out = capsys.readouterr().out
    assert "| 128 + omnigate | 1300 | – |" in out
    assert "by workload seed (engine replayed): 32: 4, 48: 1\n  seed 42: recommendation 32; " in out
    assert "  seed 44: recommendation 48; TPOT P99 ms by cap 40.0 70.0\n" in out
    assert "[FAIL] 128 + omnigate: TPOT P99 75.0 ms < 60 ms" in out
