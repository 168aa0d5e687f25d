"""Script calls to Redis made in one event-loop turn, sent as one pipeline.

Every request calls two scripts (reserve before it waits, settle after it ends), and each call through
redis-py costs a command's packing, a pooled connection and a response read of its own. Under load many
requests reach the same turn of the loop; their calls go out together as one non-transactional pipeline
(`EVALSHA` each, one write, one read of all replies), and each caller gets its own reply or error, as if
it had called alone. A lone call goes the ordinary way. A script Redis does not hold (after its restart)
is sent again by redis-py's script object, which loads it.
(docs/decisions/0012-redis-scripts-batched-per-loop-turn.md)
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

Call = tuple[AsyncScript, list[str], list[Any], "asyncio.Future[Any]"]


class ScriptBatch:
    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self._pending: list[Call] = []
        self._sending: set[asyncio.Task[None]] = set()

    async def call(self, script: AsyncScript, keys: list[str], args: list[Any]) -> Any:
        """`script(keys, args)`'s reply, sent with the other calls of this loop turn. The turn's first
        call waits the turn out, then sends: alone, itself; with company, from a task of its own, so
        that no caller's cancellation cancels the others' calls."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((script, keys, args, future))
        if len(self._pending) > 1:
            return await future
        try:
            await asyncio.sleep(0)  # the other calls of this turn join
        except asyncio.CancelledError:
            self._pending.remove((script, keys, args, future))
            if self._pending:  # they go without it
                self._spawn(self._take())
            raise
        batch = self._take()
        if len(batch) == 1:
            return await script(keys=keys, args=args)
        self._spawn(batch)
        return await future

    def _take(self) -> list[Call]:
        batch, self._pending = self._pending, []
        return batch

    def _spawn(self, batch: list[Call]) -> None:
        task = asyncio.get_running_loop().create_task(self._send(batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[Call]) -> None:
        if len(batch) == 1:
            script, keys, args, future = batch[0]
            try:
                reply = await script(keys=keys, args=args)
            except BaseException as e:  # the caller's to handle, as if it had called alone
                _fail(future, e)
                return
            if not future.done():
                future.set_result(reply)
            return
        pipe = self.redis.pipeline(transaction=False)
        for script, keys, args, _ in batch:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except BaseException as e:
            for *_, future in batch:
                _fail(future, e)
            return
        for (script, keys, args, future), reply in zip(batch, replies, strict=True):
            if isinstance(reply, NoScriptError):
                try:
                    reply = await script(keys=keys, args=args)
                except Exception as e:
                    reply = e
            if future.done():
                continue
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    if future.done():
        return
    if isinstance(error, asyncio.CancelledError):
        future.cancel()
    else:
        future.set_exception(error)
