"""The `sglang` kind's probe against a small HTTP server: which routes it reads, and when.

A 0.5.23-like server answers /v1/loads, so the load comes from there and /metrics is never asked; an older
one answers 404, so the gauges are read, and /v1/loads is not asked again until the server restarts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import aiohttp
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.backends.kinds import adapter_for
from gateway.backends.kinds.sglang import SGLang
from gateway.backends.state import BackendState
from gateway.settings.config import PoolConfig
from tests.support.servers import serve

pytestmark = pytest.mark.e2e

LOADS = {
    "version": "0.5.23",
    "loads": [
        {
            "dp_rank": 0,
            "num_running_reqs": 2,
            "num_waiting_reqs": 5,
            "num_used_tokens": 700,
            "max_total_num_tokens": 8192,
            "max_running_requests": 2,
            "token_usage": 0.09,
        }
    ],
}
METRICS = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 3.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 1.0
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m"} 4096.0
"""


class Engine:
    """A server with or without /v1/loads that counts what it was asked."""

    def __init__(self, has_loads: bool) -> None:
        self.has_loads = has_loads
        self.healthy = True
        self.asked: Counter[str] = Counter()

    def app(self) -> Starlette:
        async def route(request: Request) -> Response:
            path = request.url.path
            self.asked[path] = self.asked[path] + 1
            if path == "/health":
                return Response(status_code=200 if self.healthy else 503)
            if path == "/server_info":
                return _json({"max_running_requests": 2, "max_total_num_tokens": 8192})
            if path == "/v1/loads" and self.has_loads:
                return _json(LOADS)
            if path == "/metrics":
                return Response(METRICS, media_type="text/plain")
            return Response(status_code=404)

        paths = ("/health", "/server_info", "/v1/loads", "/metrics")
        return Starlette(routes=[Route(p, route) for p in paths])


def _json(body: Any) -> Response:
    return Response(orjson.dumps(body), media_type="application/json")


def _kind() -> SGLang:
    kind = adapter_for(PoolConfig.model_validate({"name": "p", "models": ["m"], "backends": ["http://b:1"]}))
    assert isinstance(kind, SGLang)
    return kind


async def _probe(kind: SGLang, state: BackendState, engine: Engine, times: int) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(times):
            assert await kind.probe(session, state, lambda: 5.0) is engine.healthy


async def test_a_server_with_loads_is_read_from_loads_alone() -> None:
    engine = Engine(has_loads=True)
    with serve(engine.app()) as server:
        state = BackendState(url=server.url, pool="p")
        await _probe(_kind(), state, engine, 3)
    assert (state.running_reqs, state.queue_reqs, state.used_tokens) == (2, 5, 700)
    assert (state.max_total_tokens, state.max_running_requests, state.last_scrape) == (8192, 2, 5.0)
    assert engine.asked == {"/health": 3, "/server_info": 1, "/v1/loads": 3}


async def test_a_server_without_loads_is_read_from_its_gauges_until_it_restarts() -> None:
    engine = Engine(has_loads=False)
    kind = _kind()
    with serve(engine.app()) as server:
        state = BackendState(url=server.url, pool="p")
        await _probe(kind, state, engine, 3)
        assert (state.running_reqs, state.queue_reqs, state.max_total_tokens) == (3, 1, 4096)
        assert engine.asked == {"/health": 3, "/server_info": 1, "/v1/loads": 1, "/metrics": 3}
        engine.healthy = False  # down, then back (perhaps upgraded): ask again
        await _probe(kind, state, engine, 1)
        engine.healthy, engine.has_loads = True, True
        await _probe(kind, state, engine, 1)
    assert (state.running_reqs, state.queue_reqs, state.max_total_tokens) == (2, 5, 8192)
    assert engine.asked["/v1/loads"] == 2 and engine.asked["/metrics"] == 3
