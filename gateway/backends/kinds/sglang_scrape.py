"""Read the load signals the dispatcher needs from an SGLang backend's /metrics and /server_info.

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
INFO_ROUTES = ("/server_info", "/get_server_info")
"""SGLang 0.5.9's route first; `/get_server_info` (deprecated there: a warning logged per call) for older
servers, asked only when the new one is not found."""


def apply_metrics_text(state: BackendState, text: str) -> None:
    """Store each gauge on the state, combined over the backend's data-parallel ranks."""
    ranks: dict[str, dict[str, float]] = {}  # field → dp rank → value
    for family in text_string_to_metric_families(text):
        field = _COUNTS.get(family.name) or _RATIOS.get(family.name)
        if field is None:
            continue
        values = ranks.setdefault(field, {})
        for sample in family.samples:
            if sample.name == family.name and math.isfinite(sample.value):
                rank = sample.labels.get("dp_rank", "")
                values[rank] = max(values.get(rank, sample.value), sample.value)
    for field, values in ranks.items():
        if not values:
            continue
        if field == "token_usage":
            state.token_usage = max(values.values())
        else:
            setattr(state, field, int(sum(values.values())))


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
