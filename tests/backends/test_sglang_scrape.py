"""Reading SGLang's /metrics text and /server_info document onto a backend's state."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.backends.kinds.sglang_scrape import apply_loads, apply_metrics_text, apply_server_info
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


# SGLang 0.5.23 with --enable-priority-scheduling, 2 running (priorities 0 and 20) and 1 waiting (0): the
# request gauges repeat the whole scheduler (priority="") per priority; the KV pool comes in three parts.
_L = 'engine_type="unified",model_name="m",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
PRIORITY_METRICS = f"""# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{{{_L},priority=""}} 2.0
sglang:num_running_reqs{{{_L},priority="0"}} 1.0
sglang:num_running_reqs{{{_L},priority="20"}} 1.0
sglang:num_running_reqs{{{_L},priority="-9223372036854775808"}} 0.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{{{_L},priority=""}} 1.0
sglang:num_queue_reqs{{{_L},priority="0"}} 1.0
sglang:num_queue_reqs{{{_L},priority="20"}} 0.0
# TYPE sglang:kv_used_tokens gauge
sglang:kv_used_tokens{{{_L},priority=""}} 468.0
# TYPE sglang:kv_available_tokens gauge
sglang:kv_available_tokens{{{_L},priority=""}} 7696.0
# TYPE sglang:kv_evictable_tokens gauge
sglang:kv_evictable_tokens{{{_L},priority=""}} 28.0
"""


def test_priority_series_are_parts_of_the_whole_schedulers_series() -> None:
    state = _state()
    apply_metrics_text(state, PRIORITY_METRICS)
    assert (state.running_reqs, state.queue_reqs) == (2, 1)  # not 4 and 2 (every series summed)


def test_the_kv_parts_give_the_tokens_in_use_and_the_pool_when_the_older_gauges_are_absent() -> None:
    state = _state()
    apply_metrics_text(state, PRIORITY_METRICS)
    # evictable tokens are the radix cache's: reclaimable, so not in use; the three parts are the pool
    assert (state.used_tokens, state.max_total_tokens) == (468, 468 + 7696 + 28)


def test_the_older_gauges_win_over_the_kv_parts_when_both_are_there() -> None:
    state = _state()
    apply_metrics_text(state, METRICS + PRIORITY_METRICS.split("# TYPE sglang:kv_used_tokens")[0])
    apply_metrics_text(
        state,
        METRICS + "# TYPE sglang:kv_used_tokens" + PRIORITY_METRICS.split("# TYPE sglang:kv_used_tokens")[1],
    )
    assert (state.used_tokens, state.max_total_tokens) == (2500, 10000)


def _loads_rank(**kw: Any) -> dict[str, Any]:
    """One rank of SGLang 0.5.23's /v1/loads (fields the gateway does not read trimmed)."""
    rank = {
        "timestamp": 1796623213.15,
        "dp_rank": 0,
        "num_running_reqs": 1,
        "num_waiting_reqs": 0,
        "num_waiting_uncached_tokens": 0,
        "num_used_tokens": 326,
        "num_total_tokens": 326,
        "max_total_num_tokens": 8192,
        "max_running_requests": 2,
        "token_usage": 0.0398,
        "gen_throughput": 137.92,
        "cache_hit_rate": 0.9615,
        "utilization": 0.0,
        "memory": {"weight_gb": 0.007, "kv_cache_gb": 0.016, "graph_gb": 0.0, "token_capacity": 8192},
        "queues": {"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    }
    return {**rank, **kw}


def _loads(*ranks: dict[str, Any]) -> dict[str, Any]:
    return {"timestamp": "2026-12-07T06:00:13+00:00", "version": "0.5.23", "loads": list(ranks)}


def test_loads_of_0_5_23_land_on_every_field() -> None:
    state = _state()
    assert apply_loads(state, _loads(_loads_rank()))
    assert (state.running_reqs, state.queue_reqs, state.used_tokens) == (1, 0, 326)
    assert (state.max_total_tokens, state.max_running_requests, state.token_usage) == (8192, 2, 0.0398)


def test_loads_sum_counts_over_data_parallel_ranks_and_keep_the_fullest_ranks_ratio() -> None:
    state = _state()
    body = _loads(
        _loads_rank(
            dp_rank=0, num_running_reqs=2, num_waiting_reqs=3, num_used_tokens=7000, token_usage=0.85
        ),
        _loads_rank(dp_rank=1, num_running_reqs=1, num_waiting_reqs=0, num_used_tokens=100, token_usage=0.01),
    )
    assert apply_loads(state, body)
    assert (state.running_reqs, state.queue_reqs, state.used_tokens) == (3, 3, 7100)
    assert (state.max_total_tokens, state.max_running_requests, state.token_usage) == (16384, 4, 0.85)


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"loads": []},
        {"loads": "x"},
        {"loads": [_loads_rank(), "x"]},
        {"loads": [_loads_rank(num_running_reqs=-1)]},
        {"loads": [_loads_rank(num_waiting_reqs=None)]},
        {"loads": [_loads_rank(num_used_tokens=1.5)]},
        {"loads": [_loads_rank(max_total_num_tokens=0)]},
        {"loads": [_loads_rank(max_running_requests=True)]},
    ],
    ids=[
        "list",
        "no-ranks",
        "ranks-not-a-list",
        "rank-not-a-dict",
        "negative",
        "null",
        "float",
        "no-pool",
        "bool",
    ],
)
def test_a_loads_document_without_every_count_stores_nothing(body: Any) -> None:
    state = _state()
    assert not apply_loads(state, body)
    assert (state.running_reqs, state.queue_reqs, state.max_total_tokens, state.token_usage) == (
        None,
        None,
        None,
        None,
    )


def test_loads_without_a_usable_ratio_keep_the_counts() -> None:
    state = _state()
    assert apply_loads(state, _loads(_loads_rank(token_usage=None)))
    assert (state.running_reqs, state.token_usage) == (1, None)
