"""Upstream I/O: open a request on one backend and relay its raw bytes, with explicit deadlines.

The connections are gateway/relay/upstream.py's (asyncio protocols with httptools' parser): the upstream
client was the largest part of the gateway's CPU per request (docs/decisions/0001-the-upstream-client.md).

Opening ends when the first body bytes arrive (or fails with an UpstreamError saying whether a retry on
another backend is safe). Relaying hands out the body as it arrives (each read takes what is already
buffered, bytes unchanged) under one Watchdog per request for the idle-gap and total deadlines.

Failures are a small class hierarchy in the manner of httpx's exceptions, so callers branch on the type:

    UpstreamError
    ├── UpstreamConnectError      no connection to the backend (retryable)
    ├── UpstreamTimeout           504
    │   ├── FirstByteTimeout      a stream's first byte did not come in time
    │   ├── IdleTimeout           a stream went quiet for longer than the idle deadline
    │   └── TotalTimeout          the whole request took longer than its total deadline
    ├── UpstreamStatusError       the backend answered with a non-200 status (its body kept; what that
    │                             means — retry, the backend's fault — is its kind's to judge)
    └── UpstreamProtocolError     502: the exchange broke
        ├── BrokenBeforeFirstByte before the first byte (retryable)
        │   └── CutAfterHeaders   the backend answered 200, then closed before the first body byte
        ├── BrokenMidStream       mid-stream, after bytes reached the client
        └── TruncatedStream       the stream ended without its final event

`label` is the `phase` label of `omnigate_upstream_errors_total`; `code` is the client's error code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import TracebackType

import anyio

from gateway.relay.upstream import ConnectFailed, Response, Upstream, UpstreamIOError
from gateway.request.errors import ErrorCode

# Identity encoding: bytes are relayed as they come, so the backend must not compress them.
_FIXED_HEADERS = {"accept-encoding": "identity"}


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Upstream deadlines in seconds: connect, a stream's first byte, idle gap between chunks, total."""

    connect: float
    first_byte: float
    idle: float
    total: float


class UpstreamError(Exception):
    """A backend failure; `retryable` when nothing reached the client and another backend may serve."""

    label = "upstream"
    status = 502
    retryable = False
    code = ErrorCode.UPSTREAM_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UpstreamConnectError(UpstreamError):
    label, retryable, code = "connect", True, ErrorCode.BACKEND_CONNECT


class UpstreamTimeout(UpstreamError):
    status = 504


class FirstByteTimeout(UpstreamTimeout):
    label, code = "first_byte", ErrorCode.BACKEND_FIRST_BYTE


class IdleTimeout(UpstreamTimeout):
    label = "idle_timeout"


class TotalTimeout(UpstreamTimeout):
    label, code = "total_timeout", ErrorCode.BACKEND_TOTAL_TIMEOUT


class UpstreamStatusError(UpstreamError):
    """The backend answered `status` (not 200) with `body`; its kind's adapter judges and maps it."""

    label = "status"

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"Backend answered HTTP {status}.")
        self.status = status
        self.body = body


class UpstreamProtocolError(UpstreamError):
    pass


class BrokenBeforeFirstByte(UpstreamProtocolError):
    label, retryable, code = "first_byte", True, ErrorCode.BACKEND_FIRST_BYTE


class CutAfterHeaders(BrokenBeforeFirstByte):
    """The backend sent its 200 and closed before any body: a server whose stream fails before its first
    event (sglang-omni) ends it so."""


class BrokenMidStream(UpstreamProtocolError):
    label = "mid_stream"


class TruncatedStream(UpstreamProtocolError):
    label = "truncated"


class Watchdog:
    """Idle-gap and total deadlines for a relay, with one timer per request instead of one per chunk.

    The relay calls `reading()` before it waits for the backend (stores the time) and `relaying()` once a
    chunk is in hand (a flag): the idle gap counts only time spent waiting for the backend, never a slow
    client. The timer, when it fires, re-arms itself at the next possible expiry, or cancels the relay's
    scope and records why. (A cancel scope per chunk cost a timer reschedule per chunk.)
    """

    __slots__ = ("_deadline", "_gap", "_handle", "_last", "_loop", "_relaying", "_scope", "expired")

    def __init__(self, scope: anyio.CancelScope, gap: float, deadline: float) -> None:
        self._scope = scope
        self._gap = gap
        self._deadline = deadline
        self._last = time.monotonic()
        self._relaying = True
        self._loop = asyncio.get_running_loop()
        self.expired: type[UpstreamTimeout] | None = None
        self._handle = self._loop.call_later(min(gap, deadline - self._last), self._check)

    def reading(self) -> None:
        self._last = time.monotonic()
        self._relaying = False

    def relaying(self) -> None:
        self._relaying = True

    def _check(self) -> None:
        now = time.monotonic()
        due = min(now + self._gap if self._relaying else self._last + self._gap, self._deadline)
        if now < due:
            self._handle = self._loop.call_later(due - now, self._check)
            return
        self.expired = TotalTimeout if now >= self._deadline else IdleTimeout
        self._scope.cancel()

    def stop(self) -> None:
        self._handle.cancel()


class RelayGuard:
    """`with upstream.guard(timeouts) as dog:` around a relay: deadlines and connection failures raise
    UpstreamError; the caller tells `dog` when it starts reading and when it relays (see Watchdog)."""

    __slots__ = ("_deadline", "_gap", "_scope", "dog")

    def __init__(self, gap: float, deadline: float) -> None:
        self._gap = gap
        self._deadline = deadline
        self._scope = anyio.CancelScope()

    def __enter__(self) -> Watchdog:
        if self._deadline <= time.monotonic():
            raise TotalTimeout("Backend exceeded the total request time limit.")
        self._scope.__enter__()
        self.dog = Watchdog(self._scope, self._gap, self._deadline)
        return self.dog

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self.dog.stop()
        if exc_type is not None and issubclass(exc_type, UpstreamIOError):
            self._scope.__exit__(None, None, None)
            raise BrokenMidStream(f"Backend connection failed mid-stream: {exc_type.__name__}.") from None
        swallowed = bool(self._scope.__exit__(exc_type, exc, tb))
        if swallowed and self.dog.expired is TotalTimeout:
            raise TotalTimeout("Backend exceeded the total request time limit.")
        if swallowed and self.dog.expired is IdleTimeout:
            raise IdleTimeout(f"Backend sent nothing for {self._gap:g} s.")
        return swallowed


class OpenUpstream:
    """A backend response whose first bytes (streaming) or whole body (non-streaming) have arrived."""

    __slots__ = ("deadline", "first", "response")

    def __init__(self, response: Response, first: bytes, deadline: float) -> None:
        self.response = response
        self.first = first
        self.deadline = deadline

    def chunks(self) -> AsyncIterator[bytes]:
        """The rest of the body as it arrives; each item is everything buffered at that moment."""
        return self.response.iter_any()

    def guard(self, deadlines: Deadlines) -> RelayGuard:
        return RelayGuard(deadlines.idle, self.deadline)

    def close(self) -> None:
        """Close the upstream connection unless the body was read to its end (then it is back in the pool).

        Closing, never returning a half-read connection, is how SGLang learns to abort generation.
        """
        self.response.close()


async def open_upstream(
    client: Upstream,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    deadlines: Deadlines,
    *,
    stream: bool,
    sent: Callable[[], None] | None = None,
    keep: Callable[[asyncio.Future[Response], Callable[[], None]], None] | None = None,
) -> OpenUpstream:
    """POST and wait for the first body bytes (streaming) or the whole body (non-streaming). `sent` is
    called once the request's body is written to the backend's connection: from then the engine has the
    request, and runs its prefill even if the gateway hangs up at once (a server notices a closed
    connection only when it next writes or polls). Cancelled, the exchange goes to `keep` — the response
    (to come), and how to drop its connection — instead of being dropped: the caller ends the request on
    the backend and reads on."""
    start = time.monotonic()
    deadline = start + deadlines.total
    wait = min(deadlines.first_byte, deadlines.total) if stream else deadlines.total
    response: Response | None = None
    try:
        async with asyncio.timeout(wait):  # a native timer: anyio's fail_after costs twice as much CPU
            response = await client.post(
                url,
                payload,
                {**headers, **_FIXED_HEADERS},
                connect_timeout=deadlines.connect,
                sent=sent,
                keep=keep,
            )
            if response.status != 200:
                raise UpstreamStatusError(response.status, await response.read())
            try:
                first = await (response.readany() if stream else response.read())
            except UpstreamIOError as e:
                raise CutAfterHeaders(f"Backend closed the answer before its first byte: {e}.") from None
            if stream and not first:
                raise CutAfterHeaders("Backend closed the stream before sending anything.")
        return OpenUpstream(response, first, deadline)
    except ConnectFailed as e:
        _close(response)
        raise UpstreamConnectError(f"Cannot connect to backend: {e}.") from None
    except UpstreamIOError as e:
        _close(response)
        raise BrokenBeforeFirstByte(f"Backend failed before the first byte: {e}.") from None
    except TimeoutError:
        _close(response)
        late = FirstByteTimeout if stream else TotalTimeout
        raise late(f"Backend did not answer within {wait:g} s.") from None
    except asyncio.CancelledError:
        if keep is not None and response is not None and response.status == 200:
            got: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
            got.set_result(response)
            keep(got, response.close)
        else:
            _close(response)
        raise
    except BaseException:
        _close(response)
        raise


def _close(response: Response | None) -> None:
    if response is not None:
        response.close()
