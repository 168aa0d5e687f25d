"""Failure alerts: a failed request or batch job is reported at once, a storm of them as one summary.

Per failure window the first `failure_burst` failures are sent immediately, each with what ops need to
act (ids, tenant, pool, backend, status, error, the backend's KV watermark at that moment). A batch job
(requests sharing an `x-omnigate-job` id) alerts once per window however many of its requests fail. The
rest are counted and, when the window closes, sent as one "N more failures in the last W s" summary with
a breakdown. Pure: the caller passes `now` (monotonic) and `wall` (display time).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gateway.observability.notification import Notification
from gateway.observability.settings import AlertThresholds
from gateway.request.ticket import Ticket

_ERROR_CHARS = 300
_BREAKDOWN_LINES = 5


@dataclass(frozen=True, slots=True)
class FailureEvent:
    request_id: str
    tenant: str
    pool: str
    backend: str | None
    status: int
    error: str
    kv_usage: float | None  # the backend's scraped KV fill (0-1) when it failed
    job_id: str | None = None
    traffic_class: str = ""
    model: str = ""

    @classmethod
    def from_ticket(cls, t: Ticket, status: int, error: str, kv_usage: float | None) -> FailureEvent:
        return cls(
            t.id, t.tenant, t.pool, t.backend, status, error, kv_usage, t.job_id, t.traffic_class, t.model
        )

    @property
    def summary(self) -> str:
        """The error on one line, bounded: webhook bodies must stay small and never carry prompts."""
        one_line = " ".join(self.error.split())
        return one_line if len(one_line) <= _ERROR_CHARS else one_line[: _ERROR_CHARS - 1] + "…"


@dataclass(slots=True)
class _Window:
    start: float
    sent: int = 0
    jobs_alerted: set[str] = field(default_factory=set)
    suppressed: int = 0
    by_subject: Counter[str] = field(default_factory=Counter)
    jobs: Counter[str] = field(default_factory=Counter)


class FailureThrottle:
    def __init__(self) -> None:
        self._window: _Window | None = None

    def offer(self, event: FailureEvent, t: AlertThresholds, now: float, wall: float) -> list[Notification]:
        """Messages to send for this failure: itself, possibly preceded by the previous window's summary."""
        out = self.flush(t, now, wall)
        if not t.failure_alerts:
            return out
        if self._window is None:
            self._window = _Window(start=now)
        w = self._window
        repeat_job = event.job_id is not None and event.job_id in w.jobs_alerted
        if repeat_job or w.sent >= t.failure_burst:
            w.suppressed += 1
            w.by_subject[f"pool={event.pool} backend={event.backend or '-'} status={event.status}"] += 1
            if event.job_id is not None:
                w.jobs[event.job_id] += 1
            return out
        w.sent += 1
        if event.job_id is not None:
            w.jobs_alerted.add(event.job_id)
        out.append(_failure_message(event, wall))
        return out

    def flush(self, t: AlertThresholds, now: float, wall: float) -> list[Notification]:
        """Close the window once it has run its length; a summary if anything was held back."""
        w = self._window
        if w is None or now - w.start < t.failure_window_s:
            return []
        self._window = None
        if w.suppressed == 0:
            return []
        lines = [f"{n} × {subject}" for subject, n in w.by_subject.most_common(_BREAKDOWN_LINES)]
        if w.jobs:
            jobs = ", ".join(f"{job} ({n})" for job, n in w.jobs.most_common(_BREAKDOWN_LINES))
            more = len(w.jobs) - _BREAKDOWN_LINES
            lines.append(f"jobs: {jobs}" + (f" and {more} more" if more > 0 else ""))
        return [
            Notification(
                kind="failure_summary",
                title=f"{w.suppressed} more failures in the last {round(now - w.start)} s",
                severity="critical",
                fields=(("failures", w.suppressed), ("sent individually", w.sent)),
                lines=tuple(lines),
                at=wall,
            )
        ]


def _failure_message(e: FailureEvent, wall: float) -> Notification:
    subject = f"Batch job {e.job_id}" if e.job_id else f"Request {e.request_id}"
    return Notification(
        kind="failure",
        title=f"{subject} failed ({e.status})",
        severity="critical",
        fields=(
            ("job", e.job_id),
            ("request", e.request_id),
            ("tenant", e.tenant),
            ("class", e.traffic_class or None),
            ("model", e.model or None),
            ("pool", e.pool),
            ("backend", e.backend),
            ("status", e.status),
            ("error", e.summary),
            ("backend KV usage", e.kv_usage),
        ),
        key=e.job_id or e.request_id,
        at=wall,
    )
