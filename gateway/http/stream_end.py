"""Ending a stream the gateway no longer relays, so the engine says what it cost.

A client that leaves a stream (or a deadline the gateway gives up at) would, with the connection simply
closed, leave the ledger to guess the work done. A backend whose kind can `end` a request by the id the
gateway gave it (SGLang's `POST /abort_request`) finishes the stream instead: a `finish_reason: "abort"`
chunk, then the usage chunk the gateway always asks for (`stream_options.include_usage`), then `[DONE]`.
The gateway reads on, not relaying, until that usage or a short deadline (the pool's `end_wait_s`). A whole
answer ended so comes back as a 200 with the answer so far and its usage (SGLang 0.5.23).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import orjson

from gateway.relay.sse import SSERelay
from gateway.relay.upstream import Response, UpstreamIOError
from gateway.request.ticket import Usage

if TYPE_CHECKING:
    from gateway.backends.pool import Pool

END_AGAIN_S = 0.2  # how often the end is asked for again while no answer came


async def read_to_usage(
    pool: Pool,
    url: str,
    rid: str,
    pending: asyncio.Future[Response],
    relay: SSERelay,
    clock: Callable[[], float],
    whole: bool = False,
) -> int | None:
    """End request `rid` on `pool`'s backend at `url`, then read its response (`pending`: its headers may
    still be to come) until its usage, its end or the pool's `end_wait_s`: a stream's rest fed to `relay`, a
    whole answer's usage set on it. Shielded: it runs while the request's own scope is being cancelled.
    Returns the response's status, None when it did not come in time."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(pool.config.end_wait_s):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_end, pool, url, rid)
            await _read(pending, relay, clock, whole)
            tg.cancel_scope.cancel()
    came = pending.done() and not pending.cancelled() and pending.exception() is None
    return pending.result().status if came else None


async def _end(pool: Pool, url: str, rid: str) -> None:
    """Ask again every `END_AGAIN_S` until the answer ends: an engine still reading the request's body
    (a large prompt, images) does not know its id yet and ignores the first ask."""
    assert pool.client is not None
    while True:
        await pool.kind.end(pool.client, url, rid)
        await anyio.sleep(END_AGAIN_S)


async def _read(
    pending: asyncio.Future[Response], relay: SSERelay, clock: Callable[[], float], whole: bool
) -> None:
    try:
        response = await pending
        if response.status != 200:  # the engine refused it: there is no usage to read
            return
        if whole:
            answer = orjson.loads(await response.read())
            usage = answer.get("usage") if isinstance(answer, dict) else None
            relay.usage = usage if isinstance(usage, dict) else None
            return
        while relay.usage is None and not relay.done:
            chunk = await response.readany()
            if not chunk:
                return
            relay.feed(chunk, clock())
    except (UpstreamIOError, orjson.JSONDecodeError):
        return


def reported_usage(usage: dict[str, object]) -> Usage:
    """A usage object as the engine sent it: what it counted (SGLang 0.5.23 reports 0 prompt, 0 completion
    tokens for a request it ended while it still waited, and counts nothing for it either), with the
    prompt's cached tokens when it reports them (SGLang's `prompt_tokens_details.cached_tokens`, with
    `--enable-cache-report`)."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = _count(usage.get("prompt_tokens"))
    return Usage(
        prompt,
        _count(usage.get("completion_tokens")),
        min(prompt, _count(cached)) if isinstance(cached, int | float) else None,
    )


def _count(value: object) -> int:
    return int(value) if isinstance(value, int | float) and value > 0 else 0
