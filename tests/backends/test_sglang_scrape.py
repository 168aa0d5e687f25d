"""Reading SGLang's /metrics text and /get_server_info document onto a backend's state."""

from __future__ import annotations

from gateway.backends.kinds.sglang_scrape import apply_metrics_text, apply_server_info
from gateway.backends.state import BackendState

METRICS = """# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.25
# TYPE sglang:num_used_tokens gauge
sglang:num_used_tokens{model_name="m"} 2500.0
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m"} 10000.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 7.0
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="m"} 123.0
"""


def _state() -> BackendState:
    return BackendState(url="http://b:1", pool="p")


def test_gauges_land_on_their_fields_with_their_types() -> None:
    state = _state()
    apply_metrics_text(state, METRICS)
    assert (state.token_usage, state.used_tokens, state.max_total_tokens) == (0.25, 2500, 10000)
    assert (state.running_reqs, state.queue_reqs) == (3, 7)
    assert isinstance(state.used_tokens, int) and isinstance(state.token_usage, float)


def test_a_gauge_missing_from_the_text_keeps_its_last_value() -> None:
    state = _state()
    state.queue_reqs = 4
    apply_metrics_text(
        state, '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 1\n'
    )
    assert (state.running_reqs, state.queue_reqs, state.token_usage) == (1, 4, None)


def test_server_info_gives_the_kv_pool_and_the_running_cap() -> None:
    state = _state()
    apply_server_info(state, {"max_total_num_tokens": 180000, "max_running_requests": 32, "other": 1})
    assert (state.max_total_tokens, state.max_running_requests) == (180000, 32)


def test_server_info_ignores_what_is_not_a_positive_integer() -> None:
    state = _state()
    apply_server_info(state, {"max_total_num_tokens": 0, "max_running_requests": "32"})
    apply_server_info(state, ["not", "a", "dict"])
    assert (state.max_total_tokens, state.max_running_requests) == (None, None)
