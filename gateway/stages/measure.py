"""What every finished request is measured by, whatever its outcome: the metrics (a refusal by its
rejection reason), the rolling SLO tracker, the output learner, failure alerts and the access log."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.estimate.estimator import Estimator
from gateway.livepolicy.reloader import PolicyHolder
from gateway.observability import metrics, record
from gateway.observability.accesslog import AccessLog
from gateway.observability.failures import FailureEvent
from gateway.observability.manager import AlertManager
from gateway.observability.rolling import SloTracker
from gateway.request.errors import CAPACITY_REJECTIONS, rejection_reason
from gateway.request.ticket import FAILED_OUTCOMES, Outcome, Ticket


class Measure:
    def __init__(
        self,
        policy: PolicyHolder,
        slo: SloTracker,
        alerts: AlertManager,
        access: AccessLog | None,
        estimator: Callable[[], Estimator],
        kv_usage: Callable[[str | None], float | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.slo = slo
        self.alerts = alerts
        self.access = access
        self.estimator = estimator  # the live one: a policy reload replaces it
        self.kv_usage = kv_usage  # backend name → its scraped KV use, for failure alerts
        self.clock = clock
        self.answered = 0  # every request answered, refusals included (the rejection-rate alert)
        self.rejected = 0

    def __call__(self, ticket: Ticket, status: int, error: str | None) -> None:
        self.answered += 1
        slo = self.policy.current.queue.classes.get(ticket.traffic_class)
        ttft_slo = slo.ttft_p99_s if slo else None
        tpot_slo = slo.tpot_p99_s if slo else None
        if ticket.outcome in (Outcome.REJECTED, Outcome.CLIENT_ERROR):
            reason = rejection_reason(status, ticket.error_code)
            record.record_rejection(ticket, reason)
            self.rejected += 1
            if reason in CAPACITY_REJECTIONS:
                self.slo.observe(
                    ticket.traffic_class,
                    self.clock(),
                    ttft=None,
                    tpot=None,
                    ttft_slo=ttft_slo,
                    tpot_slo=tpot_slo,
                    failed=True,
                )
        else:
            lat = record.record_finished(ticket)
            if ticket.outcome != Outcome.CANCELLED:
                self.slo.observe(
                    ticket.traffic_class,
                    self.clock(),
                    ttft=lat.ttft,
                    tpot=lat.tpot,
                    ttft_slo=ttft_slo,
                    tpot_slo=tpot_slo,
                    failed=ticket.outcome in FAILED_OUTCOMES,
                )
            self._learn(ticket)
        if ticket.outcome == Outcome.CANCELLED and ticket.pool:
            metrics.CLIENT_DISCONNECTS.labels(ticket.pool).inc()
        if ticket.outcome in FAILED_OUTCOMES:
            event = FailureEvent.from_ticket(
                ticket, ticket.error_status or status, error or ticket.outcome, self.kv_usage(ticket.backend)
            )
            self.alerts.notify_failure(event)
        if self.access is not None:
            self.access.log(ticket, status)

    def _learn(self, ticket: Ticket) -> None:
        """Feed the output learner from generations only (an embedding's cost has no output part; a speech
        request's output is its input read back), and the speech learner from every whole spoken answer."""
        usage = ticket.usage
        if ticket.outcome != Outcome.OK or usage is None or not ticket.cost.max_output_tokens:
            return
        estimator = self.estimator()
        if ticket.endpoint != "speech":
            estimator.observe(ticket.tenant, ticket.bucket, usage.completion_tokens)
        if ticket.voice is not None:
            estimator.observe_speech(
                ticket.tenant, ticket.voice, usage.completion_tokens, ticket.audio_seconds
            )
