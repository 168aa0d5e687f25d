"""Virtual token counters (fairness.py) and recent service (standing.py): what a replica keeps for the
replicas' shared sums, exactly."""

from __future__ import annotations

import math

import pytest

from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.standing import RecentService

pytestmark = pytest.mark.unit


def test_alone_nothing_is_kept_for_sharing() -> None:
    vtc = VirtualTokenCounters()
    vtc.charge("a", 10.0)
    assert vtc.take_pending() == {}
    assert vtc.counter("a") == 10.0


def test_shared_changes_are_taken_once_and_the_sums_adopted_with_what_came_since() -> None:
    vtc = VirtualTokenCounters()
    vtc.share()
    vtc.charge("a", 10.0)
    vtc.charge("a", -2.0)  # the end's correction
    vtc.on_backlogged("b", ["a"])  # lifted to a's 8
    assert vtc.take_pending() == {"a": 8.0, "b": 8.0}
    assert vtc.take_pending() == {}
    vtc.charge("a", 1.0)  # dispatched while the sums were on their way
    vtc.merge({"a": 30.0, "b": 8.0, "c": 5.0})  # another replica served a 22 and c 5
    assert [vtc.counter(t) for t in "abc"] == [31.0, 8.0, 5.0]
    assert vtc.take_pending() == {"a": 1.0}


def test_changes_that_were_not_sent_go_out_next_time() -> None:
    vtc = VirtualTokenCounters()
    vtc.share()
    vtc.charge("a", 4.0)
    taken = vtc.take_pending()
    vtc.charge("a", 1.0)
    vtc.restore(taken)  # the round trip failed
    assert vtc.take_pending() == {"a": 5.0}


def test_recent_service_keeps_its_shared_charges_decayed_and_adopts_the_sums() -> None:
    recent = RecentService()
    recent.charge("a", 10.0, now=0.0, window_s=60.0)
    assert recent.take_pending(0.0, 60.0) == {}  # alone: nothing kept
    recent.share()
    recent.charge("a", 10.0, now=0.0, window_s=60.0)
    assert recent.take_pending(60.0, 60.0) == pytest.approx({"a": 10.0 * math.exp(-1.0)})
    recent.charge("a", 4.0, now=60.0, window_s=60.0)  # charged while the sums were on their way
    recent.merge({"a": 25.0, "b": 3.0}, now=60.0, window_s=60.0)
    assert recent.value("a", 60.0, 60.0) == pytest.approx(29.0)
    assert recent.value("b", 120.0, 60.0) == pytest.approx(3.0 * math.exp(-1.0))
    taken = recent.take_pending(60.0, 60.0)
    assert taken == pytest.approx({"a": 4.0})
    recent.restore(taken, now=60.0, window_s=60.0)  # not sent: next time, decayed on
    assert recent.take_pending(120.0, 60.0) == pytest.approx({"a": 4.0 * math.exp(-1.0)})
