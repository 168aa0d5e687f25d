"""RunOptions.headers_at: one measured request sent with extra headers, the sequence otherwise unchanged."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from loadtest.runner import RunOptions, execute
from loadtest.workload import load_workload
from tests.support.servers import serve

pytestmark = pytest.mark.e2e


async def _seen(tmp_path: Path, headers_at: dict[int, dict[str, str]]) -> list[tuple[str | None, bytes]]:
    """(x-probe header, body) of every request the server got, in arrival order."""
    seen: list[tuple[str | None, bytes]] = []

    async def chat(request: Request) -> JSONResponse:
        seen.append((request.headers.get("x-probe"), await request.body()))
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        return JSONResponse({"choices": [{"index": 0, "message": {"content": "a"}}], "usage": usage})

    w = load_workload(
        None,
        {
            "mix": {"text": 1},
            "count": 4,
            "stream": False,
            "arrivals": {"shape": "constant", "process": "constant", "rate": 20},
            "warmup": {"duration": 0.1, "rate": 20},
            "drain": 10,
        },
    )
    with serve(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])) as srv:
        await execute(RunOptions(url=srv.url, workload=w, cache_dir=tmp_path, headers_at=headers_at))
    return seen


async def test_the_indexed_measured_request_alone_carries_the_headers(tmp_path: Path) -> None:
    plain = await _seen(tmp_path, {})
    probed = await _seen(tmp_path, {2: {"x-probe": "1"}})
    warm = len(plain) - 4  # the warm-up's requests come first and are never probed
    assert [h for h, _ in probed] == [None] * (warm + 2) + ["1", None]
    assert [orjson.loads(b) for _, b in probed] == [orjson.loads(b) for _, b in plain]
