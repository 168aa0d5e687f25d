"""Holding the capacity of requests the gateway left while their server runs on: when each hold ends."""

from __future__ import annotations

import pytest

from gateway.backends.holds import Hold, Holds, predicted_end
from gateway.backends.state import BackendState
from gateway.request.ticket import Cost, Relayed, Ticket, Usage

URL = "http://b:1"


class Released:
    def __init__(self) -> None:
        self.order: list[str] = []

    def hold(self, name: str, *, stream: bool = True, since: float = 0.0, until: float = 100.0) -> Hold:
        return Hold(lambda: self.order.append(name), stream, since, until)


def _state(running: int | None = None, detached: int | None = None) -> BackendState:
    state = BackendState(url=URL, pool="p")
    state.running_reqs, state.detached_reqs = running, detached
    return state


def _holds(released: Released, *holds: Hold) -> Holds:
    h = Holds(grace_s=2.0)
    for hold in holds:
        h.add(URL, hold)
    return h


def test_a_hold_lasts_while_the_server_may_still_run_it() -> None:
    r = Released()
    holds = _holds(r, r.hold("a", until=50.0))
    assert holds.settle(_state(running=3, detached=1), now=10.0, probed_at=9.0) == 0
    assert (r.order, holds.count(URL)) == ([], 1)


def test_a_hold_ends_at_its_predicted_end_whatever_the_counts() -> None:
    r = Released()
    holds = _holds(r, r.hold("a", until=20.0), r.hold("b", until=40.0))
    assert holds.settle(_state(running=9, detached=9), now=20.0, probed_at=None) == 1
    assert (r.order, holds.count(URL)) == (["a"], 1)


def test_no_more_holds_run_than_the_server_tracks_requests_earliest_end_first() -> None:
    r = Released()
    holds = _holds(r, r.hold("late", until=90.0), r.hold("soon", until=30.0), r.hold("mid", until=60.0))
    assert holds.settle(_state(running=1), now=10.0, probed_at=9.0) == 2
    assert (r.order, holds.count(URL)) == (["soon", "mid"], 1)
    assert holds.settle(_state(running=0), now=11.0, probed_at=10.5) == 1
    assert r.order == ["soon", "mid", "late"]


def test_held_streams_still_running_are_at_most_the_requests_no_client_waits_for() -> None:
    r = Released()
    holds = _holds(
        r,
        r.hold("stream-1", until=30.0),
        r.hold("stream-2", until=60.0),
        r.hold("whole", stream=False, until=20.0),
    )
    # 5 tracked, 4 with a waiting handler (ours: the whole answer's, others'): one detached stream
    assert holds.settle(_state(running=5, detached=1), now=10.0, probed_at=9.0) == 1
    assert (r.order, holds.count(URL)) == (["stream-1"], 2)


def test_a_probe_sent_within_a_tick_of_the_hold_does_not_judge_it() -> None:
    r = Released()
    holds = _holds(r, r.hold("fresh", since=9.0))
    assert holds.settle(_state(running=0, detached=0), now=10.0, probed_at=10.5) == 0
    assert holds.settle(_state(running=0, detached=0), now=12.0, probed_at=11.0) == 1
    assert r.order == ["fresh"]


def test_without_counts_only_time_ends_holds() -> None:
    r = Released()
    holds = _holds(r, r.hold("a"))
    assert holds.settle(_state(running=0, detached=0), now=10.0, probed_at=None) == 0
    assert holds.settle(_state(), now=10.0, probed_at=9.0) == 0
    holds.release_all()
    assert (r.order, holds.count(URL)) == (["a"], 0)


def _ticket(**kw: object) -> Ticket:
    return Ticket(id="r", model="m", stream=True, arrival=0.0, cost=Cost(expected_output_tokens=100), **kw)


def test_the_predicted_end_is_the_rest_of_the_expected_answer_at_the_streams_pace() -> None:
    t = _ticket(
        usage=Usage(50, 21), relayed=Relayed(first_token_at=1.0, last_token_at=3.0)
    )  # 20 gaps of 0.1 s
    assert predicted_end(t, now=5.0, latest=1000.0, paced=True) == pytest.approx(5.0 + 79 * 0.1)
    assert predicted_end(t, now=5.0, latest=8.0, paced=True) == 8.0
    longer = _ticket(usage=Usage(50, 151), relayed=Relayed(first_token_at=1.0, last_token_at=16.0))
    assert predicted_end(longer, now=20.0, latest=1000.0, paced=True) == pytest.approx(
        20.1
    )  # past its estimate
    assert predicted_end(t, now=5.0, latest=1000.0, paced=False) == 1000.0  # a talker runs on after the text


@pytest.mark.parametrize(
    "ticket",
    [
        _ticket(),  # a whole answer, or a stream cut before any token
        _ticket(usage=Usage(50, 1), relayed=Relayed(first_token_at=1.0, last_token_at=1.0)),
    ],
)
def test_without_a_pace_the_hold_lasts_to_the_total_deadline(ticket: Ticket) -> None:
    assert predicted_end(ticket, now=5.0, latest=1800.0, paced=True) == 1800.0
