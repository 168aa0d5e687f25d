"""Result documents with every part a report draws, built from synthetic records by the real `build_result`:
answers in text and answers that speak, refusals of two kinds, an error, four breakdowns, engine scrapes."""

from __future__ import annotations

from typing import Any

from loadtest.records import RequestRecord
from loadtest.results import build_result
from loadtest.runner import RunOptions
from loadtest.scrape import Sample
from loadtest.sweep import analyse
from loadtest.workload import Workload

ALICE_KEY, BOB_KEY = "sk-secret-alice-0123", "sk-secret-bob-4567"
SLO = {"ttft_ms": 500, "tpot_ms": 60, "ttfa_ms": 800, "rtf": 1.0}


def _text(i: int, slow: float) -> RequestRecord:
    ttft = 0.1 + 0.01 * i * slow
    return RequestRecord(
        bucket="text" if i % 3 else "single_image",
        tenant="alice" if i % 4 else "key:bob",
        priority=10 if i % 5 == 0 else 0,
        traffic_class="interactive" if i % 2 else "offline",
        scheduled=i * 0.25,
        sent=i * 0.25,
        ttft=ttft,
        e2e=ttft + 0.03 * slow * 49,
        chunk_times=[ttft + 0.03 * slow * k for k in range(50)],
        output_tokens=50,
        prompt_tokens=100,
        status=200,
    )


def _spoken(i: int) -> RequestRecord:
    t0 = 0.3 + 0.02 * i
    return RequestRecord(
        bucket="audio_out",
        tenant="alice",
        priority=0,
        traffic_class="interactive",
        scheduled=1.0 + i * 1.5,
        sent=1.0 + i * 1.5,
        ttft=t0,
        ttfa=t0,
        e2e=t0 + 1.5,
        audio=[(t0, 1.0), (t0 + 0.5, 1.0), (t0 + 1.0, 1.0)],
        output_tokens=30,
        status=200,
    )


def _refused(i: int, status: int, code: str) -> RequestRecord:
    return RequestRecord(
        bucket="text",
        tenant="key:bob",
        priority=0,
        traffic_class="interactive",
        scheduled=2.0 + i * 0.5,
        sent=2.0 + i * 0.5,
        e2e=0.01,
        status=status,
        error=code,
    )


def run_doc(slow: float = 1.0, name: str = "synthetic", error: bool = True) -> dict[str, Any]:
    """A run document; `slow` stretches every text answer's latencies (a B that regressed)."""
    records = [_text(i, slow) for i in range(40)] + [_spoken(i) for i in range(6)]
    records += [_refused(i, 429, "requests_per_minute_exceeded") for i in range(6)]
    records += [_refused(i, 503, "slo_unattainable") for i in range(4)]
    if error:
        records.append(
            RequestRecord(
                tenant="alice", sent=5.0, scheduled=5.0, e2e=0.2, status=502, error="backend_status"
            )
        )
    samples = [
        Sample(t / 2, "http://engine", True, {"kv_usage": 0.1 + t / 40, "running": t % 7, "queued": t % 3})
        for t in range(22)
    ]
    workload = Workload.model_validate(
        {"name": name, "slo": SLO, "tenants": [{"name": ALICE_KEY, "id": "alice"}, {"name": BOB_KEY}]}
    )
    return build_result(records, samples, RunOptions(url="http://127.0.0.1:9", workload=workload))


def sweep_doc() -> dict[str, Any]:
    values = ["8", "16", "32", "64"]
    points = [run_doc(slow, error=False) for slow in (0.5, 0.8, 1.2, 3.0)]
    for p, thr in zip(points, (500.0, 900.0, 1200.0, 1300.0), strict=True):
        p["summary"]["output_throughput"] = thr
    return analyse("max-running-requests", values, points, SLO, 0.1)
