"""bench/scheduling.py's peak figures: which requests count as the sawtooth's peak, and the per-bucket
count of those that met the SLO (pure: no process is started)."""

from __future__ import annotations

import argparse

import pytest

from bench import scheduling
from loadtest.records import RequestRecord


def _record(at: float, bucket: str, *, tpot_s: float = 0.03, status: int = 200) -> RequestRecord:
    """A streamed answer of 11 tokens sent `at` seconds into the run, first token after 0.5 s."""
    rec = RequestRecord(bucket=bucket, scheduled=at, sent=at, status=status, output_tokens=11)
    if status == 200:
        rec.ttft, rec.e2e = 0.5, 0.5 + 10 * tpot_s
    else:
        rec.error = "slo_unattainable"
    return rec


def _stream(records: list[RequestRecord]) -> scheduling.Stream:
    """The multi-image compare's workload over 100 s at time scale 1: a triangle sawtooth 0.6 → 4 → 0.6
    req/s with a 50 s period, so the rate is at or above its mid-point (2.3) from 12.5 to 37.5 s and
    from 62.5 to 87.5 s."""
    args = argparse.Namespace(duration=100.0, time_scale=1.0, drain=10.0)
    over = scheduling.sawtooth(args, 2.0, scheduling.MIXES["multi"])
    return scheduling.Stream("multi", scheduling.workload(args, "multi", **over), records=records)


def test_the_peak_half_is_the_top_of_each_ramp_and_buckets_count_its_requests() -> None:
    records = [
        _record(0.0, "text"),  # the trough: not the peak
        _record(20.0, "text"),  # rising, above the mid rate: met
        _record(30.0, "multi_image", tpot_s=0.08),  # falling, still above: its TPOT misses 60 ms
        _record(70.0, "multi_image"),  # second period: met
        _record(80.0, "single_image", status=429),  # refused
        _record(95.0, "text"),  # below the mid rate again
    ]
    s = _stream(records)

    peak, seconds = scheduling.peak_half(s)

    assert [r.scheduled for r in peak] == [20.0, 30.0, 70.0, 80.0]
    assert seconds == pytest.approx(50.0, abs=0.3)  # two 25 s halves on a 0.1 s grid, both ends in
    assert scheduling.peak_goodput(s) == pytest.approx(2 / seconds)
    assert scheduling.peak_by_bucket(s) == "multi_image 1/2 · single_image 0/1 · text 1/1"


def test_a_stream_without_records_has_no_peak() -> None:
    s = _stream([])
    assert scheduling.peak_half(s) == ([], 0.0)
    assert scheduling.peak_goodput(s) == 0.0
    assert scheduling.peak_by_bucket(s) == ""
