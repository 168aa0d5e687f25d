"""A dispatched request's hold on a backend, and the waiter an `acquire` parks on until it gets one.

The lease knows nothing of the scheduler's accounting: it only guarantees that the release callback
(`PoolScheduler._release`, which gives back the budgets, reconciles fairness and feeds the limit) runs
exactly once, however many times the pipeline's error paths call `release`.

A loan's lease (an offline request on a lent interactive backend) is `revocable`: it can be taken back
when the lender's own requests wait for the slot. The scheduler calls `revoke()`; the pipeline, which
`arm`s the lease with the cancel of its upstream call while nothing has reached the client, abandons
that call (the engine aborts it) and queues the request again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.admission.queue import Entry
from gateway.backends.state import BackendState
from gateway.request.errors import ApiError
from gateway.request.ticket import Outcome, Ticket, Usage

DROP_OUTCOMES = frozenset({Outcome.OVERLOADED})
"""Outcomes the concurrency limit treats as drops: the backend answered 503 / queue full."""

OnRelease = Callable[["Lease", Usage | None, Outcome, float | None, float | None], None]


class Lease:
    """A dispatched request's hold on a backend's budgets; `release` gives them all back exactly once."""

    def __init__(
        self,
        entry: Entry,
        backend: BackendState,
        charged: float,
        loan: bool,
        on_release: OnRelease,
        engine_priority: int = 0,
        on_start: Callable[[Lease], None] | None = None,
    ) -> None:
        self.entry = entry
        self.backend = backend
        self.charged = charged
        self.loan = loan  # the backend belongs to the lending pool (PoolScheduler.borrow_from)
        self.engine_priority = engine_priority  # the request's `priority` field (standing.py)
        self.dispatched_at: float | None = None  # on the scheduler's clock
        self.released = False
        self.revoked = False
        self.revocable = loan  # the pipeline arms it
        self._on_release = on_release
        self._on_revoke: Callable[[], None] | None = None
        self._on_start = on_start

    @property
    def ticket(self) -> Ticket:
        return self.entry.ticket

    def arm(self, on_revoke: Callable[[], None]) -> None:
        """From now until `disarm`, `revoke` calls `on_revoke` (at once if it already came)."""
        self._on_revoke = on_revoke
        if self.revoked:
            on_revoke()

    def disarm(self) -> None:
        """The request can no longer be taken back (its answer is on its way to the client)."""
        self._on_revoke = None

    def started(self) -> None:
        """The backend sent the first byte of a stream: the request's prefill is done (once)."""
        on_start, self._on_start = self._on_start, None
        if on_start is not None and not self.released:
            on_start(self)

    def revoke(self) -> None:
        """Ask for the backend back; only an armed lease acts on it, the others end as they would."""
        if self.released or self.revoked:
            return
        self.revoked = True
        if self._on_revoke is not None:
            self._on_revoke()

    def release(
        self,
        usage: Usage | None = None,
        outcome: Outcome = Outcome.OK,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
    ) -> None:
        """Give back every budget (idempotent). `usage` None keeps the estimate as the fairness charge;
        `ttft_s` is measured from dispatch; OK feeds the limit, OVERLOADED counts as a drop."""
        if self.released:
            return
        self.released = True
        self._on_release(self, usage, outcome, ttft_s, tpot_s)


class Wake:
    """The event a queued `acquire` parks on: what anyio's `Event` is on asyncio (the gateway's only loop),
    without anyio's backend lookup on every construction. A wait on one already set still yields to the
    loop once, as anyio's does: whether the dispatched caller resumes before or after the tasks already
    ready is part of the order of dispatches."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        if self._event.is_set():
            await asyncio.sleep(0)
        else:
            await self._event.wait()


@dataclass(eq=False, slots=True)
class Waiter:
    """What a queued `acquire` waits on: set with a lease on dispatch, or with the refusal."""

    event: Wake = field(default_factory=Wake)
    lease: Lease | None = None
    error: ApiError | None = None
