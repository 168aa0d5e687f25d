"""The harness's outer in-flight cap (RunOptions.max_in_flight) against a real server on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from loadtest.metrics import summarize
from loadtest.records import RequestRecord
from loadtest.runner import RunOptions, execute
from loadtest.workload import Slo, load_workload
from tests.support.servers import serve

pytestmark = pytest.mark.e2e


class Counting:
    """A streaming server that holds each request `hold_s` and records the peak concurrency it saw."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self.now = 0
        self.peak = 0
        self.served = 0

    def app(self) -> Starlette:
        async def chat(request: Request) -> StreamingResponse:
            await request.body()
            self.now += 1
            self.peak = max(self.peak, self.now)

            async def events():  # type: ignore[no-untyped-def]
                try:
                    await asyncio.sleep(self.hold_s)
                    yield b'data: {"choices":[{"index":0,"delta":{"content":"a "}}]}\n\n'
                    yield b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
                    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
                    yield b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"
                    self.served += 1
                finally:
                    self.now -= 1

            return StreamingResponse(events(), media_type="text/event-stream")

        return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def workload(count: int, drain: float) -> object:
    return load_workload(
        None,
        {
            "mix": {"text": 1},
            "count": count,
            "duration": 30,
            "arrivals": {"shape": "constant", "process": "constant", "rate": 200},
            "warmup": {"duration": 0},
            "output_tokens": {"dist": "fixed", "value": 2},
            "drain": drain,
        },
    )


async def test_cap_bounds_concurrency_and_reports_outer_wait_apart_from_send_lag(tmp_path: Path) -> None:
    server = Counting(hold_s=0.05)
    with serve(server.app()) as srv:
        opts = RunOptions(url=srv.url, workload=workload(12, 60), cache_dir=tmp_path, max_in_flight=2)
        records, _ = await execute(opts)
    assert server.peak == 2 and server.served == 12
    assert all(r.ok for r in records)
    # 12 sends due within 60 ms against 2 slots of ≥ 50 ms each: the last goes out after five rounds.
    assert max(r.sent for r in records) >= 5 * 0.05 and max(r.outer_wait for r in records) > 0
    assert all(r.send_lag == r.sent - r.scheduled - r.outer_wait for r in records)
    s = summarize(records, Slo())
    assert s["outer_wait_ms"]["max"] == max(r.outer_wait for r in records) * 1000


async def test_requests_still_held_when_the_drain_closes_are_shed_as_outer_timeouts(tmp_path: Path) -> None:
    server = Counting(hold_s=30.0)
    with serve(server.app()) as srv:
        opts = RunOptions(url=srv.url, workload=workload(3, 0.3), cache_dir=tmp_path, max_in_flight=1)
        records, _ = await execute(opts)
    assert [(r.status, r.error) for r in records] == [
        (200, "unfinished"),
        (408, "outer_queue_timeout"),
        (408, "outer_queue_timeout"),
    ]
    s = summarize(records, Slo())
    assert (s["rejected"], s["errors"], s["error_codes"]) == (
        2,
        1,
        {"unfinished": 1, "outer_queue_timeout": 2},
    )
    assert all(r.outer_wait > 0 and r.e2e == 0.0 for r in records[1:])


async def test_a_duration_bounded_run_sheds_what_the_cap_still_holds_when_the_load_stops(
    tmp_path: Path,
) -> None:
    server = Counting(hold_s=0.3)
    w = load_workload(
        None,
        {
            "mix": {"text": 1},
            "duration": 0.5,
            "arrivals": {"shape": "constant", "process": "constant", "rate": 8},  # at 0.0625 … 0.4375
            "warmup": {"duration": 0},
            "output_tokens": {"dist": "fixed", "value": 2},
            "drain": 60,
        },
    )
    with serve(server.app()) as srv:
        opts = RunOptions(url=srv.url, workload=w, cache_dir=tmp_path, max_in_flight=1)
        records, _ = await execute(opts)
    # one at a time for 0.3 s: the second goes out at ~0.36 s and finishes in the drain; at 0.5 s the
    # other two are shed at once instead of waiting for the drain to close
    assert server.served == 2
    assert [(r.status, r.error) for r in records] == [(200, None), (200, None)] + [
        (408, "outer_queue_timeout")
    ] * 2
    assert all(0.49 <= r.sent < 0.6 for r in records[2:])


def test_outer_wait_scales_with_the_time_scale_and_is_not_send_lag() -> None:
    r = RequestRecord(scheduled=1.0, sent=1.5, outer_wait=0.4)
    assert round(r.send_lag, 9) == 0.1
    assert r.scaled(10).outer_wait == 4.0 and round(r.scaled(10).send_lag, 9) == 1.0
    assert summarize([RequestRecord(sent=1.0, e2e=1.0)], Slo())["outer_wait_ms"] is None
