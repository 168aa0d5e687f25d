from __future__ import annotations

from gateway.observability.failures import FailureEvent, FailureThrottle
from gateway.observability.settings import AlertThresholds
from gateway.request.ticket import Ticket

T = AlertThresholds(failure_burst=3, failure_window_s=60)


def _event(i: int, job: str | None = None, status: int = 502) -> FailureEvent:
    return FailureEvent(
        request_id=f"req-{i}",
        tenant="acme",
        pool="interactive",
        backend="http://10.0.0.1:30000",
        status=status,
        error="upstream closed the connection mid-stream",
        kv_usage=0.93,
        job_id=job,
        traffic_class="interactive",
        model="qwen2.5-omni-7b",
    )


def test_failure_message_carries_every_field() -> None:
    [n] = FailureThrottle().offer(_event(1, job="job-7"), T, now=0, wall=1_700_000_000)
    assert n.kind == "failure" and n.severity == "critical"
    assert n.title == "Batch job job-7 failed (502)"
    assert n.fields == (
        ("job", "job-7"),
        ("request", "req-1"),
        ("tenant", "acme"),
        ("class", "interactive"),
        ("model", "qwen2.5-omni-7b"),
        ("pool", "interactive"),
        ("backend", "http://10.0.0.1:30000"),
        ("status", 502),
        ("error", "upstream closed the connection mid-stream"),
        ("backend KV usage", 0.93),
    )


def test_storm_sends_burst_then_one_summary_per_window() -> None:
    throttle = FailureThrottle()
    sent = []
    for i in range(40):
        sent += throttle.offer(_event(i, status=503 if i % 2 else 502), T, now=i * 0.5, wall=0)
    assert [n.kind for n in sent] == ["failure"] * 3
    assert throttle.flush(T, now=59.9, wall=0) == []
    [summary] = throttle.flush(T, now=60.0, wall=0)
    assert summary.kind == "failure_summary"
    assert summary.title == "37 more failures in the last 60 s"
    assert dict(summary.fields) == {"failures": 37, "sent individually": 3}
    assert summary.lines == (
        "19 × pool=interactive backend=http://10.0.0.1:30000 status=503",
        "18 × pool=interactive backend=http://10.0.0.1:30000 status=502",
    )
    assert throttle.flush(T, now=120.0, wall=0) == []  # window closed, nothing new
    [again] = throttle.offer(_event(99), T, now=130.0, wall=0)  # a new window alerts at once
    assert again.kind == "failure"


def test_a_job_alerts_once_per_window_however_many_requests_fail() -> None:
    throttle = FailureThrottle()
    first = throttle.offer(_event(0, job="nightly-1"), T, now=0, wall=0)
    rest = [n for i in range(1, 10) for n in throttle.offer(_event(i, job="nightly-1"), T, now=i, wall=0)]
    assert len(first) == 1 and rest == []
    other = throttle.offer(_event(50), T, now=20, wall=0)
    assert [n.title for n in other] == ["Request req-50 failed (502)"]
    # the next event after the window first delivers the summary, then alerts itself
    notes = throttle.offer(_event(60, job="nightly-1"), T, now=61, wall=0)
    assert [n.kind for n in notes] == ["failure_summary", "failure"]
    assert notes[0].title == "9 more failures in the last 61 s"
    assert notes[0].lines[-1] == "jobs: nightly-1 (9)"


def test_error_summary_is_one_bounded_line_and_failure_alerts_can_be_switched_off() -> None:
    e = FailureEvent("r", "t", "p", None, 500, "line one\n  line two " + "x" * 1000, None)
    assert "\n" not in e.summary and len(e.summary) == 300 and e.summary.startswith("line one line two x")
    off = AlertThresholds(failure_alerts=False)
    assert FailureThrottle().offer(e, off, now=0, wall=0) == []


def test_from_ticket() -> None:
    t = Ticket(id="req-9", model="m", stream=True, arrival=0.0, tenant="acme", pool="offline")
    t.job_id, t.backend, t.traffic_class = "job-1", "http://b:1", "offline"
    e = FailureEvent.from_ticket(t, 504, "first byte timeout", 0.5)
    expected = ("req-9", "acme", "offline", "http://b:1", 504, "first byte timeout", 0.5, "job-1")
    assert e == FailureEvent(*expected, "offline", "m")
