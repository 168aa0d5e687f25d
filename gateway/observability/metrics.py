"""Every metric the gateway exports, in one scheme: `omnigate_…`, base units, `_total` counters.

Label values are bounded: pools, classes, buckets and tenants come from config/store, never free text.
Metrics live on a module-level registry so `/metrics` also serves prometheus-client's process metrics.
Counters and histograms are updated on the event loop only, without prometheus-client's locks
(loop_metrics.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from gateway.observability.loop_metrics import LoopCounter, LoopHistogram

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# estimated / actual tokens: 1.0 is exact, 2.0 a 2x over-estimate, 0.5 half the real count.
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.67, 0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0, 10.0)

REQUESTS = LoopCounter(
    "omnigate_requests_total",
    "Requests finished, by pool, class, tenant, bucket, priority and outcome.",
    ["pool", "traffic_class", "tenant", "bucket", "priority", "outcome"],
    registry=REGISTRY,
)
REJECTIONS = LoopCounter(
    "omnigate_rejections_total",
    "Requests refused by the gateway, by reason and class.",
    ["reason", "traffic_class"],
    registry=REGISTRY,
)
REQUEST_DURATION = LoopHistogram(
    "omnigate_request_duration_seconds",
    "End-to-end request time as the gateway sees it (arrival to last byte).",
    ["route", "status"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TTFT = LoopHistogram(
    "omnigate_ttft_seconds",
    "Gateway-measured time to first content token.",
    ["pool", "traffic_class"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TPOT = LoopHistogram(
    "omnigate_tpot_seconds",
    "Gateway-measured time per output token after the first: (E2E - TTFT) / (N - 1).",
    ["pool", "traffic_class"],
    buckets=TPOT_BUCKETS,
    registry=REGISTRY,
)
E2E = LoopHistogram(
    "omnigate_e2e_seconds",
    "Gateway-measured end-to-end latency of completed generations.",
    ["pool", "traffic_class"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
# a stream's real-time factor (gateway/speech/meter.py): below 1 ahead of playback, above 1 it stutters
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0)
TTFA = LoopHistogram(
    "omnigate_ttfa_seconds",
    "Gateway-measured time to first audio (arrival to the first audio chunk) of answers that speak.",
    ["pool", "traffic_class"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
RTF = LoopHistogram(
    "omnigate_speech_rtf",
    "Real-time factor of each speech stream: wall seconds from its first to its last audio chunk per audio "
    "second before the last (above 1: slower than real time, a player stutters).",
    ["pool", "traffic_class"],
    buckets=RTF_BUCKETS,
    registry=REGISTRY,
)
AUDIO_SECONDS = LoopCounter(
    "omnigate_audio_seconds_total",
    "Audio seconds delivered to clients, read from the WAV headers of the answers.",
    ["pool", "tenant"],
    registry=REGISTRY,
)
SPEECH_STALLS = LoopCounter(
    "omnigate_speech_stalls_total",
    "Audio chunks that arrived after the audio before them had finished playing (a player stuttered).",
    ["pool", "traffic_class"],
    registry=REGISTRY,
)
UPSTREAM_RETRIES = LoopCounter(
    "omnigate_upstream_retries_total",
    "Requests retried on another backend before the first byte.",
    ["pool"],
    registry=REGISTRY,
)
UPSTREAM_ERRORS = LoopCounter(
    "omnigate_upstream_errors_total",
    "Backend failures, by phase (connect, status, first_byte, mid_stream).",
    ["pool", "backend", "phase"],
    registry=REGISTRY,
)
BACKEND_OVERLOADS = LoopCounter(
    "omnigate_backend_overloads_total",
    "Backend overload answers (a full queue), by where they came: before_output (retried elsewhere, the "
    "limit shrinks) or mid_stream (inside a started 200: the request is lost, the limit shrinks).",
    ["pool", "backend", "phase"],
    registry=REGISTRY,
)
LOANS_REVOKED = LoopCounter(
    "omnigate_loans_revoked_total",
    "Requests on a lent backend given back because the lending pool's own requests waited; queued again.",
    ["pool"],
    registry=REGISTRY,
)
CLIENT_DISCONNECTS = LoopCounter(
    "omnigate_client_disconnects_total",
    "Requests whose client went away; the upstream request was cancelled.",
    ["pool"],
    registry=REGISTRY,
)
EDGE_REFUSALS = LoopCounter(
    "omnigate_edge_refusals_total",
    "Connections answered and closed at the edge, by reason (headers_too_large, header_timeout, "
    "too_many_connections, bad_request).",
    ["reason"],
    registry=REGISTRY,
)
POLICY_RELOADS = LoopCounter(
    "omnigate_policy_reloads_total",
    "Policy reload attempts by result (applied, unchanged, invalid).",
    ["result"],
    registry=REGISTRY,
)
BACKEND_UP = Gauge(
    "omnigate_backend_up",
    "1 if the backend passes health checks and its circuit is not open.",
    ["pool", "backend"],
    registry=REGISTRY,
)
BACKEND_ACTIVE = Gauge(
    "omnigate_backend_active_requests",
    "Requests the gateway has in flight on each backend.",
    ["pool", "backend"],
    registry=REGISTRY,
)

BACKEND_HEALTHY = Gauge(
    "omnigate_backend_healthy",
    "1 if the backend's last health checks passed (circuit state aside).",
    ["pool", "backend"],
    registry=REGISTRY,
)
BACKEND_CIRCUIT = Gauge(
    "omnigate_backend_circuit_state",
    "1 for the circuit breaker's current state (closed, open, half_open), 0 for the others.",
    ["pool", "backend", "state"],
    registry=REGISTRY,
)
CIRCUIT_TRANSITIONS = LoopCounter(
    "omnigate_circuit_transitions_total",
    "Circuit breaker transitions, by the state entered (open, half_open, closed).",
    ["pool", "backend", "state"],
    registry=REGISTRY,
)
BACKEND_CONCURRENCY_LIMIT = Gauge(
    "omnigate_backend_concurrency_limit",
    "Adaptive concurrency limit the dispatcher currently applies to each backend.",
    ["pool", "backend"],
    registry=REGISTRY,
)
BACKEND_PREFILL_TOKENS = Gauge(
    "omnigate_backend_inflight_prefill_tokens",
    "Prompt tokens dispatched to each backend whose prefill has not finished (no first token yet).",
    ["pool", "backend"],
    registry=REGISTRY,
)
BACKEND_PREFIX_INDEX_TOKENS = Gauge(
    "omnigate_backend_prefix_index_tokens",
    "Prompt tokens the backend's prefix index expects its cache to hold (gateway/backends/prefix_index.py).",
    ["pool", "backend"],
    registry=REGISTRY,
)
PREFIX_TOKENS = LoopCounter(
    "omnigate_prefix_tokens_total",
    "Prompt tokens of finished generations by kind: `prompt` (priced), `predicted_cached` (the prefix "
    "the index expected cached where the request went), `engine_cached` (what the engine reported cached, "
    "SGLang with --enable-cache-report). The hit rates are the cached kinds over `prompt`.",
    ["pool", "kind"],
    registry=REGISTRY,
)
BACKEND_KV_TOKENS = Gauge(
    "omnigate_backend_reserved_kv_tokens",
    "KV tokens the gateway has reserved on each backend for requests in flight (prompt + expected output).",
    ["pool", "backend"],
    registry=REGISTRY,
)
BACKEND_KV_USAGE = Gauge(
    "omnigate_backend_kv_usage_ratio",
    "KV cache fill (0-1) scraped from the backend's own metrics (sglang:token_usage).",
    ["pool", "backend"],
    registry=REGISTRY,
)
BACKEND_RUNNING = Gauge(
    "omnigate_backend_running_requests",
    "Requests the backend reports running (sglang:num_running_reqs), all clients included.",
    ["pool", "backend"],
    registry=REGISTRY,
)
BACKEND_QUEUED = Gauge(
    "omnigate_backend_queued_requests",
    "Requests waiting inside the backend (sglang:num_queue_reqs).",
    ["pool", "backend"],
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "omnigate_queue_depth",
    "Requests waiting in the gateway queue, per pool and priority level.",
    ["pool", "priority"],
    registry=REGISTRY,
)
QUEUE_OLDEST_WAIT = Gauge(
    "omnigate_queue_oldest_wait_seconds",
    "Age of the oldest waiting request, per pool and priority level (0 when empty).",
    ["pool", "priority"],
    registry=REGISTRY,
)
QUEUE_WAIT = LoopHistogram(
    "omnigate_queue_wait_seconds",
    "Time requests spent in the gateway queue before dispatch, per pool and priority level.",
    ["pool", "priority"],
    buckets=QUEUE_BUCKETS,
    registry=REGISTRY,
)
WINDOW = Gauge(
    "omnigate_batch_window_seconds",
    "How long an accumulating pool holds its queue before a round (0 for other pools).",
    ["pool"],
    registry=REGISTRY,
)
SLO_ATTAINMENT = Gauge(
    "omnigate_slo_attainment_ratio",
    "Fraction of requests in the rolling window that met every SLO of their class (errors count as misses).",
    ["traffic_class"],
    registry=REGISTRY,
)
SLO_P99 = Gauge(
    "omnigate_rolling_p99_seconds",
    "Gateway-side rolling P99 of TTFT or TPOT per class over the SLO window (what the alert rules read).",
    ["traffic_class", "objective"],
    registry=REGISTRY,
)
SLO_TARGET = Gauge(
    "omnigate_slo_target_seconds",
    "The policy's P99 objective per class (ttft, tpot): the line dashboards draw next to the P99.",
    ["traffic_class", "objective"],
    registry=REGISTRY,
)
ESTIMATION_ERROR = LoopHistogram(
    "omnigate_estimation_ratio",
    "Estimated / actual tokens per finished request (kind: prompt or output); 1 is exact, >1 over-estimates.",
    ["kind", "bucket"],
    buckets=RATIO_BUCKETS,
    registry=REGISTRY,
)
TENANT_TOKENS = LoopCounter(
    "omnigate_tenant_tokens_total",
    "Tokens charged to each tenant after reconciliation with actual usage (kind: prompt or completion).",
    ["tenant", "kind"],
    registry=REGISTRY,
)
REMOTE_MEDIA_UNFETCHED = LoopCounter(
    "omnigate_remote_media_unfetched_total",
    "Remote media URLs priced with the policy's default size because the gateway does not fetch them.",
    ["bucket"],
    registry=REGISTRY,
)
ALERTS_FIRING = Gauge(
    "omnigate_alerts_firing",
    "Gateway alert rules currently firing (one per rule and subject, summed by rule).",
    ["rule"],
    registry=REGISTRY,
)
ALERT_NOTIFICATIONS = LoopCounter(
    "omnigate_alert_notifications_total",
    "Alert notifications per sink by result (sent, failed after retries, dropped from a full queue).",
    ["sink", "result"],
    registry=REGISTRY,
)
