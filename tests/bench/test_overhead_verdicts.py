"""bench/overhead.py's verdicts on issue 19's targets and its check of LiteLLM's rewritten answers (pure:
no process is started)."""

from __future__ import annotations

from typing import Any

import orjson

from bench import overhead
from bench.common.servers import STREAM_BODY, STREAM_CHUNKS, WHOLE_BODY


def _result(rps: float = 0.0, p50: float = 0.0, us: float = 0.0, cpu: float = 0.0) -> dict[str, Any]:
    return {"rps": rps, "p50": p50, "p99": p50, "proxy_us": us, "proxy_cpu": cpu}


def _results(over: overhead.Results | None = None) -> overhead.Results:
    """Every target exactly at its bound, then `over`."""
    return {
        ("one conn", "whole", "direct"): _result(p50=0.0001),
        ("one conn", "whole", "default"): _result(p50=0.0007),
        ("max", "whole", "default"): _result(rps=600, us=600, cpu=0.9),
        ("max", "whole", "default·redis"): _result(rps=300, cpu=0.5),
        ("max", "whole", "default·redis×2"): _result(rps=480, cpu=1.0),
        ("max", "whole", "litellm"): _result(rps=30, us=12000),
        **(over or {}),
    }


def test_each_target_is_met_at_its_bound() -> None:
    lines = overhead.summary(_results(), 200)
    assert "whole : CPU per request, default policy + key = 600 µs: meets the ≤ 600 µs target" in lines
    assert (
        "whole : added p50 at one connection, default policy + key = 0.60 ms: meets the ≤ 0.7 ms target"
        in lines
    )
    assert "whole : max req/s 2 workers / 1 worker = 480/300 = 1.60×: meets the ≥ 1.6× target" in lines
    assert "whole : max req/s default/litellm = 600/30 = 20.0×: meets the ≥ 20× target" in lines
    assert (
        "whole :   ... per CPU second (each on a whole core): litellm/default CPU per request "
        "= 12000/600 µs = 20.0×" in lines
    )
    assert not any("free cores" in line for line in lines)  # two workers had 2× one worker's CPU


def test_a_miss_is_named_and_a_box_without_free_cores_is_blamed_for_the_workers_ratio() -> None:
    over = {
        ("max", "whole", "default"): _result(rps=590, us=601, cpu=0.9),
        ("max", "whole", "default·redis×2"): _result(rps=330, cpu=0.6),
    }
    lines = overhead.summary(_results(over), 200)
    assert "whole : CPU per request, default policy + key = 601 µs: MISSES the ≤ 600 µs target" in lines
    assert "whole : max req/s 2 workers / 1 worker = 330/300 = 1.10×: MISSES the ≥ 1.6× target" in lines
    assert (
        "whole :   ... with 1.20× the CPU one worker had (60 % against 50 % of a core): the box's free "
        "cores, not the workers, set that ratio" in lines
    )
    assert "whole : max req/s default/litellm = 590/30 = 19.7×: MISSES the ≥ 20× target" in lines


def test_litellm_is_judged_by_its_answer_text_not_its_framing() -> None:
    expected = "tok " * STREAM_CHUNKS
    assert overhead._content("whole", WHOLE_BODY) == expected
    assert overhead._content("stream", STREAM_BODY) == expected
    rewritten = b"".join(
        b"data: "
        + orjson.dumps({"id": "chatcmpl-x", "choices": [{"index": 0, "delta": {"content": "tok "}}]})
        + b"\n\n"
        for _ in range(STREAM_CHUNKS)
    )
    assert overhead._content("stream", rewritten + b"data: [DONE]\n\n") == expected
    assert overhead._content("stream", rewritten[: len(rewritten) // 2]) != expected


def _peers(default_us: float, default_p50: float, stream_us: float) -> overhead.Results:
    """smg at 300 µs per whole request, 0.5 ms added at one connection; the baseline at 2,000 µs a stream
    (20 µs a chunk); the default row as given (direct's p50 is 0, so a p50 is the added time)."""
    rows: overhead.Results = {("one conn", "whole", "direct"): _result(p50=0.0)}
    for name, us, p50, stream in (
        ("smg", 300.0, 0.0005, 1500.0),
        ("default@base", 900.0, 0.002, 2000.0),
        ("default", default_us, default_p50, stream_us),
    ):
        rows[("one conn", "whole", name)] = _result(p50=p50)
        rows[("max", "whole", name)] = _result(rps=1e6 / us, us=us)
        rows[("max", "stream", name)] = _result(rps=1e6 / stream, us=stream)
    return rows


def test_the_smg_ratios_are_met_at_twice_smgs_figures_and_the_chunk_cost_within_5_percent() -> None:
    lines = overhead.peer_lines(_peers(600.0, 0.001, 2100.0))
    assert "| smg | 300 | 0.50 | 3333 | 15.0 |" in lines
    assert "| default | 600 | 1.00 | 1667 | 21.0 |" in lines
    assert "CPU per whole request ≤ 2× smg's: meets (2.00×)" in lines
    assert "added p50, one conn ≤ 2× smg's: meets (2.00×)" in lines
    assert (
        "CPU per streamed chunk no worse than the baseline's: meets (21.0 against 20.0 µs, 1.05×; "
        "within 1.05× counts); CPU per whole request 0.67× the baseline's" in lines
    )


def test_a_miss_of_the_smg_ratios_or_the_chunk_cost_is_named() -> None:
    lines = overhead.peer_lines(_peers(601.0, 0.0011, 2110.0))
    assert "CPU per whole request ≤ 2× smg's: MISSES (2.00×)" in lines
    assert "added p50, one conn ≤ 2× smg's: MISSES (2.20×)" in lines
    chunk_verdict = "CPU per streamed chunk no worse than the baseline's: MISSES"
    assert any(line.startswith(chunk_verdict) for line in lines)


def test_workers_are_reported_against_one_and_a_box_short_of_cores_is_named(monkeypatch: Any) -> None:
    results = {
        ("max", "whole", name): _result(rps=rps, us=us, cpu=cpu)
        for name, rps, us, cpu in (
            ("default·redis", 400, 2500, 1.0),
            ("default·redis×2", 600, 2600, 1.56),
            ("default·redis×4", 620, 2700, 1.67),
        )
    }
    monkeypatch.setattr(overhead.os, "sched_getaffinity", lambda pid: {0, 1})
    lines = overhead.scale_lines(results)
    assert lines[:3] == [
        "workers 1: max req/s 400 (1.00× one worker), CPU per whole request 2500 µs (redis-server's "
        "included), 100 % of a core",
        "workers 2: max req/s 600 (1.50× one worker), CPU per whole request 2600 µs (redis-server's "
        "included), 156 % of a core",
        "workers 4: max req/s 620 (1.55× one worker), CPU per whole request 2700 µs (redis-server's "
        "included), 167 % of a core",
    ]
    assert "on 2 cores shared with the load client and the backend" in lines[3]
    monkeypatch.setattr(overhead.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert len(overhead.scale_lines(results)) == 3
