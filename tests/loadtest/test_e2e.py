"""End-to-end runs through the real client against real uvicorn servers on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from loadtest.cli import main
from loadtest.results import build_result
from loadtest.runner import RunOptions, execute
from loadtest.sim.config import SimConfig
from loadtest.sim.server import create_app
from loadtest.trace import load_trace
from loadtest.workload import key_fingerprint, load_workload
from tests.support.servers import serve

pytestmark = pytest.mark.e2e


def sse_app() -> Starlette:
    """A zero-latency OpenAI streaming server: N = max_tokens content chunks, usage, [DONE]."""

    async def chat(request: Request) -> object:
        body = await request.json()
        if request.headers.get("authorization") == "Bearer sk-reject":
            err = {"error": {"message": "over quota", "type": "rate_limit", "code": "tenant_rate_limited"}}
            return JSONResponse(err, status_code=429)
        n = int(body["max_tokens"])

        async def events():  # type: ignore[no-untyped-def]
            yield b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
            for i in range(n):
                yield (
                    b"data: "
                    + orjson.dumps({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}]})
                    + b"\n\n"
                )
            usage = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}}
            yield b"data: " + orjson.dumps(usage) + b"\n\ndata: [DONE]\n\n"

        headers = {"x-omnigate-queue-ms": "12.5", "x-omnigate-bucket": "text", "x-omnigate-backend": "b0"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def metrics(request: Request) -> PlainTextResponse:
        return PlainTextResponse('sglang:token_usage{tp_rank="0"} 0.4\nsglang:num_queue_reqs 2\n')

    return Starlette(
        routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/metrics", metrics)]
    )


async def test_open_loop_run_against_sse_server(tmp_path: Path) -> None:
    w = load_workload(
        None,
        {
            "count": 30,
            "duration": 30,
            "arrivals.rate": 100,
            "warmup.count": 3,
            "warmup.rate": 50,
            "output_tokens": {"dist": "fixed", "value": 4},
            "tenants": [{"name": "sk-ok", "id": "ok", "share": 3}, {"name": "sk-reject", "share": 1}],
            "slo.ttft_ms": 60000,
        },
    )
    with serve(sse_app()) as srv:
        opts = RunOptions(
            url=srv.url, workload=w, scrape_targets=[srv.url], scrape_interval=0.05, cache_dir=tmp_path
        )
        records, samples = await execute(opts)
    assert [r.phase for r in records].count("warmup") == 3
    res = build_result(records, samples, opts)
    s = res["summary"]
    assert s["requests"] == 30 and s["completed"] + s["rejected"] == 30 and s["errors"] == 0
    assert 0 < s["rejected"] < 30 and s["error_codes"] == {"tenant_rate_limited": s["rejected"]}
    assert s["total_output_tokens"] == 4 * s["completed"]
    assert s["slo_attainment"] == s["completed"] / 30
    assert s["queue_ms"]["p99"] == 12.5
    assert set(res["breakdowns"]["tenant"]) == {"ok", key_fingerprint("sk-reject")}  # never the key
    assert res["backend"]["kv_usage"]["peak"] == 0.4 and res["backend"]["queued"]["peak"] == 2
    ok = [r for r in records if r.ok and r.phase == "measured"]
    assert all(len(r.chunk_times) == 4 and r.headers["x-omnigate-backend"] == "b0" for r in ok)


async def test_closed_loop_and_trace_replay(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    rows = [
        {
            "timestamp": 100.0 + i * 0.01,
            "request": {
                "model": "m",
                "max_tokens": 3,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "hi"},
                            {"type": "image_url", "image_url": {"url": "x"}},
                        ],
                    }
                ],
            },
            "headers": {"x-priority": "5"},
        }
        for i in range(6)
    ]
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    replay = load_trace(trace)
    assert [round(t, 3) for t, _ in replay][:2] == [0.0, 0.01]
    assert replay[0][1].bucket == "single_image" and replay[0][1].priority == 5
    with serve(sse_app()) as srv:
        w = load_workload(None, {"trace": str(trace), "warmup.duration": 0, "duration": 10})
        records, _ = await execute(RunOptions(url=srv.url, workload=w, cache_dir=tmp_path))
        assert len(records) == 6 and all(r.ok and r.output_tokens == 3 for r in records)
        closed = load_workload(
            None,
            {
                "arrivals.concurrency": 3,
                "count": 9,
                "warmup.duration": 0,
                "duration": 30,
                "output_tokens": {"dist": "fixed", "value": 2},
            },
        )
        records, _ = await execute(RunOptions(url=srv.url, workload=closed, cache_dir=tmp_path))
        assert len(records) == 9 and all(r.ok for r in records)


async def test_run_against_the_simulator(tmp_path: Path) -> None:
    w = load_workload(
        None,
        {
            "count": 12,
            "duration": 60,
            "arrivals.rate": 4,
            "warmup.duration": 0,
            "time_scale": 20,
            "output_tokens": {"dist": "fixed", "value": 8},
            "model": "Qwen/Qwen2.5-Omni-7B",
        },
    )
    with serve(create_app(SimConfig(time_scale=20))) as srv:
        opts = RunOptions(
            url=srv.url, workload=w, scrape_targets=[srv.url], scrape_interval=0.05, cache_dir=tmp_path
        )
        records, samples = await execute(opts)
    res = build_result(records, samples, opts)
    s = res["summary"]
    assert s["requests"] == 12 and s["completed"] == 12, s["error_codes"]
    assert s["total_output_tokens"] <= 8 * 12 and s["tpot_ms"] is not None
    assert set(res["breakdowns"]["bucket"]) <= {"text", "single_image", "multi_image"}
    assert res["backend"]["running"] is not None


async def test_whole_answers_count_their_tokens_and_have_ttft_equal_to_e2e(tmp_path: Path) -> None:
    """`stream: false` (batch clients): the body asks for a whole answer, its usage gives the tokens,
    and the first token is when the answer arrives — there is no inter-token gap to measure."""
    w = load_workload(
        None,
        {
            "count": 6,
            "arrivals.rate": 20,
            "warmup.duration": 0,
            "time_scale": 20,
            "stream": False,
            "output_tokens": {"dist": "fixed", "value": 8},
            "model": "Qwen/Qwen2.5-Omni-7B",
            "extra_body": {"ignore_eos": True},
        },
    )
    with serve(create_app(SimConfig(time_scale=20))) as srv:
        opts = RunOptions(url=srv.url, workload=w, cache_dir=tmp_path)
        records, _ = await execute(opts)
    measured = [r for r in records if r.phase == "measured"]
    assert len(measured) == 6 and all(r.ok for r in measured), [r.error for r in measured]
    assert [r.output_tokens for r in measured] == [8] * 6 and all(r.prompt_tokens > 0 for r in measured)
    assert all(r.ttft == r.e2e and r.chunk_times == [] for r in measured)
    summary = build_result(records, [], opts)["summary"]
    assert summary["total_output_tokens"] == 48 and summary["tpot_ms"] is None


def test_cli_run_writes_reports_and_compare(tmp_path: Path, capsys: object) -> None:
    with serve(sse_app()) as srv:
        argv = [
            "run",
            "--url",
            srv.url,
            "--count",
            "10",
            "--rate",
            "100",
            "--duration",
            "20",
            "--warmup-s",
            "0",
            "--mix",
            "text=1",
            "--slo-tpot-ms",
            "1000",
            "--cache-dir",
            str(tmp_path),
        ]
        assert main([*argv, "--out", str(tmp_path / "a")]) == 0
        assert main([*argv, "--out", str(tmp_path / "b")]) == 0
    for name in ("result.json", "report.md", "report.html"):
        assert (tmp_path / "a" / name).stat().st_size > 0
    assert (
        main(
            ["compare", str(tmp_path / "a/result.json"), str(tmp_path / "b/result.json"), "--threshold", "10"]
        )
        == 0
    )
    assert main(["run", "--url", "http://127.0.0.1:1", "--mix", "bogus=1"]) == 2
