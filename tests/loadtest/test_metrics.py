"""Metric definitions on hand-built records, with values worked out by hand."""

from __future__ import annotations

import pytest

from loadtest.metrics import breakdowns, error_bursts, percentile, summarize, time_series, tpot
from loadtest.records import RequestRecord
from loadtest.workload import Slo


def rec(sent: float, ttft: float, e2e: float, n: int, **kw: object) -> RequestRecord:
    step = (e2e - ttft) / max(n - 1, 1)
    chunks = [ttft + i * step for i in range(n)]
    base = {"status": 200, "prompt_tokens": 10, "output_tokens": n, "chunk_times": chunks}
    base.update(kw)
    return RequestRecord(sent=sent, scheduled=sent, ttft=ttft, e2e=e2e, **base)  # type: ignore[arg-type]


def test_percentile_matches_numpy_linear() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([5.0], 99) == 5.0


def test_tpot_is_e2e_minus_ttft_over_n_minus_one() -> None:
    assert tpot(rec(0, 0.2, 1.2, 11)) == pytest.approx(0.1)
    assert tpot(rec(0, 0.2, 0.2, 1)) is None  # one token: no TPOT
    assert tpot(rec(0, 0.2, 1.2, 11, status=500)) is None


def test_summary_exact_values() -> None:
    records = [
        rec(0.0, 0.1, 1.1, 11),  # TPOT 100 ms
        rec(1.0, 0.3, 0.8, 6),  # TPOT 100 ms, TTFT 300 ms
        rec(2.0, 0.2, 2.2, 5),  # TPOT 500 ms
        RequestRecord(sent=3.0, scheduled=2.999, e2e=0.0, status=429, error="rate_limited"),
    ]
    s = summarize(records, Slo(ttft_ms=250, tpot_ms=200), gpus=2)
    assert s["requests"] == 4 and s["completed"] == 3 and s["rejected"] == 1 and s["errors"] == 0
    assert s["duration_s"] == pytest.approx(4.2)  # first send 0.0 → last completion 2.0 + 2.2
    assert s["request_throughput"] == pytest.approx(3 / 4.2)
    assert s["output_throughput"] == pytest.approx(22 / 4.2)
    assert s["total_token_throughput"] == pytest.approx(52 / 4.2)
    assert s["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(100.0)
    assert s["tpot_ms"]["max"] == pytest.approx(500.0)
    # ITL: 10 gaps of 100 ms, 5 of 100 ms, 4 of 500 ms → 19 gaps, mean (1.5 + 2.0)/19 s.
    assert s["itl_ms"]["mean"] == pytest.approx(3500 / 19)
    assert s["e2e_ms"]["p50"] == pytest.approx(1100.0)
    # Only the first request meets TTFT ≤ 250 and TPOT ≤ 200; the rejected one counts as a miss.
    assert s["slo_attainment"] == pytest.approx(0.25)
    assert s["goodput"] == pytest.approx(1 / 4.2)
    assert s["rejection_rate"] == pytest.approx(0.25)
    assert s["error_rate"] == 0.0
    assert s["error_codes"] == {"rate_limited": 1}
    assert s["gpu_seconds_per_success"] == pytest.approx(2 * 4.2 / 3)
    assert s["send_lag_ms"]["max"] == pytest.approx(1.0)


def test_queue_delay_from_gateway_header() -> None:
    records = [rec(0, 0.1, 0.5, 3, headers={"x-omnigate-queue-ms": str(q)}) for q in (10, 20, 30, 40, 50)]
    s = summarize(records, Slo())
    assert s["queue_ms"]["p50"] == 30.0 and s["queue_ms"]["p99"] == pytest.approx(49.6)
    assert summarize([rec(0, 0.1, 0.5, 3)], Slo())["queue_ms"] is None


def test_breakdowns_and_series() -> None:
    records = [
        rec(0.0, 0.1, 0.5, 3, bucket="text", tenant="a"),
        rec(0.5, 0.1, 0.5, 3, bucket="text", tenant="b"),
        rec(1.2, 0.2, 0.6, 5, bucket="multi_image", tenant="a"),
    ]
    b = breakdowns(records, Slo(), 2.0)
    assert set(b) == {"bucket", "tenant"}
    assert b["bucket"]["text"]["completed"] == 2 and b["tenant"]["a"]["output_throughput"] == pytest.approx(
        4.0
    )
    rows = time_series(records)
    assert [r["sent"] for r in rows] == [2, 1]
    assert [r["completed"] for r in rows] == [1, 2]  # completions at 0.5, 1.0, 1.8
    assert rows[1]["output_tokens"] == 8


def test_error_bursts_flag_crash_like_failures_only() -> None:
    crash = [RequestRecord(sent=5.0 + i * 0.1, e2e=0.01, status=0, error="transport") for i in range(6)]
    full = [RequestRecord(sent=9.0 + i * 0.1, e2e=0.01, status=503, error="queue_full") for i in range(6)]
    assert error_bursts(crash + full) == 1


def test_scaled_records_expand_times() -> None:
    headers = {"x-omnigate-queue-ms": "2", "x-omnigate-predicted-ttft-ms": "0.5"}
    r = rec(1.0, 0.1, 0.5, 3, headers=headers).scaled(10)
    assert (r.sent, r.ttft, r.e2e, r.queue_ms, r.predicted_ttft_ms) == (10.0, 1.0, 5.0, 20.0, 5.0)
    assert r.chunk_times == pytest.approx([1.0, 3.0, 5.0])
