"""bench/overhead.py's verdicts on issue 19's targets and its check of LiteLLM's rewritten answers (pure:
no process is started)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import overhead
from _servers import STREAM_BODY, STREAM_CHUNKS, WHOLE_BODY


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
