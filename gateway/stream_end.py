"""Ending a stream the gateway no longer relays, so the engine says what it cost.

A client that leaves a stream (or a deadline the gateway gives up at) would, with the connection simply
closed, leave the ledger to guess the work done. A backend whose kind can `end` a request by the id the
gateway gave it (SGLang's `POST /abort_request`) finishes the stream instead: a `finish_reason: "abort"`
chunk, then the usage chunk the gateway always asks for (`stream_options.include_usage`), then `[DONE]`.
The gateway reads on, not relaying, until that usage or a short deadline (the pool's `end_wait_s`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio

from gateway.sse import SSERelay
from gateway.ticket import Usage
from gateway.upstream import Response, UpstreamIOError

if TYPE_CHECKING:
    from gateway.backends.pool import Pool


async def read_to_usage(
    pool: Pool, url: str, rid: str, response: Response, relay: SSERelay, clock: Callable[[], float]
) -> None:
    """End request `rid` on `pool`'s backend at `url` and feed the rest of its stream to `relay` until its
    usage, its end or the pool's `end_wait_s`; shielded: it runs while the request's scope is cancelled."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(pool.config.end_wait_s):
        assert pool.client is not None
        await pool.kind.end(pool.client, url, rid)
        try:
            while relay.usage is None and not relay.done:
                chunk = await response.readany()
                if not chunk:
                    return
                relay.feed(chunk, clock())
        except UpstreamIOError:
            return


def ended_usage(usage: dict[str, object]) -> Usage:
    """The usage an ended stream closed with, as charged: a request that produced no token never finished
    its prefill (SGLang drops a request still waiting in its queue and counts nothing for it), so nothing."""
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    return Usage(prompt, completion) if completion else Usage(0, 0)


def reported_usage(usage: dict[str, object]) -> Usage:
    """A usage object as the engine sent it."""
    return Usage(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")))


def _count(value: object) -> int:
    return int(value) if isinstance(value, int | float) and value > 0 else 0
