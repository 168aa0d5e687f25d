"""Slot turnover (turnover.py): running requests over the mean hold time — exact, fake clock."""

from __future__ import annotations

from gateway.admission.turnover import TURNOVER_SAMPLES, SlotTurnover, capacity_lost
from tests.admission.helpers import backends


def test_the_rate_is_the_running_requests_over_the_mean_hold() -> None:
    t = SlotTurnover()
    assert t.hold(10.0, 30.0) is None and t.rate(8, 10.0, 30.0) is None  # nothing released yet
    t.taken(1, 1.0)
    t.taken(2, 1.5)
    t.freed(1, 2.0)  # held 1 s
    t.freed(2, 4.5)  # held 3 s
    assert t.hold(5.0, 30.0) == 2.0
    assert t.rate(8, 5.0, 30.0) == 4.0  # 8 running, each 2 s: 4 slots free per second
    assert t.rate(0, 5.0, 30.0) == 0.0  # nothing running frees nothing
    assert t.hold(33.0, 30.0) == 3.0  # the first release aged out
    assert t.hold(40.0, 30.0) is None


def test_an_idle_spell_between_releases_is_no_part_of_the_rate() -> None:
    """The issue's burst: releases of a warm-up, a pause, then a burst on the backend that is left. A mean
    gap between releases read the pause as slow turnover; the hold time does not see it."""
    t = SlotTurnover()
    for i in range(TURNOVER_SAMPLES - 1):  # the warm-up: each request holds its slot 0.6 s
        t.taken(i, 1.0)
        t.freed(i, 1.6)
    t.taken(99, 20.0)  # 18 s later, the burst's first release
    t.freed(99, 20.6)
    assert t.hold(20.6, 30.0) == 0.6
    assert t.rate(40, 20.6, 30.0) == 40 / 0.6


def test_only_the_newest_holds_count_and_a_release_without_a_dispatch_counts_nothing() -> None:
    t = SlotTurnover()
    t.taken(0, 0.0)
    t.freed(0, 100.0)  # one long hold …
    for i in range(1, TURNOVER_SAMPLES + 1):  # … pushed out by a window of short ones
        t.taken(i, 100.0)
        t.freed(i, 101.0)
    t.freed(12345, 101.0)  # never taken here
    assert t.hold(101.0, 30.0) == 1.0


def test_capacity_is_lost_while_a_backend_is_unhealthy_or_its_circuit_not_closed() -> None:
    pool = backends(3)
    assert capacity_lost("interactive", pool) is None
    pool[1].healthy = False
    assert capacity_lost("interactive", pool) == "1 of 3 backends of pool interactive unavailable"
    pool[2].circuit = "half_open"  # recovering: probes only
    assert capacity_lost("interactive", pool) == "2 of 3 backends of pool interactive unavailable"
