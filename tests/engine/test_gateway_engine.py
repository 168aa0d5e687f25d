"""`omnigate serve` in front of the real SGLang 0.5.23: the e2e essentials with the real `openai` client,
what a client's departure does in the engine (its own /metrics), the load signals the `sglang` kind reads,
priority passed to an engine that schedules by it, and a second engine killed under load (retries, the
circuit breaker).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from tests.engine.conftest import Server
from tests.engine.wire import (
    CAP,
    LONG,
    chat_body,
    occupy,
    open_stream,
    running_waiting,
    scrape,
    value,
    wait_for,
    wait_until,
)
from tests.support.engine import SERVED_MODEL, EngineProcess
from tests.support.processes import ManagedProcess, Processes

pytestmark = pytest.mark.e2e

ADMIN = {"authorization": "Bearer engine-tier-admin"}
POOL = "interactive"
KV = 8192
NO_PRIORITY = str(-(1 << 63))  # the label SGLang gives a request sent without a priority


def _config(tmp: Path, backends: list[str], policy: dict[str, Any] | None = None) -> Path:
    (tmp / "policy.yaml").write_text(yaml.safe_dump({"version": 1, **(policy or {})}))
    config = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "policy_path": str(tmp / "policy.yaml"),
        "watch_policy": False,
        "admin": {"token": "engine-tier-admin"},
        "auth": {"required": False},
        "store": {"kind": "memory"},
        "access_log": False,
        "pools": [
            {
                "name": POOL,
                "models": [SERVED_MODEL],
                "backends": backends,
                "health_interval_s": 0.5,
                "priority_scheduling": True,
            }
        ],
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def gateway(engine: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    tmp = tmp_path_factory.mktemp("gateway")
    group = Processes(tmp)
    try:
        yield group.gateway(_config(tmp, [engine.url]), start_timeout=60)
    finally:
        group.close()


def _state(gw: str) -> dict[str, Any]:
    resp = httpx.get(gw + "/admin/state", headers=ADMIN, timeout=10, trust_env=False)
    assert resp.status_code == 200, resp.text
    pool: dict[str, Any] = resp.json()["pools"][POOL]
    return pool


def _backend(gw: str, url: str) -> dict[str, Any]:
    (found,) = [b for b in _state(gw)["backends"] if b["url"] == url]
    return found


def _client(gw: ManagedProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _idle(url: str) -> bool:
    found = scrape(url)
    return (
        value(found, "sglang:num_running_reqs", priority="")
        + value(found, "sglang:num_queue_reqs", priority="")
        == 0
    )


def test_whole_chat_through_the_openai_client(gateway: ManagedProcess) -> None:
    answer = _client(gateway).chat.completions.create(
        model=SERVED_MODEL,
        messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        max_tokens=6,
        extra_body={"ignore_eos": True},
    )
    assert answer.model == SERVED_MODEL and answer.choices[0].finish_reason == "length"
    assert answer.choices[0].message.role == "assistant" and answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens == 6
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 6


@pytest.mark.parametrize("include_usage", [True, False])
def test_streamed_chat_through_the_openai_client(gateway: ManagedProcess, include_usage: bool) -> None:
    chunks = list(
        _client(gateway).chat.completions.create(
            model=SERVED_MODEL,
            messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}],
            max_tokens=6,
            stream=True,
            stream_options={"include_usage": include_usage},
            extra_body={"ignore_eos": True},
        )
    )
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    usages = [c.usage for c in chunks if c.usage is not None]
    if include_usage:
        (usage,) = usages
        assert usage.completion_tokens == 6 and usage.total_tokens == usage.prompt_tokens + 6
    else:
        assert usages == []


def test_the_engines_400_reaches_the_client(gateway: ManagedProcess) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _client(gateway).chat.completions.create(
            model=SERVED_MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=5000,
            extra_body={"ignore_eos": True},
        )
    assert caught.value.status_code == 400
    assert "maximum context length of 4096 tokens" in str(caught.value)


async def test_a_client_that_leaves_aborts_its_request_in_the_engine(
    gateway: ManagedProcess, engine: Server
) -> None:
    await wait_until(lambda: _idle(engine.url), within=30)
    before = value(scrape(engine.url), "sglang:num_aborted_requests_total")
    async with open_stream(gateway.url, chat_body(LONG)) as (held, _):
        await wait_until(lambda: held.tokens >= 5)
        # the engine's gauges lag its scheduler by up to a second under load
        await wait_until(lambda: value(scrape(engine.url), "sglang:num_running_reqs", priority="") == 1)
    # the engine's own account: the request stopped running and was counted as aborted
    await wait_until(lambda: _idle(engine.url), within=10)
    await wait_until(lambda: value(scrape(engine.url), "sglang:num_aborted_requests_total") == before + 1)


async def test_admin_state_shows_the_engines_cap_kv_running_and_queued(
    gateway: ManagedProcess, engine: Server
) -> None:
    await wait_until(lambda: _idle(engine.url), within=30)
    b = await wait_until(lambda: (b := _backend(gateway.url, engine.url))["max_total_tokens"] and b)
    assert (b["max_total_tokens"], b["healthy"], b["circuit"]) == (KV, True, "closed")
    assert [s["limit"] for s in b["stages"]] == [CAP]
    async with contextlib.AsyncExitStack() as stack:
        await occupy(stack, engine.url, 1)  # straight to the engine: two run, one waits in its queue
        seen = await wait_until(
            lambda: (b := _backend(gateway.url, engine.url))["running"] == CAP and b["queued"] == 1 and b
        )
        assert 0 < seen["token_usage"] < 1


async def test_the_pools_engine_priority_reaches_the_engine(gateway: ManagedProcess, engine: Server) -> None:
    await wait_until(lambda: _idle(engine.url), within=30)
    async with open_stream(gateway.url, chat_body(LONG)) as (held, _):
        await wait_until(lambda: held.tokens >= 1)
        running = await wait_until(lambda: (r := _running_by_priority(engine.url)).get("") == 1 and r)
        # one request, counted in the whole scheduler's series and in its own priority's, which is an
        # integer the gateway set (a request without one would be counted under the minimum int64)
        assert running.pop("") == 1
        ((priority, count),) = running.items()
        assert count == 1 and priority != NO_PRIORITY and int(priority) >= 0


def _running_by_priority(url: str) -> dict[str, float]:
    return {
        dict(labels)["priority"]: v
        for (name, labels), v in scrape(url).items()
        if name == "sglang:num_running_reqs" and v
    }


@pytest.fixture
def victim(tmp_path: Path) -> Iterator[EngineProcess]:
    """A second real engine, to be killed."""
    proc = EngineProcess(tmp_path / "victim.log")
    try:
        yield proc.start()
    finally:
        proc.stop()


async def test_a_killed_engine_fails_over_and_opens_its_circuit(
    engine: Server, victim: EngineProcess, tmp_path: Path
) -> None:
    policy = {
        "pool_defaults": {
            "retries": 2,
            "circuit": {
                "consecutive_failures": 1,
                "failure_ratio": None,
                "open_s": 60,
                "half_open_probes": 1,
            },
        }
    }
    group = Processes(tmp_path)
    try:
        gw = group.gateway(_config(tmp_path, [victim.url, engine.url], policy), start_timeout=60).url
        await wait_until(lambda: all(b["max_total_tokens"] for b in _state(gw)["backends"]))
        await wait_until(lambda: _idle(engine.url), within=30)
        async with contextlib.AsyncExitStack() as stack:
            streams = [await stack.enter_async_context(open_stream(gw, chat_body(LONG))) for _ in range(2)]
            await wait_until(lambda: all(held.tokens >= 1 for held, _ in streams))
            # one on each engine (their own count): the victim dies with a stream in flight
            await wait_for(lambda: [running_waiting(u)[0] for u in (victim.url, engine.url)], [1, 1])
            victim.kill()
            # whatever the dispatcher picks next, every answer comes from the live engine
            async with httpx.AsyncClient(timeout=60, trust_env=False) as client:
                answers = await asyncio.gather(
                    *(client.post(gw + "/v1/chat/completions", json=chat_body(4)) for _ in range(3))
                )
            assert [r.status_code for r in answers] == [200, 200, 200], [r.text for r in answers]
            assert [r.json()["usage"]["completion_tokens"] for r in answers] == [4, 4, 4]
        # the failed exchange opens the circuit at once; the next health check marks the engine down
        dead = await wait_until(lambda: (b := _backend(gw, victim.url))["circuit"] == "open" and b, within=10)
        assert (await wait_until(lambda: not _backend(gw, victim.url)["healthy"], within=15)) is True
        assert dead["circuit"] == "open"
        assert _backend(gw, engine.url)["circuit"] == "closed"
    finally:
        group.close()
