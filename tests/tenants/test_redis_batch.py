"""ScriptBatch on the suite's redis-server: one pipeline per loop turn, each caller its own reply or error."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from gateway.tenants.redis_batch import ScriptBatch

pytestmark = pytest.mark.e2e

ECHO = "if ARGV[1] == 'bad' then return redis.error_reply('refused') end return {KEYS[1], ARGV[1]}"


class CountingRedis:
    """The real client, counting the pipelines opened through it."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.pipelines = 0

    def pipeline(self, **kw: Any) -> Any:
        self.pipelines += 1
        return self.client.pipeline(**kw)


async def _setup(redis_url: str) -> tuple[aioredis.Redis, CountingRedis, ScriptBatch, Any]:
    client = aioredis.Redis.from_url(redis_url)
    counting = CountingRedis(client)
    batch = ScriptBatch(counting)  # type: ignore[arg-type]
    return client, counting, batch, client.register_script(ECHO)


async def test_calls_of_one_loop_turn_share_one_pipeline_and_each_gets_its_own_reply(
    redis_url: str, redis_prefix: str
) -> None:
    client, counting, batch, script = await _setup(redis_url)
    replies = await asyncio.gather(*(batch.call(script, [f"{redis_prefix}k{i}"], [i]) for i in range(10)))
    assert replies == [[f"{redis_prefix}k{i}".encode(), str(i).encode()] for i in range(10)]
    assert counting.pipelines == 1
    assert await batch.call(script, [f"{redis_prefix}alone"], ["x"]) == [
        f"{redis_prefix}alone".encode(),
        b"x",
    ]
    assert counting.pipelines == 1  # a lone call goes the ordinary way
    await client.aclose()


async def test_an_error_reply_is_its_callers_alone(redis_url: str, redis_prefix: str) -> None:
    client, counting, batch, script = await _setup(redis_url)
    calls = [batch.call(script, [f"{redis_prefix}k"], [arg]) for arg in ("a", "bad", "c")]
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert results[0] == [f"{redis_prefix}k".encode(), b"a"]
    assert isinstance(results[1], ResponseError) and "refused" in str(results[1])
    assert results[2] == [f"{redis_prefix}k".encode(), b"c"]
    assert counting.pipelines == 1
    await client.aclose()


async def test_a_script_redis_forgot_is_loaded_again(redis_url: str, redis_prefix: str) -> None:
    client, _, batch, script = await _setup(redis_url)
    assert await batch.call(script, [f"{redis_prefix}k"], ["warm"])  # loaded now
    await client.script_flush()
    replies = await asyncio.gather(*(batch.call(script, [f"{redis_prefix}k"], [i]) for i in range(3)))
    assert replies == [[f"{redis_prefix}k".encode(), str(i).encode()] for i in range(3)]
    await client.aclose()


async def test_no_redis_fails_every_caller_of_the_turn() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_connect_timeout=1)
    batch = ScriptBatch(client)
    script = client.register_script(ECHO)
    results = await asyncio.gather(
        *(batch.call(script, ["k"], [i]) for i in range(4)), return_exceptions=True
    )
    assert all(isinstance(r, RedisConnectionError) for r in results)
    await client.aclose()


async def test_a_turn_whose_first_caller_is_cancelled_still_sends_the_others(
    redis_url: str, redis_prefix: str
) -> None:
    client, _, batch, script = await _setup(redis_url)
    first = asyncio.create_task(batch.call(script, [f"{redis_prefix}k"], ["first"]))
    second = asyncio.create_task(batch.call(script, [f"{redis_prefix}k"], ["second"]))
    await asyncio.sleep(0)  # both joined the turn; the first waits it out
    first.cancel()
    assert await asyncio.wait_for(second, 2) == [f"{redis_prefix}k".encode(), b"second"]
    with pytest.raises(asyncio.CancelledError):
        await first
    await client.aclose()
