"""Metrics of the tenants room, on the gateway's shared registry. Labels never carry keys or tenant text."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from gateway.observability.metrics import REGISTRY

STORE_UP = Gauge(
    "omnigate_tenant_store_up",
    "1 while the tenant/quota store answers, 0 after a failed call until one succeeds.",
    registry=REGISTRY,
)
STORE_ERRORS = Counter(
    "omnigate_tenant_store_errors_total",
    "Calls to the tenant/quota store that failed because it was unreachable, by operation.",
    ["operation"],
    registry=REGISTRY,
)
FAIL_OPEN_ADMISSIONS = Counter(
    "omnigate_quota_fail_open_admissions_total",
    "Requests admitted under local in-memory limits because the shared store was down (fail-open).",
    registry=REGISTRY,
)
QUOTA_DENIALS = Counter(
    "omnigate_quota_denials_total",
    "Reservations refused, by the limit that refused them.",
    ["limit"],
    registry=REGISTRY,
)
AUTH_FAILURES = Counter(
    "omnigate_auth_failures_total",
    "Tenant authentication failures, by reason (missing, invalid).",
    ["reason"],
    registry=REGISTRY,
)
STORE_UP.set(1)
