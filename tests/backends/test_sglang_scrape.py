"""Reading SGLang's /metrics text and /server_info document onto a backend's state."""

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


def _rank(name: str, dp: int, tp: int, value: float) -> str:
    return f'{name}{{model_name="m",tp_rank="{tp}",dp_rank="{dp}"}} {value}'


# two DP ranks; with enable_metrics_for_all_schedulers each rank's two TP ranks repeat its gauges
DP_METRICS = "\n".join(
    [
        "# TYPE sglang:token_usage gauge",
        *(_rank("sglang:token_usage", dp, tp, u) for dp, u in ((0, 0.9), (1, 0.3)) for tp in (0, 1)),
        "# TYPE sglang:num_used_tokens gauge",
        *(_rank("sglang:num_used_tokens", dp, tp, n) for dp, n in ((0, 900), (1, 300)) for tp in (0, 1)),
        "# TYPE sglang:max_total_num_tokens gauge",
        *(_rank("sglang:max_total_num_tokens", dp, tp, 1000) for dp in (0, 1) for tp in (0, 1)),
        "# TYPE sglang:num_running_reqs gauge",
        *(_rank("sglang:num_running_reqs", dp, tp, n) for dp, n in ((0, 5), (1, 2)) for tp in (0, 1)),
        "# TYPE sglang:num_queue_reqs gauge",
        *(_rank("sglang:num_queue_reqs", dp, tp, n) for dp, n in ((0, 4), (1, 0)) for tp in (0, 1)),
    ]
)


def _state() -> BackendState:
    return BackendState(url="http://b:1", pool="p")


def test_gauges_land_on_their_fields_with_their_types() -> None:
    state = _state()
    apply_metrics_text(state, METRICS)
    assert (state.token_usage, state.used_tokens, state.max_total_tokens) == (0.25, 2500, 10000)
    assert (state.running_reqs, state.queue_reqs) == (3, 7)
    assert isinstance(state.used_tokens, int) and isinstance(state.token_usage, float)


def test_data_parallel_ranks_sum_their_counts_and_report_the_fullest_ranks_kv_ratio() -> None:
    state = _state()
    apply_metrics_text(state, DP_METRICS)
    assert state.token_usage == 0.9  # not 2.4 (every sample summed), not 1.2 (ranks summed)
    assert (state.used_tokens, state.max_total_tokens) == (1200, 2000)  # TP repeats counted once
    assert (state.running_reqs, state.queue_reqs) == (7, 4)


def test_a_gauge_missing_from_the_text_keeps_its_last_value() -> None:
    state = _state()
    state.queue_reqs = 4
    apply_metrics_text(
        state, '# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 1\n'
    )
    assert (state.running_reqs, state.queue_reqs, state.token_usage) == (1, 4, None)


def test_a_non_finite_sample_is_ignored() -> None:
    state = _state()
    apply_metrics_text(state, '# TYPE sglang:token_usage gauge\nsglang:token_usage{model_name="m"} NaN\n')
    assert state.token_usage is None


def test_server_info_of_0_5_9_sums_the_kv_pool_and_the_cap_over_data_parallel_ranks() -> None:
    state = _state()
    rank = {"memory_usage": {"token_capacity": 90000}, "effective_max_running_requests_per_dp": 24}
    info = {
        "max_total_num_tokens": 90000,  # the first rank's
        "max_running_requests": 48,  # the server argument, split over the ranks
        "dp_size": 2,
        "internal_states": [rank, rank],
        "version": "0.5.9",
    }
    apply_server_info(state, info)
    assert (state.max_total_tokens, state.max_running_requests) == (180000, 48)


def test_server_info_without_rank_states_gives_the_first_ranks_pool_times_the_ranks() -> None:
    state = _state()
    apply_server_info(state, {"max_total_num_tokens": 90000, "max_running_requests": 32, "dp_size": 2})
    assert (state.max_total_tokens, state.max_running_requests) == (180000, 32)
    state = _state()
    apply_server_info(state, {"max_total_num_tokens": 180000, "max_running_requests": 32, "other": 1})
    assert (state.max_total_tokens, state.max_running_requests) == (180000, 32)


def test_a_rank_without_its_numbers_falls_back_to_the_top_level_fields() -> None:
    state = _state()
    ranks = [{"memory_usage": {"token_capacity": 500}}, {"memory_usage": {}}]
    apply_server_info(state, {"max_total_num_tokens": 400, "dp_size": 2, "internal_states": ranks})
    assert (state.max_total_tokens, state.max_running_requests) == (800, None)


def test_server_info_ignores_what_is_not_a_positive_integer() -> None:
    state = _state()
    apply_server_info(state, {"max_total_num_tokens": 0, "max_running_requests": "32"})
    apply_server_info(state, {"max_total_num_tokens": True, "internal_states": "x"})
    apply_server_info(state, ["not", "a", "dict"])
    assert (state.max_total_tokens, state.max_running_requests) == (None, None)
