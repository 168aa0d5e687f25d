"""Every metric the gateway exports, in one scheme: `omnigate_…`, base units, `_total` counters.

Label values are bounded: pools, classes, buckets and tenants come from config/store, never free text.
Metrics live on a module-level registry so `/metrics` also serves prometheus-client's process metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)

REQUESTS = Counter(
    "omnigate_requests_total",
    "Requests finished, by pool, class, tenant, bucket, priority and outcome.",
    ["pool", "traffic_class", "tenant", "bucket", "priority", "outcome"],
    registry=REGISTRY,
)
REJECTIONS = Counter(
    "omnigate_rejections_total",
    "Requests refused by the gateway, by reason and class.",
    ["reason", "traffic_class"],
    registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "omnigate_request_duration_seconds",
    "End-to-end request time as the gateway sees it (arrival to last byte).",
    ["route", "status"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TTFT = Histogram(
    "omnigate_ttft_seconds",
    "Gateway-measured time to first content token.",
    ["pool", "traffic_class"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TPOT = Histogram(
    "omnigate_tpot_seconds",
    "Gateway-measured time per output token after the first: (E2E - TTFT) / (N - 1).",
    ["pool", "traffic_class"],
    buckets=TPOT_BUCKETS,
    registry=REGISTRY,
)
E2E = Histogram(
    "omnigate_e2e_seconds",
    "Gateway-measured end-to-end latency of completed generations.",
    ["pool", "traffic_class"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
UPSTREAM_RETRIES = Counter(
    "omnigate_upstream_retries_total",
    "Requests retried on another backend before the first byte.",
    ["pool"],
    registry=REGISTRY,
)
UPSTREAM_ERRORS = Counter(
    "omnigate_upstream_errors_total",
    "Backend failures, by phase (connect, status, first_byte, mid_stream).",
    ["pool", "backend", "phase"],
    registry=REGISTRY,
)
CLIENT_DISCONNECTS = Counter(
    "omnigate_client_disconnects_total",
    "Requests whose client went away; the upstream request was cancelled.",
    ["pool"],
    registry=REGISTRY,
)
POLICY_RELOADS = Counter(
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
