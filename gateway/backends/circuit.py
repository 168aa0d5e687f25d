"""The circuit breaker of one backend: closed → open → half-open → closed, or open again.

- **closed**: requests go. It opens after `consecutive_failures` request failures in a row, or when the
  failed share of the requests finished in the last `window_s` reaches `failure_ratio` (with at least
  `min_requests` of them): the first catches a dead backend at once, the second one that fails often.
- **open**: nothing goes. After `open_s`, the first passing health check half-opens it; a failing one
  restarts the cool-down, so a backend is never probed with requests while its `/health` fails.
- **half-open**: exactly `half_open_probes` requests go — counted as the dispatcher hands them out, so
  one dispatch round cannot send more. Once that many succeeded it closes; the first failure (a probe's,
  a request's still running from before, or a health check's) opens it again. A probe that ends with no
  verdict (the client left, the backend answered 4xx) gives its place to another.

Pure code on an injected clock value: each call returns the transition it made, if any; the pool
(gateway/backends/pool.py) logs it and hands it on to be counted and alerted. Health-check failures do
not count toward the thresholds: a failing health check already takes the backend out of rotation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from gateway.backends.settings import CircuitPolicy

WINDOW_SLOTS = 10  # the ratio window is kept as this many sub-intervals: O(1) memory per backend


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class Outcomes:
    """Successes and failures over a sliding window, in WINDOW_SLOTS sub-intervals."""

    width: float = 0.0
    slots: list[tuple[int, int, int]] = field(default_factory=list)  # (interval index, ok, failed)

    def add(self, now: float, window_s: float, failed: bool, was_ok: bool = False) -> None:
        """Count one finished request; `was_ok`: it was counted a success at its first byte and failed
        later (a stream cut mid-way), so one success of the current interval becomes this failure."""
        width = window_s / WINDOW_SLOTS
        if width != self.width:  # a reload changed the window: start it afresh
            self.width, self.slots = width, [(-1, 0, 0)] * WINDOW_SLOTS
        index = int(now // width)
        at, ok, bad = self.slots[index % WINDOW_SLOTS]
        if at != index:
            ok = bad = 0
        if was_ok and ok:
            ok -= 1
        self.slots[index % WINDOW_SLOTS] = (index, ok + (not failed), bad + failed)

    def counts(self, now: float) -> tuple[int, int]:
        """(finished, failed) within the window ending now."""
        if not self.width:
            return 0, 0
        index = int(now // self.width)
        live = [(ok, bad) for at, ok, bad in self.slots if index - WINDOW_SLOTS < at <= index]
        return sum(ok + bad for ok, bad in live), sum(bad for _, bad in live)

    def clear(self) -> None:
        self.slots = [(-1, 0, 0)] * WINDOW_SLOTS if self.width else []


@dataclass(slots=True)
class Breaker:
    state: CircuitState = CircuitState.CLOSED
    since: float = float("-inf")  # clock value of the last transition (or cool-down restart)
    consecutive_failures: int = 0
    probe_limit: int = 1  # half_open_probes as it was when the circuit half-opened
    probes_sent: int = 0
    probe_successes: int = 0
    outcomes: Outcomes = field(default_factory=Outcomes)

    def allows(self) -> bool:
        """May the dispatcher hand this backend a request now?"""
        if self.state == CircuitState.CLOSED:
            return True
        return self.state == CircuitState.HALF_OPEN and self.probes_sent < self.probe_limit

    def dispatched(self) -> None:
        """A request was handed to the backend (BackendState.active went up)."""
        if self.state == CircuitState.HALF_OPEN:
            self.probes_sent += 1

    def released(self, active: int) -> None:
        """A request left the backend (BackendState.active went down to `active`). Probes awaiting a
        verdict are among the requests still there, so a probe released with no verdict reported (its
        client left while it was being dispatched) frees its place here. Verdicts are reported before
        the release, so this never frees the place of a probe still running."""
        if self.state == CircuitState.HALF_OPEN:
            self.probes_sent = min(self.probes_sent, self.probe_successes + active)

    def is_probe(self, dispatched_at: float | None) -> bool:
        return (
            self.state == CircuitState.HALF_OPEN and dispatched_at is not None and dispatched_at >= self.since
        )


@dataclass(frozen=True, slots=True)
class Transition:
    pool: str
    backend: str
    old: CircuitState
    new: CircuitState
    reason: str


def _move(b: Breaker, new: CircuitState, now: float, settings: CircuitPolicy) -> CircuitState:
    old, b.state, b.since = b.state, new, now
    b.probes_sent = b.probe_successes = 0
    b.probe_limit = settings.half_open_probes
    if new != CircuitState.OPEN:  # a fresh start: what happened before the cool-down decides nothing
        b.consecutive_failures = 0
        b.outcomes.clear()
    return old


def success(
    b: Breaker, settings: CircuitPolicy, now: float, dispatched_at: float | None
) -> tuple[CircuitState, str] | None:
    """The backend answered a request; returns (old state, reason) when the circuit closes."""
    probe = b.is_probe(dispatched_at)
    b.consecutive_failures = 0
    b.outcomes.add(now, settings.window_s, failed=False)
    if probe:
        b.probe_successes += 1
        if b.probe_successes >= b.probe_limit:
            n = b.probe_successes
            return _move(b, CircuitState.CLOSED, now, settings), f"{n} probe(s) succeeded"
    return None


def failure(
    b: Breaker, settings: CircuitPolicy, now: float, dispatched_at: float | None, answered: bool = False
) -> tuple[CircuitState, str] | None:
    """A request failed on the backend (connection, timeout, 5xx; `answered`: a stream that broke after
    its first byte, already counted a success then); returns (old state, reason) when the circuit opens."""
    b.consecutive_failures += 1
    b.outcomes.add(now, settings.window_s, failed=True, was_ok=answered)
    if b.state == CircuitState.HALF_OPEN:
        what = "a probe" if b.is_probe(dispatched_at) else "a request from before the cool-down"
        return _move(b, CircuitState.OPEN, now, settings), f"{what} failed while half-open"
    if b.state != CircuitState.CLOSED:
        return None
    limit = settings.consecutive_failures
    if limit is not None and b.consecutive_failures >= limit:
        return _move(b, CircuitState.OPEN, now, settings), f"{b.consecutive_failures} failures in a row"
    finished, failed = b.outcomes.counts(now)
    ratio = settings.failure_ratio
    if ratio is not None and finished >= settings.min_requests and failed >= ratio * finished:
        reason = f"{failed} of {finished} requests failed in {settings.window_s:g} s"
        return _move(b, CircuitState.OPEN, now, settings), reason
    return None


def no_verdict(b: Breaker, dispatched_at: float | None) -> None:
    """A request ended without telling whether the backend works: a probe's place goes to another."""
    if b.is_probe(dispatched_at) and b.probes_sent > 0:
        b.probes_sent -= 1


def health(b: Breaker, settings: CircuitPolicy, now: float, healthy: bool) -> tuple[CircuitState, str] | None:
    """A health check's result; returns (old state, reason) on a transition."""
    if b.state == CircuitState.OPEN:
        if not healthy:
            b.since = now  # restart the cool-down
        elif now - b.since >= settings.open_s:
            return _move(b, CircuitState.HALF_OPEN, now, settings), f"cool-down of {settings.open_s:g} s over"
    elif b.state == CircuitState.HALF_OPEN and not healthy:
        return _move(b, CircuitState.OPEN, now, settings), "health check failed while half-open"
    return None
