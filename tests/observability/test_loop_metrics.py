"""Loop metrics expose exactly what prometheus-client's own Counter and Histogram expose."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from gateway.observability.loop_metrics import LoopCounter, LoopHistogram

pytestmark = pytest.mark.unit

BUCKETS = (0.1, 0.5, 1.0, 5.0)
AMOUNTS = (0.0, 0.1, 0.10001, 0.5, 0.7, 1.0, 5.0, 5.1, 1e9, math.inf, -3.0, math.nan, 2)


def exposition(registry: CollectorRegistry) -> list[str]:
    """The exposition's lines without the creation timestamps (they differ by the microsecond)."""
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_loop_histogram_exposes_what_prometheus_clients_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = LoopHistogram("h_seconds", "A histogram.", ["pool"], buckets=BUCKETS, registry=ours)
    b = Histogram("h_seconds", "A histogram.", ["pool"], buckets=BUCKETS, registry=theirs)
    for amount in AMOUNTS:
        a.labels("p").observe(amount)
        b.labels("p").observe(amount)
    a.labels("q").observe(0.3)
    b.labels("q").observe(0.3)
    assert exposition(ours) == exposition(theirs)
    assert ours.get_sample_value("h_seconds_bucket", {"pool": "p", "le": "0.1"}) == 3  # -3, 0 and 0.1
    assert ours.get_sample_value("h_seconds_count", {"pool": "p"}) == len(AMOUNTS) - 1  # NaN: no bucket
    assert ours.get_sample_value("h_seconds_created", {"pool": "q"}) is not None


def test_a_loop_counter_exposes_what_prometheus_clients_does() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    a = LoopCounter("c_total", "A counter.", ["tenant"], registry=ours)
    b = Counter("c_total", "A counter.", ["tenant"], registry=theirs)
    for counter in (a, b):
        counter.labels("t").inc()
        counter.labels("t").inc(2.5)
        counter.labels("u").inc(0)
    assert exposition(ours) == exposition(theirs)
    assert ours.get_sample_value("c_total", {"tenant": "t"}) == 3.5


def test_a_loop_counter_refuses_what_prometheus_clients_refuses() -> None:
    c = LoopCounter("r_total", "A counter.", registry=CollectorRegistry())
    with pytest.raises(ValueError):
        c.inc(-1)
    c.inc(4)
    c.reset()
    assert c._value.get() == 0


def test_exemplars_are_refused_not_dropped() -> None:
    registry = CollectorRegistry()
    with pytest.raises(ValueError, match="exemplars"):
        LoopCounter("e_total", "A counter.", registry=registry).inc(1, {"trace_id": "1"})
    with pytest.raises(ValueError, match="exemplars"):
        LoopHistogram("e_seconds", "A histogram.", registry=registry).observe(1, {"trace_id": "1"})
