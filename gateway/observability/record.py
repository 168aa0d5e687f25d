"""Feed the metrics from plain data: one place that knows each metric's labels and units.

The app calls these at the points the request's way already passes (dispatch, finish, reject) and from
its periodic loop (queue and backend gauges); none of them blocks or raises on odd values.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from gateway.backends.circuit import Transition
from gateway.backends.state import BackendState
from gateway.observability import metrics as m
from gateway.observability.rolling import ClassStats
from gateway.request.errors import RejectionReason
from gateway.request.ticket import Outcome, Ticket

CIRCUIT_STATES = ("closed", "open", "half_open")

# Every finished request asks for the same few children: prometheus-client's `labels()` checks, converts and
# locks on each call, so the request path looks each child up once (label values are bounded: decision 0600).
_requests = functools.cache(m.REQUESTS.labels)
_queue_wait = functools.cache(m.QUEUE_WAIT.labels)
_ttft = functools.cache(m.TTFT.labels)
_tpot = functools.cache(m.TPOT.labels)
_e2e = functools.cache(m.E2E.labels)
_ttfa = functools.cache(m.TTFA.labels)
_audio_seconds = functools.cache(m.AUDIO_SECONDS.labels)
_rtf = functools.cache(m.RTF.labels)
_stalls = functools.cache(m.SPEECH_STALLS.labels)
_tenant_tokens = functools.cache(m.TENANT_TOKENS.labels)
_estimation_ratio = functools.cache(m.ESTIMATION_ERROR.labels)
_prefix_tokens = functools.cache(m.PREFIX_TOKENS.labels)


@dataclass(frozen=True, slots=True)
class Latencies:
    """Gateway-measured latencies of one request, in seconds; None when the request never got there.

    TTFT counts from arrival (queue time included: what the client waits), TPOT is
    (finish - first token) / (completion tokens - 1) as vLLM/SGLang benchmarks define it, E2E is arrival
    to last byte.
    """

    ttft: float | None
    tpot: float | None
    e2e: float | None


def latencies(t: Ticket) -> Latencies:
    ttft = t.first_token_at - t.arrival if t.first_token_at is not None else None
    e2e = t.finished_at - t.arrival if t.finished_at is not None else None
    tpot = None
    tokens = t.usage.completion_tokens if t.usage is not None else 0
    if t.stream and t.first_token_at is not None and t.finished_at is not None and tokens > 1:
        tpot = (t.finished_at - t.first_token_at) / (tokens - 1)  # a whole answer has no token gaps
    return Latencies(ttft, tpot, e2e)


def record_priced(t: Ticket) -> None:
    """The estimate stage priced the ticket: remote media it priced from hints, whatever happens next."""
    if t.cost.remote_media:
        m.REMOTE_MEDIA_UNFETCHED.labels(t.bucket).inc(t.cost.remote_media)


def record_dispatch(t: Ticket) -> None:
    """A ticket left the queue for a backend: its queue wait."""
    _queue_wait(t.pool, t.band).observe(t.queue_seconds)


def record_finished(t: Ticket) -> Latencies:
    """A request the gateway answered (any outcome but a rejection): counts, latencies, tokens, estimates."""
    _requests(t.pool, t.traffic_class, t.tenant, t.bucket, t.band, t.outcome).inc()
    lat = latencies(t)
    labels = (t.pool, t.traffic_class)
    if lat.ttft is not None:
        _ttft(*labels).observe(lat.ttft)
    if lat.tpot is not None:
        _tpot(*labels).observe(lat.tpot)
    if lat.e2e is not None and t.outcome == Outcome.OK:
        _e2e(*labels).observe(lat.e2e)
    if t.first_audio_at is not None:
        _ttfa(*labels).observe(t.first_audio_at - t.arrival)
        _audio_seconds(t.pool, t.tenant).inc(t.audio_seconds)
    if t.rtf is not None and t.outcome == Outcome.OK:
        _rtf(*labels).observe(t.rtf)
    if t.audio_stalls:
        _stalls(*labels).inc(t.audio_stalls)
    if t.prefix is not None and t.backend is not None:
        _prefix_tokens(t.pool, "prompt").inc(t.cost.prompt_tokens)
        _prefix_tokens(t.pool, "predicted_cached").inc(t.cost.cached_tokens)
        if t.usage is not None and t.usage.cached_tokens is not None:
            _prefix_tokens(t.pool, "engine_cached").inc(t.usage.cached_tokens)
    if t.usage is not None:
        _tenant_tokens(t.tenant, "prompt").inc(t.usage.prompt_tokens)
        _tenant_tokens(t.tenant, "completion").inc(t.usage.completion_tokens)
        if t.outcome == Outcome.OK:
            _estimation(t)
    return lat


def _estimation(t: Ticket) -> None:
    """Ratio estimated/actual; only for completed requests (a cut stream's output count says nothing)."""
    assert t.usage is not None
    if t.usage.prompt_tokens > 0:
        _estimation_ratio("prompt", t.bucket).observe(t.cost.prompt_tokens / t.usage.prompt_tokens)
    if t.usage.completion_tokens > 0:
        ratio = t.cost.expected_output_tokens / t.usage.completion_tokens
        _estimation_ratio("output", t.bucket).observe(ratio)


def record_rejection(t: Ticket, reason: RejectionReason) -> None:
    """A request the gateway refused, counted by its reason (gateway/request/errors.py:
    `rejection_reason`)."""
    m.REJECTIONS.labels(reason, t.traffic_class).inc()
    _requests(t.pool, t.traffic_class, t.tenant, t.bucket, t.band, Outcome.REJECTED).inc()


def record_queue(pool: str, band: str, depth: int, oldest_wait_s: float) -> None:
    m.QUEUE_DEPTH.labels(pool, band).set(depth)
    m.QUEUE_OLDEST_WAIT.labels(pool, band).set(oldest_wait_s)


def record_window(pool: str, window_s: float) -> None:
    m.WINDOW.labels(pool).set(window_s)


def record_backends(states: Iterable[BackendState]) -> None:
    """Gateway accounting and last scrape of each backend; scraped gauges stay unset until a scrape."""
    for b in states:
        labels = (b.pool, b.name)
        m.BACKEND_UP.labels(*labels).set(1 if b.up else 0)
        m.BACKEND_HEALTHY.labels(*labels).set(1 if b.healthy else 0)
        for state in CIRCUIT_STATES:
            m.BACKEND_CIRCUIT.labels(*labels, state).set(1 if b.circuit == state else 0)
        m.BACKEND_CONCURRENCY_LIMIT.labels(*labels).set(b.concurrency_limit)
        m.BACKEND_ACTIVE.labels(*labels).set(b.active)
        m.BACKEND_PREFILL_TOKENS.labels(*labels).set(b.outstanding_tokens)
        m.BACKEND_KV_TOKENS.labels(*labels).set(b.reserved_kv_tokens)
        m.BACKEND_PREFIX_INDEX_TOKENS.labels(*labels).set(b.prefix.tokens)
        if b.token_usage is not None:
            m.BACKEND_KV_USAGE.labels(*labels).set(b.token_usage)
        if b.running_reqs is not None:
            m.BACKEND_RUNNING.labels(*labels).set(b.running_reqs)
        if b.queue_reqs is not None:
            m.BACKEND_QUEUED.labels(*labels).set(b.queue_reqs)


def record_circuit(t: Transition) -> None:
    m.CIRCUIT_TRANSITIONS.labels(t.pool, t.backend, t.new).inc()


def record_slo(stats: Iterable[ClassStats], targets: dict[str, tuple[float | None, float | None]]) -> None:
    """Rolling attainment/P99 gauges and the SLO target lines; `targets` maps class -> (ttft, tpot)."""
    for s in stats:
        if s.attainment is not None:
            m.SLO_ATTAINMENT.labels(s.traffic_class).set(s.attainment)
        if s.ttft_p99 is not None:
            m.SLO_P99.labels(s.traffic_class, "ttft").set(s.ttft_p99)
        if s.tpot_p99 is not None:
            m.SLO_P99.labels(s.traffic_class, "tpot").set(s.tpot_p99)
    for traffic_class, (ttft, tpot) in targets.items():
        for objective, value in (("ttft", ttft), ("tpot", tpot)):
            if value is not None:
                m.SLO_TARGET.labels(traffic_class, objective).set(value)
