"""Upstream I/O: open a request on one backend and relay its bytes, with explicit deadlines.

Opening ends when the first body bytes arrive (or fails with an UpstreamError saying whether a retry on
another backend is safe). Relaying passes SSE events through byte-exact via SSERelay.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import httpx

from gateway.policy import Timeouts

RETRYABLE_STATUS = frozenset({500, 502, 503, 504})


class UpstreamError(Exception):
    """A backend failure; `retryable` when nothing reached the client and another backend may serve."""

    def __init__(
        self, phase: str, message: str, *, status: int = 502, retryable: bool = False, body: bytes = b""
    ) -> None:
        super().__init__(message)
        self.phase = phase
        self.message = message
        self.status = status
        self.retryable = retryable
        self.body = body


@dataclass(slots=True)
class OpenUpstream:
    response: httpx.Response
    first: bytes
    chunks: AsyncIterator[bytes]
    deadline: float

    async def next_chunk(self, timeouts: Timeouts) -> bytes | None:
        """Next raw chunk, None at the end; UpstreamError on an idle gap or the total deadline."""
        budget = min(timeouts.idle, self.deadline - time.monotonic())
        if budget <= 0:
            raise UpstreamError("total_timeout", "Backend exceeded the total request time limit.", status=504)
        with anyio.move_on_after(budget) as scope:
            try:
                return await self.chunks.__anext__()
            except StopAsyncIteration:
                return None
            except httpx.HTTPError as e:
                raise UpstreamError(
                    "mid_stream", f"Backend connection failed mid-stream: {type(e).__name__}."
                ) from None
        assert scope.cancelled_caught
        if self.deadline - time.monotonic() <= 0:
            raise UpstreamError("total_timeout", "Backend exceeded the total request time limit.", status=504)
        raise UpstreamError("idle_timeout", f"Backend sent nothing for {timeouts.idle:g} s.", status=504)

    async def aclose(self) -> None:
        """Close the upstream connection: this is how SGLang learns to abort generation."""
        with anyio.CancelScope(shield=True):
            await self.response.aclose()


async def open_upstream(
    client: httpx.AsyncClient,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    timeouts: Timeouts,
    *,
    stream: bool,
) -> OpenUpstream:
    """POST and wait for the first body bytes (streaming) or the whole body (non-streaming)."""
    start = time.monotonic()
    deadline = start + timeouts.total
    wait = min(timeouts.first_byte, timeouts.total) if stream else timeouts.total
    request = client.build_request("POST", url, content=payload, headers=headers)
    response: httpx.Response | None = None
    try:
        with anyio.fail_after(wait):
            response = await client.send(request, stream=True)
            if response.status_code != 200:
                body = await response.aread()
                raise UpstreamError(
                    "status",
                    f"Backend answered HTTP {response.status_code}.",
                    status=response.status_code,
                    retryable=response.status_code in RETRYABLE_STATUS,
                    body=body,
                )
            chunks = response.aiter_raw()
            if stream:
                first = b""
                while not first:
                    first = await chunks.__anext__()
            else:
                first = await response.aread()
        return OpenUpstream(response, first, chunks, deadline)
    except TimeoutError:
        await _close(response)
        phase = "first_byte" if stream else "total_timeout"
        raise UpstreamError(phase, f"Backend did not answer within {wait:g} s.", status=504) from None
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
        await _close(response)
        raise UpstreamError(
            "connect", f"Cannot connect to backend: {type(e).__name__}.", status=502, retryable=True
        ) from None
    except (httpx.HTTPError, StopAsyncIteration) as e:
        await _close(response)
        raise UpstreamError(
            "first_byte",
            f"Backend failed before the first byte: {type(e).__name__}.",
            status=502,
            retryable=True,
        ) from None
    except BaseException:
        await _close(response)
        raise


async def _close(response: httpx.Response | None) -> None:
    if response is not None:
        with anyio.CancelScope(shield=True):
            await response.aclose()
