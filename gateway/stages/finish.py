"""The last stage, once per request whatever its outcome: settle the quota reservation with what the
backend reported, then measure. Never raises: a failure here is logged, never shown to the client."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio

from gateway.stages.measure import Measure
from gateway.tenants.service import Reservation, TenantService
from gateway.ticket import Outcome, Ticket

log = logging.getLogger("omnigate")


class Finish:
    def __init__(
        self, tenants: TenantService, measure: Measure, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tenants = tenants
        self.measure = measure
        self.clock = clock

    async def __call__(
        self, ticket: Ticket, reservation: Reservation | None, status: int, error: str | None
    ) -> None:
        if ticket.finished_at is None:
            ticket.finished_at = self.clock()
        if ticket.outcome == Outcome.PENDING:
            ticket.outcome = Outcome.OK
        usage = ticket.usage
        try:
            if reservation is not None:
                with anyio.CancelScope(shield=True):
                    await self.tenants.reconcile(
                        reservation,
                        usage.prompt_tokens if usage else 0,
                        usage.completion_tokens if usage else 0,
                    )
            self.measure(ticket, status, error)
        except Exception:
            log.exception("finishing request %s failed", ticket.id)
