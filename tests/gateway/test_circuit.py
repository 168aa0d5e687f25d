"""The circuit breaker on a fake clock: every transition, exact probe counts, and what each verdict does.

Dispatches are made the way the dispatcher makes them (raising `BackendState.active`), verdicts the way
the pipeline reports them (`Pool.record_*` with the attempt's dispatch time), health checks through
`Pool.record_health`: the pool is real, only its clock is fake and nothing is sent anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gateway.backends.circuit import CircuitState, Transition
from gateway.backends.pool import Pool
from gateway.backends.settings import CircuitPolicy
from gateway.backends.state import BackendState
from gateway.settings.config import PoolConfig

CLOSED, OPEN, HALF_OPEN = CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN


@dataclass
class Rig:
    settings: CircuitPolicy
    now: float = 1000.0
    moves: list[Transition] = field(default_factory=list)
    pool: Pool = field(init=False)

    def __post_init__(self) -> None:
        config = PoolConfig(name="p", models=("m",), backends=("http://b0", "http://b1"))
        self.pool = Pool(
            config, clock=lambda: self.now, circuit=lambda: self.settings, on_transition=self.moves.append
        )

    @property
    def b(self) -> BackendState:
        return self.pool.backends[0]

    def send(self) -> float:
        """Dispatch one request to b0 if it may take one; its dispatch time."""
        assert self.b.available, f"b0 refused a request while {self.b.circuit}"
        self.b.active += 1
        return self.now

    def done(self, dispatched_at: float) -> None:
        self.b.active -= 1

    def trail(self) -> list[tuple[str, str, str]]:
        return [(t.old, t.new, t.reason) for t in self.moves]

    def trip(self) -> None:
        """Open b0 by failures in a row, then let the cool-down pass and a health check half-open it."""
        for _ in range(self.settings.consecutive_failures or 0):
            at = self.send()
            self.pool.record_failure(self.b, at)
            self.done(at)
        assert self.b.circuit == OPEN
        self.now += self.settings.open_s
        self.pool.record_health(self.b, True)
        assert self.b.circuit == HALF_OPEN


def rig(**settings: object) -> Rig:
    base: dict[str, object] = {"consecutive_failures": 3, "failure_ratio": None, "open_s": 5.0}
    return Rig(CircuitPolicy.model_validate({**base, **settings}))


def test_open_half_open_closed_with_exactly_the_probes_asked_for() -> None:
    r = rig(half_open_probes=2)
    first = r.send()
    r.pool.record_failure(r.b, first)
    r.pool.record_success(r.b, r.send())  # a success resets the run of failures
    for _ in range(2):
        r.pool.record_failure(r.b, r.send())
    assert r.b.circuit == CLOSED and r.b.available
    r.pool.record_failure(r.b, r.send())
    assert (r.b.circuit, r.b.available, r.b.up) == (OPEN, False, False)

    r.now += 4.9  # the cool-down is not over: a passing health check changes nothing
    r.pool.record_health(r.b, True)
    assert r.b.circuit == OPEN
    r.now += 0.1
    r.pool.record_health(r.b, True)
    assert r.b.circuit == HALF_OPEN

    probes = [r.send(), r.send()]  # two probes, as asked: the third request is refused
    assert (r.b.available, r.b.up, r.pool.ready()) == (False, True, True)
    r.pool.record_success(r.b, probes[0])
    assert r.b.circuit == HALF_OPEN and not r.b.available  # one success of two
    r.pool.record_success(r.b, probes[1])
    assert r.b.circuit == CLOSED and r.b.available
    assert r.trail() == [
        (CLOSED, OPEN, "3 failures in a row"),
        (OPEN, HALF_OPEN, "cool-down of 5 s over"),
        (HALF_OPEN, CLOSED, "2 probe(s) succeeded"),
    ]


def test_open_half_open_open_when_a_probe_fails_and_the_cool_down_starts_again() -> None:
    r = rig()
    r.trip()
    probe = r.send()
    assert not r.b.available  # one probe by default
    r.now += 0.5
    r.pool.record_failure(r.b, probe)
    assert r.b.circuit == OPEN
    r.now += 4.9
    r.pool.record_health(r.b, True)
    assert r.b.circuit == OPEN  # the cool-down counts from the probe's failure
    r.now += 0.1
    r.pool.record_health(r.b, True)
    assert r.b.circuit == HALF_OPEN
    assert [t[:2] for t in r.trail()] == [
        (CLOSED, OPEN),
        (OPEN, HALF_OPEN),
        (HALF_OPEN, OPEN),
        (OPEN, HALF_OPEN),
    ]
    assert r.trail()[2][2] == "a probe failed while half-open"


def test_failing_health_checks_hold_the_circuit_open_and_reopen_a_half_open_one() -> None:
    r = rig()
    for _ in range(3):
        r.pool.record_failure(r.b, r.send())
    r.now += 4.0
    r.pool.record_health(r.b, False)  # restarts the cool-down
    r.now += 4.0
    r.pool.record_health(r.b, True)
    assert (r.b.circuit, r.b.healthy) == (OPEN, True)
    r.now += 1.0
    r.pool.record_health(r.b, True)
    assert r.b.circuit == HALF_OPEN
    r.pool.record_health(r.b, False)
    assert (r.b.circuit, r.b.healthy) == (OPEN, False)
    assert r.trail()[-1] == (HALF_OPEN, OPEN, "health check failed while half-open")


def test_a_probe_without_verdict_gives_its_place_to_another() -> None:
    r = rig()
    r.trip()
    cancelled = r.send()
    assert not r.b.available
    r.pool.record_no_verdict(r.b, cancelled)  # the client left before the backend answered
    r.done(cancelled)
    assert r.b.available and r.b.circuit == HALF_OPEN
    r.pool.record_success(r.b, r.send())
    assert r.b.circuit == CLOSED


def test_requests_from_before_the_cool_down_do_not_close_it_but_their_failures_reopen_it() -> None:
    r = rig()
    old = r.send()  # dispatched while closed, still running (a long stream)
    for _ in range(3):
        r.pool.record_failure(r.b, r.send())
    r.now += 5.0
    r.pool.record_health(r.b, True)
    r.pool.record_success(r.b, old)  # answered, but it is no probe: the circuit stays half-open
    assert r.b.circuit == HALF_OPEN and r.b.available
    r.pool.record_failure(r.b, old, answered=True)
    assert r.trail()[-1] == (HALF_OPEN, OPEN, "a request from before the cool-down failed while half-open")


def test_failure_ratio_over_the_window_opens_where_no_run_of_failures_does() -> None:
    r = rig(consecutive_failures=None, failure_ratio=0.5, window_s=10.0, min_requests=10)
    for _ in range(4):  # a stream that breaks after its first byte: one failed request, not one of each
        at = r.send()
        r.pool.record_success(r.b, at)
        r.pool.record_failure(r.b, at, answered=True)
        r.pool.record_success(r.b, r.send())
        r.now += 0.5
    assert r.b.circuit == CLOSED  # 4 of 8 finished requests failed: fewer than min_requests
    r.pool.record_success(r.b, r.send())
    at = r.send()
    r.pool.record_success(r.b, at)
    r.pool.record_failure(r.b, at, answered=True)
    assert r.trail() == [(CLOSED, OPEN, "5 of 10 requests failed in 10 s")]


def test_failure_ratio_forgets_what_left_the_window() -> None:
    r = rig(consecutive_failures=None, failure_ratio=0.5, window_s=10.0, min_requests=4)
    for _ in range(3):
        r.pool.record_failure(r.b, r.send())
    r.now += 10.0  # those three left the window
    r.pool.record_success(r.b, r.send())
    r.pool.record_success(r.b, r.send())
    r.pool.record_success(r.b, r.send())
    r.pool.record_failure(r.b, r.send())
    assert r.b.circuit == CLOSED  # 1 of 4
    r.pool.record_failure(r.b, r.send())
    assert r.b.circuit == CLOSED  # 2 of 5
    r.pool.record_failure(r.b, r.send())
    assert r.trail() == [(CLOSED, OPEN, "3 of 6 requests failed in 10 s")]


def test_a_reload_applies_to_the_next_outcome() -> None:
    r = rig()
    r.pool.record_failure(r.b, r.send())
    r.pool.record_failure(r.b, r.send())
    r.settings = CircuitPolicy(consecutive_failures=2, failure_ratio=None)
    r.pool.record_failure(r.b, r.send())
    assert r.trail() == [(CLOSED, OPEN, "3 failures in a row")]
    r.settings = CircuitPolicy(consecutive_failures=None, failure_ratio=None, open_s=1.0, half_open_probes=3)
    r.now += 1.0
    r.pool.record_health(r.b, True)
    for _ in range(3):
        r.send()
    assert not r.b.available


@pytest.mark.parametrize("state", [CLOSED, OPEN, HALF_OPEN])
def test_the_other_backend_is_never_touched(state: CircuitState) -> None:
    r = rig()
    r.b.circuit = state
    other = r.pool.backends[1]
    other.active += 5
    assert (other.circuit, other.breaker.probes_sent, other.available) == (CLOSED, 0, True)


def test_a_probe_released_without_any_verdict_frees_its_place_once_it_leaves() -> None:
    r = rig(half_open_probes=2)
    r.trip()
    lost, running = r.send(), r.send()
    assert not r.b.available
    r.done(lost)  # its client left while it was being handed the backend: nobody reports a verdict
    assert r.b.available  # one probe still on the backend: one place free
    third = r.send()
    assert not r.b.available
    r.pool.record_no_verdict(r.b, running)  # a verdict, then the release: one place, not two
    r.done(running)
    r.send()
    assert not r.b.available
    r.pool.record_success(r.b, third)
    assert r.b.circuit == HALF_OPEN and not r.b.available


def test_requests_from_before_keep_a_lost_probe_s_place_taken_until_they_leave() -> None:
    r = rig()
    old = r.send()  # from before the cool-down, still running
    r.trip()
    lost = r.send()
    r.done(lost)
    assert not r.b.available  # 1 active: the old request or the probe, nothing tells which
    r.done(old)
    assert r.b.available


def test_overload_refusals_and_client_errors_are_no_verdict() -> None:
    r = rig()
    r.trip()
    for _ in range(3):
        at = r.send()
        r.pool.record_no_verdict(r.b, at)  # e.g. 503 queue full, 400 from the backend
        r.done(at)
    assert r.b.circuit == HALF_OPEN and r.b.available
