"""Structured access log: one JSON line per request, enough to say why it waited, where it ran, what it cost.

Never logged: prompt or completion text, API keys, headers, credentials in URLs. Sampling applies only to
successful requests; every rejection and failure is logged, since those are the lines ops come looking for.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from gateway.observability.record import latencies
from gateway.request.ticket import Outcome, Ticket

_log = logging.getLogger("omnigate.access")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _safe_url(url: str | None) -> str | None:
    if url is None:
        return None
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def access_record(t: Ticket, status: int, now: float, wall: float) -> dict[str, Any]:
    """The log fields of one request; `now` (monotonic) ends the duration of a ticket not yet finished."""
    lat = latencies(t)
    end = t.finished_at if t.finished_at is not None else now
    return {
        "ts": round(wall, 3),
        "request_id": t.id,
        "job_id": t.job_id,
        "tenant": t.tenant,
        "model": t.model,
        "class": t.traffic_class,
        "pool": t.pool,
        "bucket": t.bucket,
        "priority": t.priority,
        "backend": _safe_url(t.backend),
        "stream": t.stream,
        "status": status,
        "outcome": t.outcome,
        "error_code": t.error_code,
        "queue_ms": _ms(t.queue_seconds) if t.dispatched_at is not None else None,
        "ttft_ms": _ms(lat.ttft),
        "tpot_ms": _ms(lat.tpot),
        "duration_ms": _ms(end - t.arrival),
        "prompt_tokens_est": t.cost.prompt_tokens,
        "prompt_tokens": t.usage.prompt_tokens if t.usage else None,
        "output_tokens_est": t.cost.expected_output_tokens,
        "output_tokens": t.usage.completion_tokens if t.usage else None,
        "images": t.cost.images,
        "audios": t.cost.audios,
        "remote_media": t.cost.remote_media,
    }


class AccessLog:
    def __init__(
        self,
        sample_rate: float = 1.0,
        *,
        write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        rand: Callable[[], float] = random.random,
    ) -> None:
        """`write` receives each JSON line; by default it goes to the `omnigate.access` logger at INFO."""
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"access log sample rate must be within 0..1, got {sample_rate}")
        self.sample_rate = sample_rate
        self._write = write or _log.info
        self._clock = clock
        self._wall = wall
        self._rand = rand

    def log(self, t: Ticket, status: int) -> bool:
        """Write the request's line unless sampled out; returns whether it was written."""
        success = t.outcome == Outcome.OK and status < 400
        if success and self.sample_rate < 1.0 and self._rand() >= self.sample_rate:
            return False
        record = access_record(t, status, self._clock(), self._wall())
        self._write(orjson.dumps(record).decode())
        return True
