"""The last stage, once per request whatever its outcome: record how it ended (the one writer of the
ticket's outcome and error fields, from the `Ending` the pipeline hands over), settle the quota reservation
with what the engine did (gateway/tenants/charge.py) and the audio it delivered (read from the WAV
headers), then measure. The two never depend on each other: a reconcile that fails still leaves the
request measured, logged and alerted on. Never raises: a failure here is logged, never shown to the
client."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace

from gateway.request.ticket import Ending, Outcome, Ticket
from gateway.stages.measure import Measure
from gateway.tenants.charge import billable, charged_prompt
from gateway.tenants.service import Reservation, TenantService

log = logging.getLogger("omnigate")


class Finish:
    def __init__(
        self, tenants: TenantService, measure: Measure, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tenants = tenants
        self.measure = measure
        self.clock = clock

    async def __call__(
        self,
        ticket: Ticket,
        ending: Ending,
        reservation: Reservation | None,
        status: int,
        error: str | None,
    ) -> None:
        """`ending` PENDING: answered (OK). `error`: the message alerts and the log carry."""
        if ticket.finished_at is None:  # never relayed: it ends now
            ticket.finished_at = self.clock()
        ticket.ending = replace(ending, outcome=Outcome.OK) if ending.outcome == Outcome.PENDING else ending
        usage = billable(ticket)
        if reservation is not None:
            # No cancel scope of its own: the pipeline calls this after the request's only cancel scope has
            # ended, and an anyio shield would not stop the server cancelling the task anyway.
            try:
                await self.tenants.reconcile(
                    reservation,
                    charged_prompt(usage, self.tenants.defaults.cached_input_share),
                    usage.completion_tokens,
                    audio_seconds=ticket.audio_seconds,
                )
            except Exception:
                log.exception("reconciling request %s failed", ticket.id)
        try:
            self.measure(ticket, status, error)
        except Exception:
            log.exception("measuring request %s failed", ticket.id)
