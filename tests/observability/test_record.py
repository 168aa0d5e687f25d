from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gateway.backends.state import BackendState
from gateway.observability import record
from gateway.observability.accesslog import AccessLog, access_record
from gateway.observability.metrics import REGISTRY
from gateway.observability.rolling import ClassStats
from gateway.request.ticket import Cost, Ending, Outcome, Relayed, Ticket, Usage
from tests.observability.exposition import exported_names, label_names, label_sets

REGISTRY_README = Path(__file__).resolve().parents[2] / "gateway" / "observability" / "README.md"


def _ticket(tenant: str, outcome: str = "ok") -> Ticket:
    t = Ticket(id="req-1", model="qwen2.5-omni-7b", stream=True, arrival=100.0, tenant=tenant)
    t.pool = "interactive"
    t.priority, t.band, t.bucket, t.job_id = 10, "high", "single_image", "job-1"
    t.backend = "http://user:pw@10.0.0.1:30000"
    t.cost = Cost(text_tokens=100, vision_tokens=300, expected_output_tokens=50, images=1, remote_media=1)
    t.dispatched_at, t.finished_at = 100.25, 102.75
    t.relayed = Relayed(first_token_at=100.75, finished_at=102.75)
    t.usage, t.ending = Usage(prompt_tokens=500, completion_tokens=101), Ending(Outcome(outcome))
    return t


def _value(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_latencies_follow_the_benchmark_definitions() -> None:
    lat = record.latencies(_ticket("t-lat"))
    assert (lat.ttft, lat.tpot, lat.e2e) == (0.75, 0.02, 2.75)
    one_token = _ticket("t-lat")
    one_token.usage = Usage(10, 1)
    assert record.latencies(one_token).tpot is None


def test_record_finished_feeds_every_request_metric() -> None:
    t = _ticket("t-record")
    record.record_dispatch(t)
    record.record_finished(t)
    base = {"pool": "interactive", "traffic_class": "interactive"}
    assert _value("omnigate_requests_total", {**base, "tenant": "t-record", "bucket": "single_image",
                                               "priority": "high", "outcome": "ok"}) == 1  # fmt: skip
    assert _value("omnigate_tenant_tokens_total", {"tenant": "t-record", "kind": "prompt"}) == 500
    assert _value("omnigate_tenant_tokens_total", {"tenant": "t-record", "kind": "completion"}) == 101
    ratio = {"kind": "prompt", "bucket": "single_image", "le": "0.8"}
    assert _value("omnigate_estimation_ratio_bucket", ratio) >= 1  # 400 / 500 = 0.8
    wait = {"pool": "interactive", "priority": "high", "le": "0.25"}
    assert _value("omnigate_queue_wait_seconds_bucket", wait) >= 1


def test_rejection_counts_reason_and_request_outcome() -> None:
    t = _ticket("t-reject", outcome="rejected")
    record.record_rejection(t, "slo_unattainable")
    labels = {"pool": "interactive", "traffic_class": "interactive", "tenant": "t-reject"}
    labels |= {"bucket": "single_image", "priority": "high", "outcome": "rejected"}
    assert _value("omnigate_requests_total", labels) == 1
    assert (
        _value("omnigate_rejections_total", {"reason": "slo_unattainable", "traffic_class": "interactive"})
        >= 1
    )


def test_backend_queue_and_slo_gauges() -> None:
    b = BackendState(url="http://rec:1", pool="p-rec", circuit="half_open", active=3, outstanding_tokens=900)
    b.reserved_kv_tokens, b.concurrency_limit, b.token_usage = 5000, 24, 0.6
    b.running_reqs, b.queue_reqs = 7, 2
    record.record_backends([b])
    where = {"pool": "p-rec", "backend": "http://rec:1"}
    got = {n: _value(f"omnigate_backend_{n}", where) for n in
           ("up", "healthy", "active_requests", "inflight_prefill_tokens", "reserved_kv_tokens",
            "concurrency_limit", "kv_usage_ratio", "running_requests", "queued_requests")}  # fmt: skip
    assert got == {"up": 1, "healthy": 1, "active_requests": 3, "inflight_prefill_tokens": 900,
                   "reserved_kv_tokens": 5000, "concurrency_limit": 24, "kv_usage_ratio": 0.6,
                   "running_requests": 7, "queued_requests": 2}  # fmt: skip
    states = {
        s: _value("omnigate_backend_circuit_state", {**where, "state": s}) for s in record.CIRCUIT_STATES
    }
    assert states == {"closed": 0, "open": 0, "half_open": 1}
    record.record_queue("p-rec", "normal", depth=12, oldest_wait_s=3.5)
    record.record_window("p-rec", 0.02)
    assert _value("omnigate_queue_depth", {"pool": "p-rec", "priority": "normal"}) == 12
    assert _value("omnigate_queue_oldest_wait_seconds", {"pool": "p-rec", "priority": "normal"}) == 3.5
    assert _value("omnigate_batch_window_seconds", {"pool": "p-rec"}) == 0.02
    record.record_slo([ClassStats("c-rec", 40, 1.2, 0.05, 0.975)], {"c-rec": (2.0, None)})
    assert _value("omnigate_slo_attainment_ratio", {"traffic_class": "c-rec"}) == 0.975
    assert _value("omnigate_rolling_p99_seconds", {"traffic_class": "c-rec", "objective": "tpot"}) == 0.05
    assert _value("omnigate_slo_target_seconds", {"traffic_class": "c-rec", "objective": "ttft"}) == 2.0
    assert (
        REGISTRY.get_sample_value(
            "omnigate_slo_target_seconds", {"traffic_class": "c-rec", "objective": "tpot"}
        )
        is None
    )


def test_metric_scheme_names_and_labels_are_stable() -> None:
    """The documented scheme; a change here is a dashboard/alert-rule change too."""
    names = label_names(REGISTRY)
    assert names["omnigate_requests"] == ("pool", "traffic_class", "tenant", "bucket", "priority", "outcome")
    assert names["omnigate_rejections"] == ("reason", "traffic_class")
    assert all(n.startswith("omnigate_") for n in names)
    exported = exported_names(REGISTRY)
    assert {"process_cpu_seconds_total", "python_gc_objects_collected_total"} <= exported
    readme = (REGISTRY_README).read_text()
    undocumented = [n for n in names if f"`{n}" not in readme]
    assert undocumented == []


def test_label_sets_reads_exposition_text() -> None:
    text = (
        "# HELP omnigate_queue_depth q\n# TYPE omnigate_queue_depth gauge\n"
        'omnigate_queue_depth{pool="a",priority="5"} 3.0\n'
        "# HELP omnigate_ttft_seconds t\n# TYPE omnigate_ttft_seconds histogram\n"
        'omnigate_ttft_seconds_bucket{le="+Inf",pool="a",traffic_class="i"} 1.0\n'
        'omnigate_ttft_seconds_count{pool="a",traffic_class="i"} 1.0\n'
    )
    assert label_sets(text) == {
        "omnigate_queue_depth": {frozenset({"pool", "priority"})},
        "omnigate_ttft_seconds_bucket": {frozenset({"pool", "traffic_class"})},
        "omnigate_ttft_seconds_count": {frozenset({"pool", "traffic_class"})},
    }


def test_access_log_line_has_every_field_and_no_secrets() -> None:
    lines: list[str] = []
    log = AccessLog(write=lines.append, clock=lambda: 200.0, wall=lambda: 1_700_000_000.0)
    assert log.log(_ticket("acme"), 200)
    assert orjson.loads(lines[0]) == {
        "ts": 1_700_000_000.0, "request_id": "req-1", "job_id": "job-1", "tenant": "acme",
        "model": "qwen2.5-omni-7b", "class": "interactive", "pool": "interactive", "bucket": "single_image",
        "priority": 10, "backend": "http://10.0.0.1:30000", "stream": True, "status": 200, "outcome": "ok",
        "error_code": None, "queue_ms": 250.0, "ttft_ms": 750.0, "tpot_ms": 20.0, "duration_ms": 2750.0,
        "prompt_tokens_est": 400, "prompt_tokens": 500, "output_tokens_est": 50, "output_tokens": 101,
        "images": 1, "audios": 0, "remote_media": 1,
    }  # fmt: skip


def test_access_log_samples_successes_only_and_times_unfinished_tickets_by_the_clock() -> None:
    lines: list[str] = []
    draws = iter([0.3, 0.1])
    log = AccessLog(0.25, write=lines.append, clock=lambda: 101.5, wall=lambda: 0.0, rand=lambda: next(draws))
    assert log.log(_ticket("a"), 200) is False  # 0.3 >= 0.25: sampled out
    assert log.log(_ticket("a"), 200) is True  # 0.1 < 0.25
    rejected = Ticket(
        id="r", model="m", stream=False, arrival=100.0, ending=Ending(Outcome.REJECTED, error_code="quota")
    )
    assert log.log(rejected, 429) is True  # never sampled out, no random draw needed
    rec = orjson.loads(lines[-1])
    assert (rec["status"], rec["duration_ms"], rec["queue_ms"], rec["ttft_ms"]) == (429, 1500.0, None, None)
    assert access_record(rejected, 429, now=101.5, wall=0.0)["error_code"] == "quota"
    with pytest.raises(ValueError, match="sample rate"):
        AccessLog(1.5)
