"""Metrics of the tenants room, on the gateway's shared registry. Labels never carry keys or tenant text."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from gateway.observability.metrics import REGISTRY

STORE_UP = Gauge(
    "omnigate_tenant_store_up",
    "1 while the tenant/quota store is usable, 0 while it is unreachable or refuses calls.",
    registry=REGISTRY,
)
STORE_SLOW = Gauge(
    "omnigate_tenant_store_slow",
    "1 while the tenant/quota store is slow: a request-path call missed its deadline (store.deadline_s) "
    "and no probe has answered within it since; the failure mode applies meanwhile.",
    registry=REGISTRY,
)
STORE_DEADLINE_MISSES = Counter(
    "omnigate_tenant_store_deadline_misses_total",
    "Request-path calls to the tenant/quota store given up on at their deadline, by operation (lookup, "
    "reserve, levels, settle).",
    ["operation"],
    registry=REGISTRY,
)
STORE_RESEEDS = Counter(
    "omnigate_tenant_store_reseeds_total",
    "Times the store was found to have forgotten its data (a Redis restarted without persistence) and "
    "the configured tenants and keys were seeded again.",
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
USAGE_INFERRED = Counter(
    "omnigate_usage_inferred_total",
    "Requests charged without the engine's usage (priced prompt + counted or predicted answer), by reason "
    "(client_left, stream_cut, no_usage); left_queued: charged nothing, the engine never reached its "
    "prefill.",
    ["reason"],
    registry=REGISTRY,
)
OUTBOX_PENDING = Gauge(
    "omnigate_ledger_outbox_pending",
    "Charges waiting in the ledger outbox for the store to take them (failed reconciles, fail-open usage).",
    registry=REGISTRY,
)
OUTBOX_EVENTS = Counter(
    "omnigate_ledger_outbox_total",
    "Ledger outbox events: queued (a charge the store could not take), applied (taken on a retry), "
    "file_error (the outbox file could not be written; the entry is kept in memory).",
    ["event"],
    registry=REGISTRY,
)
AUTH_FAILURES = Counter(
    "omnigate_auth_failures_total",
    "Tenant authentication failures, by reason (missing, invalid).",
    ["reason"],
    registry=REGISTRY,
)
STORE_UP.set(1)
