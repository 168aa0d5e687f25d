"""Arrival generators: seeded schedules with the right rates and shapes, independent across workers."""

from __future__ import annotations

import itertools
import statistics

import pytest

from loadtest.arrivals import burst_shape, constant_shape, sawtooth_shape, schedule, step_shape


def count_in(offsets: list[float], lo: float, hi: float) -> int:
    return sum(lo <= t < hi for t in offsets)


def test_poisson_rate_and_exponential_gaps() -> None:
    offs = schedule(constant_shape(50.0), duration=200.0, seed=1)
    assert abs(len(offs) - 10_000) < 4 * 100  # Poisson count: mean 10k, sd 100
    gaps = [b - a for a, b in itertools.pairwise(offs)]
    cv = statistics.stdev(gaps) / statistics.mean(gaps)
    assert 0.95 < cv < 1.05  # exponential gaps have CV 1


def test_gamma_burstiness_sets_gap_dispersion() -> None:
    bursty = schedule(constant_shape(50.0), duration=200.0, process="gamma", burstiness=0.25, seed=2)
    smooth = schedule(constant_shape(50.0), duration=200.0, process="gamma", burstiness=4.0, seed=2)
    for offs, expected_cv in ((bursty, 2.0), (smooth, 0.5)):  # CV of gamma gaps = 1/sqrt(shape)
        gaps = [b - a for a, b in itertools.pairwise(offs)]
        assert abs(len(offs) - 10_000) < 1000
        assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(expected_cv, rel=0.1)


def test_constant_process_is_exact_and_workers_interleave() -> None:
    assert schedule(constant_shape(4.0), duration=1.0, process="constant") == [0.125, 0.375, 0.625, 0.875]
    w0 = schedule(constant_shape(4.0), duration=1.0, process="constant", worker=0, workers=2)
    w1 = schedule(constant_shape(4.0), duration=1.0, process="constant", worker=1, workers=2)
    assert w0 == [0.125, 0.625] and w1 == [0.375, 0.875]


def test_same_seed_same_schedule_and_count_bound() -> None:
    a = schedule(constant_shape(10.0), duration=10.0, seed=5)
    assert a == schedule(constant_shape(10.0), duration=10.0, seed=5)
    assert a != schedule(constant_shape(10.0), duration=10.0, seed=6)
    assert len(schedule(constant_shape(10.0), duration=100.0, count=7, seed=5)) == 7


def test_step_ramp_follows_the_ladder() -> None:
    offs = schedule(step_shape([10, 40, 20], dwell=50.0), duration=150.0, seed=3)
    for (lo, hi), rate in zip([(0, 50), (50, 100), (100, 150)], [10, 40, 20], strict=True):
        expected = rate * 50
        assert abs(count_in(offs, lo, hi) - expected) < 4 * expected**0.5


def test_sawtooth_rises_and_falls() -> None:
    shape = sawtooth_shape(10.0, 80.0, period=40.0, duration=400.0)
    assert [shape.rate(t) for t in (0.0, 10.0, 20.0, 30.0, 40.0)] == [10.0, 45.0, 80.0, 45.0, 10.0]
    offs = schedule(shape, duration=400.0, seed=4)
    # Per period: ∫ = 40 s × mean rate 45 = 1800; first quarter (0–10 s) ∫ = 10 × 27.5 = 275.
    assert abs(len(offs) - 18_000) < 4 * 18_000**0.5
    first_quarters = sum(count_in(offs, p * 40, p * 40 + 10) for p in range(10))
    peaks = sum(count_in(offs, p * 40 + 15, p * 40 + 25) for p in range(10))
    assert abs(first_quarters - 2750) < 4 * 2750**0.5
    assert peaks > 2.5 * first_quarters


def test_burst_shape() -> None:
    offs = schedule(burst_shape(5.0, 100.0, every=20.0, length=2.0, duration=200.0), duration=200.0, seed=8)
    in_bursts = sum(count_in(offs, k * 20, k * 20 + 2) for k in range(10))
    assert abs(in_bursts - 2000) < 4 * 2000**0.5
    assert abs((len(offs) - in_bursts) - 900) < 4 * 30


def test_workers_split_rate_and_draw_independent_gaps() -> None:
    per = [schedule(constant_shape(40.0), duration=200.0, seed=9, worker=k, workers=4) for k in range(4)]
    total = sum(len(p) for p in per)
    assert abs(total - 8000) < 4 * 8000**0.5
    for p in per:
        assert abs(len(p) - 2000) < 4 * 2000**0.5
    g0 = [b - a for a, b in zip(per[0], per[0][1:], strict=False)]
    g1 = [b - a for a, b in zip(per[1], per[1][1:], strict=False)]
    n = min(len(g0), len(g1))
    assert abs(statistics.correlation(g0[:n], g1[:n])) < 0.1
    assert not set(per[0]) & set(per[1])
    # The count bound is split too: 10 requests over 4 workers → 3, 3, 2, 2.
    assert [
        len(schedule(constant_shape(40.0), duration=200.0, count=10, worker=k, workers=4)) for k in range(4)
    ] == [
        3,
        3,
        2,
        2,
    ]


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        constant_shape(-1.0)
    with pytest.raises(ValueError):
        schedule(constant_shape(1.0), duration=1.0, worker=2, workers=2)
    with pytest.raises(ValueError):
        burst_shape(1.0, 2.0, every=5.0, length=6.0, duration=10.0)
