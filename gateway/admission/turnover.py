"""The capacity a pool has left, and how fast its slots free: running requests over their mean hold.

A queued request that waits for a slot waits for releases; the guard (shedding.py) predicts that wait
from the rate at which the backends it may use release slots. By Little's law a backend running `n`
requests that each hold their slot `h` seconds on average releases `n / h` slots per second. Both parts
are measured: `n` is the backend's occupancy at the moment of the prediction, `h` the mean dispatch →
release time of its recent releases (every outcome: a slot freed by a failure or a client that left is
freed all the same). So the rate is the turnover of the capacity that is there now — a backend that
died and was marked unavailable drops out of the sum at once, one whose requests failed holds none —
and it is the rate while full whatever the pool did before: an idle spell between releases (a warm-up,
then a pause, then a burst) is no part of a hold time, where a mean gap between releases read it as
slow turnover and refused requests the remaining backend served in time.

`capacity_lost` says whether a pool runs on less than its whole capacity — a backend unhealthy or its
circuit not closed — so that a refusal for lack of capacity then is the server's (503), not the
client's (429).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from gateway.admission.decision import Decision
from gateway.admission.families import Ask
from gateway.backends.circuit import CircuitState
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket

TURNOVER_SAMPLES = 16
"""Recent releases per backend whose hold times are averaged."""


class SlotTurnover:
    """One backend's hold times: `taken` at each dispatch, `freed` at its release (exactly once each)."""

    def __init__(self) -> None:
        self._since: dict[int, float] = {}  # id(ticket) → when it took its slot
        self._held: deque[tuple[float, float]] = deque(maxlen=TURNOVER_SAMPLES)  # (freed at, held s)

    def taken(self, key: int, now: float) -> None:
        self._since[key] = now

    def freed(self, key: int, now: float) -> None:
        since = self._since.pop(key, None)
        if since is not None:
            self._held.append((now, now - since))

    def hold(self, now: float, max_age_s: float) -> float | None:
        """The mean seconds a slot was held by the releases of the last `max_age_s`; None without any."""
        recent = [held for at, held in self._held if at > now - max_age_s]
        if not recent:
            return None
        return sum(recent) / len(recent)

    def rate(self, occupied: int, now: float, max_age_s: float) -> float | None:
        """Slots per second `occupied` running requests free (Little's law); None when unmeasured."""
        hold = self.hold(now, max_age_s)
        if hold is None:
            return None
        return occupied / hold if hold > 0 else None


class Turnover:
    """Every backend's hold times, a `Tally` (families.py): what the queue predicts a slot's wait from."""

    def __init__(self) -> None:
        self._backends: dict[str, SlotTurnover] = {}

    def commit(self, ask: Ask, backend: BackendState, ctx: Decision) -> None:
        turnover = self._backends.get(backend.url)
        if turnover is None:  # not setdefault: that would build one on every dispatch
            turnover = self._backends[backend.url] = SlotTurnover()
        turnover.taken(id(ask.ticket), ctx.now)

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        self._backends[backend.url].freed(id(ticket), now)

    def rate(self, url: str, occupied: int, now: float, max_age_s: float) -> float | None:
        """`SlotTurnover.rate` of `url`; None before its first dispatch."""
        turnover = self._backends.get(url)
        return None if turnover is None else turnover.rate(occupied, now, max_age_s)


def capacity_lost(pool: str, backends: Sequence[BackendState]) -> str | None:
    """What pool `pool` has lost, in a refusal's words; None while every backend is healthy with its
    circuit closed (its whole capacity)."""
    down = sum(1 for b in backends if not b.healthy or b.circuit != CircuitState.CLOSED)
    if not down:
        return None
    return f"{down} of {len(backends)} backends of pool {pool} unavailable"
