"""Read the load signals the dispatcher needs from an SGLang backend's /metrics and /get_server_info."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gateway.backends.state import BackendState

_GAUGES = {
    "sglang:token_usage": "token_usage",
    "sglang:num_used_tokens": "used_tokens",
    "sglang:max_total_num_tokens": "max_total_tokens",
    "sglang:num_running_reqs": "running_reqs",
    "sglang:num_queue_reqs": "queue_reqs",
}
_INT_FIELDS = {"used_tokens", "max_total_tokens", "running_reqs", "queue_reqs"}


def apply_metrics_text(state: BackendState, text: str) -> None:
    """Sum each gauge over its samples (several tp ranks / models) and store it on the state."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        field = _GAUGES.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            if sample.name == family.name:
                totals[field] = totals.get(field, 0.0) + sample.value
    for field, value in totals.items():
        setattr(state, field, int(value) if field in _INT_FIELDS else float(value))


def apply_server_info(state: BackendState, info: Any) -> None:
    if not isinstance(info, dict):
        return
    total = info.get("max_total_num_tokens")
    if isinstance(total, int) and total > 0:
        state.max_total_tokens = total
    running = info.get("max_running_requests")
    if isinstance(running, int) and running > 0:
        state.max_running_requests = running
