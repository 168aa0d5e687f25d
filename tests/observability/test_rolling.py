from __future__ import annotations

import pytest

from gateway.observability.rolling import EDGES, GROWTH, RollingQuantile, SloTracker


def test_p99_is_the_nearest_rank_bucket_edge() -> None:
    q = RollingQuantile(window_s=60, slots=6)
    for _ in range(99):
        q.observe(EDGES[100], now=1.0)
    q.observe(EDGES[300], now=1.0)
    assert q.quantile(0.99, now=1.0) == EDGES[100]
    q.observe(EDGES[300], now=2.0)  # 101 samples: rank 100 now lands on the slow ones
    assert q.quantile(0.99, now=2.0) == EDGES[300]
    assert q.quantile(0.5, now=2.0) == EDGES[100]


def test_reported_quantile_is_an_upper_bound_within_one_bucket() -> None:
    q = RollingQuantile(window_s=60)
    for value in (0.0123, 0.0456, 0.0789):
        q.observe(value, now=0.0)
    q.observe(5.0, now=0.0)
    p = q.quantile(0.75, now=0.0)
    assert p is not None
    assert 0.0789 <= p <= 0.0789 * GROWTH
    assert q.quantile(1.0, now=0.0) == 5.0  # clipped to the largest sample, not the bucket edge


def test_samples_leave_the_window_by_slice() -> None:
    q = RollingQuantile(window_s=60, slots=6)  # 10 s slices
    q.observe(0.5, now=3.0)  # slice [0, 10)
    q.observe(0.7, now=45.0)
    assert q.count(now=69.9) == 2  # the slice is live until its end leaves the window
    assert q.count(now=70.0) == 1
    assert q.quantile(0.99, now=70.0) == 0.7
    assert q.count(now=200.0) == 0
    assert q.quantile(0.99, now=200.0) is None


def test_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        RollingQuantile(window_s=0)


def test_attainment_judges_each_request_against_its_slo_and_counts_failures_as_misses() -> None:
    t = SloTracker(window_s=60, slots=6)
    for _ in range(3):
        t.observe("interactive", 1.0, ttft=0.5, tpot=0.05, ttft_slo=2.0, tpot_slo=0.06)
    t.observe("interactive", 1.0, ttft=2.5, tpot=0.05, ttft_slo=2.0, tpot_slo=0.06)  # TTFT miss
    t.observe("interactive", 1.0, ttft=0.5, tpot=0.07, ttft_slo=2.0, tpot_slo=0.06)  # TPOT miss
    t.observe("interactive", 1.0, failed=True)
    t.observe("offline", 1.0, ttft=30.0, tpot=0.2)  # no objectives: met
    s = t.stats("interactive", now=2.0)
    assert (s.samples, s.attainment) == (5, 0.5)
    assert s.ttft_p99 == 2.5 and s.tpot_p99 == 0.07
    off = t.stats("offline", now=2.0)
    assert (off.samples, off.attainment) == (1, 1.0)
    assert list(t.snapshot(now=2.0)) == ["interactive", "offline"]
    assert t.stats("unknown", now=2.0).attainment is None
