"""Ending a request as SGLang 0.5.23 does (its observed behaviour): `rid` in the body names the request
(the response's `id`), `POST /abort_request` ends it with a `finish_reason: "abort"` chunk and the usage it
ran to, and the token counters grow when a request ends — by nothing for one that left while it waited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from loadtest.sim.config import SimConfig
from loadtest.sim.server import create_app
from tests.support.servers import serve

pytestmark = pytest.mark.e2e


def _counted(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        for name in ("prompt_tokens_total", "generation_tokens_total", "num_requests_total"):
            if line.startswith(f"sglang:{name}"):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


async def _until(cond: Callable[[], bool], limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def _body(rid: str, stream: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        "max_tokens": 3000,
        "ignore_eos": True,
        "rid": rid,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _events(client: httpx.AsyncClient, url: str, rid: str, into: list[dict[str, Any]]) -> None:
    async with client.stream("POST", url + "/v1/chat/completions", json=_body(rid)) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                into.append(orjson.loads(line[6:]))
            elif line == "data: [DONE]":
                into.append({"done": True})


async def test_abort_request_ends_a_running_and_a_waiting_stream_with_their_usage() -> None:
    with serve(create_app(SimConfig(time_scale=5.0, max_running_requests=1))) as sim:
        async with httpx.AsyncClient(timeout=30) as client:
            running: list[dict[str, Any]] = []
            waiting: list[dict[str, Any]] = []
            first = asyncio.create_task(_events(client, sim.url, "chatcmpl-run", running))
            await _until(lambda: len(running) >= 5)
            second = asyncio.create_task(_events(client, sim.url, "chatcmpl-wait", waiting))
            await _until(lambda: httpx.get(sim.url + "/v1/loads").json()["loads"][0]["num_waiting_reqs"] == 1)
            assert _counted(sim.url) == {}  # nothing has ended yet: the counters are not exported
            for rid in ("chatcmpl-wait", "chatcmpl-run", "unknown-rid"):
                ended = await client.post(sim.url + "/abort_request", json={"rid": rid})
                assert ended.status_code == 200 and ended.content == b""
            await asyncio.gather(first, second)
    assert {e.get("id") for e in running[:-1]} == {"chatcmpl-run"}
    assert running[-3]["choices"][0]["finish_reason"] == "abort" and running[-1] == {"done": True}
    contents = [e["choices"][0]["delta"].get("content") for e in running if e.get("choices")]
    tokens = sum(len(c.split()) for c in contents if c)  # the simulator's text: one word per token
    usage = running[-2]["usage"]
    assert running[-2]["choices"] == [] and usage["completion_tokens"] == tokens >= 4
    assert [e.get("choices") for e in waiting[:-1]] == [[waiting[0]["choices"][0]], []]
    assert waiting[0]["choices"][0]["finish_reason"] == "abort"
    assert waiting[1]["usage"]["prompt_tokens"] == waiting[1]["usage"]["completion_tokens"] == 0


async def test_counters_count_what_an_ended_request_ran_and_nothing_for_one_that_waited() -> None:
    with serve(create_app(SimConfig(time_scale=5.0, max_running_requests=1))) as sim:
        async with httpx.AsyncClient(timeout=30) as client:
            running: list[dict[str, Any]] = []
            first = asyncio.create_task(_events(client, sim.url, "chatcmpl-a", running))
            await _until(lambda: len(running) >= 5)
            whole = asyncio.create_task(
                client.post(sim.url + "/v1/chat/completions", json=_body("chatcmpl-b", stream=False))
            )
            await _until(lambda: httpx.get(sim.url + "/v1/loads").json()["loads"][0]["num_waiting_reqs"] == 1)
            await client.post(sim.url + "/abort_request", json={"rid": "chatcmpl-b"})
            answer = (await whole).json()  # a whole answer ended while it waited: 200, nothing run
            assert answer["choices"][0]["finish_reason"] == "abort"
            assert answer["usage"]["prompt_tokens"] == answer["usage"]["completion_tokens"] == 0
            await client.post(sim.url + "/abort_request", json={"rid": "chatcmpl-a"})
            await first
            usage = running[-2]["usage"]
            await _until(lambda: _counted(sim.url).get("num_requests_total") == 1)
            counted = _counted(sim.url)
            assert counted["prompt_tokens_total"] == usage["prompt_tokens"]
            assert counted["generation_tokens_total"] == usage["completion_tokens"]
