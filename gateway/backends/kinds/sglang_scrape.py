"""Read the load signals the dispatcher needs from an SGLang backend's /v1/loads, /metrics and /server_info.

`/v1/loads` (SGLang 0.5.10 and later; 0.5.23 answers it without `--enable-metrics`) gives per data-parallel
rank the running and waiting requests, the KV tokens in use and the pool and running caps in one JSON
document; servers without it (404) are read from their `sglang:*` gauges instead.

Data-parallel ranks: SGLang reports each DP rank's scheduler separately (`dp_rank` label on the gauges,
one `internal_states` entry per rank in /server_info), and with `enable_metrics_for_all_schedulers` every
tensor-parallel rank of a DP rank repeats its scheduler's gauges. The gauges are combined by what they mean
(docs/decisions/0201-sglang-server-info-and-dp-ranks.md): the repeats of one rank are one value (the
largest), counts (tokens in use, KV capacity, running and queued requests) sum over the ranks, and the KV
ratio `sglang:token_usage` is the fullest rank's — a rank retracts requests when its own pool fills,
whatever its neighbours hold, and SGLang's default round-robin balancing sends the next request to the next
rank regardless of how full it is.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.backends.state import BackendState

_COUNTS = {
    "sglang:num_used_tokens": "used_tokens",
    "sglang:max_total_num_tokens": "max_total_tokens",
    "sglang:num_running_reqs": "running_reqs",
    "sglang:num_queue_reqs": "queue_reqs",
}
_RATIOS = {"sglang:token_usage": "token_usage"}
# SGLang 0.5.10+ splits the pool three ways: held by requests, free, and cached by the radix tree but
# reclaimable; `kv_used_tokens` is `num_used_tokens` by another name, and the three add up to the pool.
_KV_PARTS = {
    "sglang:kv_used_tokens": "used",
    "sglang:kv_available_tokens": "available",
    "sglang:kv_evictable_tokens": "evictable",
}
INFO_ROUTES = ("/server_info", "/get_server_info")
"""SGLang 0.5.9's route first; `/get_server_info` (deprecated there: a warning logged per call) for older
servers, asked only when the new one is not found."""


def _whole_scheduler(labels: dict[str, str]) -> bool:
    """With `--enable-priority-scheduling` the request gauges carry a `priority` label: one series per
    priority in use plus `priority=""` for the whole scheduler, the only one that is not a part of it."""
    return labels.get("priority", "") == ""


def apply_metrics_text(state: BackendState, text: str) -> None:
    """Store each gauge on the state, combined over the backend's data-parallel ranks."""
    ranks: dict[str, dict[str, float]] = {}  # field → dp rank → value
    for family in text_string_to_metric_families(text):
        field = _COUNTS.get(family.name) or _RATIOS.get(family.name) or _KV_PARTS.get(family.name)
        if field is None:
            continue
        values = ranks.setdefault(field, {})
        for sample in family.samples:
            if sample.name == family.name and math.isfinite(sample.value) and _whole_scheduler(sample.labels):
                rank = sample.labels.get("dp_rank", "")
                values[rank] = max(values.get(rank, sample.value), sample.value)
    totals = {field: sum(values.values()) for field, values in ranks.items() if values}
    if "used" in totals:
        totals.setdefault("used_tokens", totals["used"])
    if "max_total_tokens" not in totals and {"used", "available", "evictable"} <= totals.keys():
        totals["max_total_tokens"] = totals["used"] + totals["available"] + totals["evictable"]
    for field, total in totals.items():
        if field == "token_usage":
            state.token_usage = max(ranks[field].values())
        elif field in _COUNTS.values():
            setattr(state, field, int(total))


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


_LOADS_COUNTS = {
    "num_running_reqs": "running_reqs",
    "num_waiting_reqs": "queue_reqs",
    "num_used_tokens": "used_tokens",
    "max_total_num_tokens": "max_total_tokens",
    "max_running_requests": "max_running_requests",
}


def apply_loads(state: BackendState, body: Any) -> bool:
    """Store `/v1/loads`: counts and caps summed over the data-parallel ranks, the fullest rank's KV
    ratio. False (nothing stored) unless every rank reports every count as a non-negative integer."""
    ranks = body.get("loads") if isinstance(body, dict) else None
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, dict) for r in ranks):
        return False
    totals: dict[str, int] = {}
    for key, field in _LOADS_COUNTS.items():
        values = [_count(r.get(key)) for r in ranks]
        if any(v is None for v in values):
            return False
        totals[field] = sum(v for v in values if v is not None)
    if totals["max_total_tokens"] == 0 or totals["max_running_requests"] == 0:
        return False
    for field, total in totals.items():
        setattr(state, field, total)
    usage = [r.get("token_usage") for r in ranks]
    if all(isinstance(u, int | float) and math.isfinite(u) for u in usage):
        state.token_usage = float(max(usage))
    return True


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _total(values: Iterable[Any]) -> int | None:
    """The sum over the ranks, or None unless every rank reported a positive integer."""
    found = [_positive_int(v) for v in values]
    if not found or any(v is None for v in found):
        return None
    return sum(v for v in found if v is not None)


def apply_server_info(state: BackendState, info: Any) -> None:
    """The KV pool and the running cap of the whole backend: per DP rank from `internal_states`
    (`memory_usage.token_capacity`, `effective_max_running_requests_per_dp`), summed; a server without
    them gives its first rank's `max_total_num_tokens` (times `dp_size`) and the `max_running_requests`
    it was started with (the whole server's)."""
    if not isinstance(info, dict):
        return
    ranks = [r for r in info.get("internal_states") or () if isinstance(r, dict)]
    memory = [r.get("memory_usage") for r in ranks]
    capacity = _total(m.get("token_capacity") if isinstance(m, dict) else None for m in memory)
    if capacity is None:
        per_rank = _positive_int(info.get("max_total_num_tokens"))
        capacity = per_rank * (_positive_int(info.get("dp_size")) or 1) if per_rank else None
    running = _total(r.get("effective_max_running_requests_per_dp") for r in ranks)
    if running is None:
        running = _positive_int(info.get("max_running_requests"))
    if capacity is not None:
        state.max_total_tokens = capacity
    if running is not None:
        state.max_running_requests = running
