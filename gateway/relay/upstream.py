"""The keep-alive HTTP/1.1 client the gateway reaches its backends with: asyncio protocols, httptools' parser.

A proxy asks little of a client: POST a body it already holds, read the status and headers, hand the body on
as it arrives (bytes unchanged), put a finished connection back in a keep-alive pool, and close one it left
half-read (that is how SGLang learns to abort). This does exactly that on the event loop's own protocols,
with the response parsed by httptools (llhttp, the parser uvicorn serves with), so a request costs a few
callbacks instead of a general client's layers (docs/decisions/0001-the-upstream-client.md).

    client = Upstream(max_connections=1024, max_keepalive=256)
    response = await client.post(url, body, headers, connect_timeout=2.0, sent=callback)
    response.status, response.headers["content-type"]     # header names lower-case
    first = await response.readany()                       # b"" at the body's end
    async for chunk in response.iter_any(): ...
    response.close()                                       # pooled if read to its end, else closed

Failures raise `UpstreamIOError`: `ConnectFailed` (no connection: refused, unreachable, timed out) or
`ConnectionBroken` (closed, reset or unparseable before the response ended).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator, Callable
from functools import lru_cache
from urllib.parse import urlsplit

import httptools

KEEPALIVE_S = 4.0
"""Idle connections close after this: under uvicorn's 5 s default (SGLang's HTTP server), so a request is
never sent on a connection the backend is closing."""

_HIGH_WATER = 1 << 18  # buffered body bytes a slow reader may leave before the backend's socket is paused


class UpstreamIOError(Exception):
    """The exchange with a backend failed at the transport or HTTP level."""


class ConnectFailed(UpstreamIOError):
    """No connection to the backend (refused, unreachable, or not within the connect timeout)."""


class ConnectionBroken(UpstreamIOError):
    """The connection closed, reset or sent what is not HTTP before the response ended."""


@lru_cache(maxsize=256)
def _target(url: str) -> tuple[tuple[str, int, bool], bytes]:
    """((host, port, tls), the request line and Host header) of a backend URL."""
    parts = urlsplit(url)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    head = b"POST %s HTTP/1.1\r\nhost: %s\r\n" % (path.encode(), (parts.netloc or host).encode())
    return (host, port, tls), head


def _header_lines(headers: dict[str, str]) -> bytes:
    out = []
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
            raise ValueError(f"header {name!r} holds a line break")
        out.append(f"{name}: {value}\r\n")
    return "".join(out).encode("latin-1")


class Response:
    """A backend's response whose status and headers have arrived; its body follows as it comes."""

    __slots__ = ("_conn", "_error", "_paused", "_size", "_waiter", "chunks", "complete", "headers", "status")

    def __init__(self, conn: _Connection, status: int, headers: dict[str, str]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self.chunks: collections.deque[bytes] = collections.deque()
        self.complete = False
        self._error: UpstreamIOError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._size = 0
        self._paused = False

    # fed by the connection (its on_body appends to `chunks`)
    def _end(self, error: UpstreamIOError | None = None) -> None:
        if error is None:
            self.complete = True
        elif not self.complete and self._error is None:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # read by the relay
    async def readany(self) -> bytes:
        """Everything buffered now, waiting for the next bytes if nothing is; b"" once the body ended."""
        while not self.chunks:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self._size = 0
        if self._paused:
            self._paused = False
            if self._conn.transport is not None:
                self._conn.transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def iter_any(self) -> AsyncIterator[bytes]:
        while chunk := await self.readany():
            yield chunk

    def close(self) -> None:
        """Back to the pool when the body was read to its end on a keep-alive connection; else closed."""
        conn = self._conn
        if conn.response is not self:
            return
        conn.response = None
        if self.complete and not self.chunks and conn.keep_alive:
            conn.release()
        else:
            conn.drop()


class _Connection(asyncio.Protocol):
    """One connection to one backend; at most one request on it at a time."""

    __slots__ = (
        "_headers",
        "_parser",
        "_ready",
        "_until_eof",
        "client",
        "idle_since",
        "keep_alive",
        "key",
        "response",
        "transport",
    )

    def __init__(self, client: Upstream, key: tuple[str, int, bool]) -> None:
        self.client = client
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.response: Response | None = None
        self.keep_alive = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[str, str] = {}
        self._ready: asyncio.Future[Response] | None = None
        self._until_eof = False  # a body with neither length nor chunks ends when the connection does

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._broken(f"the backend sent what is not HTTP ({e})")

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.client.forget(self)
        if exc is None and self._until_eof and self.response is not None:
            self.response._end()
        self._broken("the backend closed the connection" if exc is None else f"connection lost: {exc}")

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._headers = {}

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        framed = "content-length" in self._headers or "transfer-encoding" in self._headers
        self._until_eof = not framed and status not in (204, 304)
        self.response = Response(self, status, self._headers)
        ready = self._ready
        self._ready = None
        if ready is not None and not ready.done():
            ready.set_result(self.response)

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is None:
            return
        response.chunks.append(body)
        response._size += len(body)
        if response._size > _HIGH_WATER and not response._paused and self.transport is not None:
            response._paused = True
            self.transport.pause_reading()
        waiter = response._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_message_complete(self) -> None:
        if self.response is not None:
            self.response._end()

    # used by the client and the response
    def request(self, data: bytes) -> asyncio.Future[Response]:
        assert self.transport is not None
        self._ready = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self._ready

    def _broken(self, why: str) -> None:
        error = ConnectionBroken(why)
        ready, self._ready = self._ready, None
        if ready is not None and not ready.done():
            ready.set_exception(error)
        if self.response is not None:
            self.response._end(error)
        if self.transport is not None:
            self.transport.close()

    def release(self) -> None:
        self.client.put_back(self)

    def drop(self) -> None:
        if self.transport is not None:
            self.transport.close()  # connection_lost forgets it
        else:
            self.client.forget(self)


class Upstream:
    """A keep-alive pool over every backend of one gateway pool: at most `max_connections` open at once
    (a request past it waits for one), at most `max_keepalive` idle ones kept, each for `KEEPALIVE_S`."""

    def __init__(self, max_connections: int, max_keepalive: int, keepalive_s: float = KEEPALIVE_S) -> None:
        self.max_connections = max_connections
        self.max_keepalive = max_keepalive
        self.keepalive_s = keepalive_s
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._idle_count = 0
        self._open: set[_Connection] = set()
        self._connecting = 0
        self._slots: collections.deque[asyncio.Future[None]] = collections.deque()
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._open) + self._connecting

    async def post(
        self,
        url: str,
        body: bytes,
        headers: dict[str, str],
        *,
        connect_timeout: float,
        sent: Callable[[], None] | None = None,
        keep: Callable[[asyncio.Future[Response], Callable[[], None]], None] | None = None,
    ) -> Response:
        """Send `body` to `url` and return once the response's status and headers arrived. `sent` is
        called once the request is written to the connection (from then the backend has it). Cancelled
        while waiting, the exchange goes on and goes to `keep` (the response to come, and how to drop the
        connection) instead of being dropped."""
        key, head = _target(url)
        data = b"%s%scontent-length: %d\r\n\r\n%s" % (head, _header_lines(headers), len(body), body)
        conn = self._reuse(key) or await self._connect(key, connect_timeout)
        ready = conn.request(data)
        if sent is not None:
            sent()
        try:
            return await (ready if keep is None else asyncio.shield(ready))
        except asyncio.CancelledError:
            if keep is None:
                conn.drop()
            else:
                keep(ready, conn.drop)
            raise
        except BaseException:
            conn.drop()  # cancelled or broken: a connection mid-exchange is never reused
            raise

    def _reuse(self, key: tuple[str, int, bool]) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            self._idle_count -= 1
            if conn.transport is not None and not conn.transport.is_closing():
                if now - conn.idle_since < self.keepalive_s:
                    return conn
                conn.transport.close()
        return None

    async def _connect(self, key: tuple[str, int, bool], within_s: float) -> _Connection:
        if self._closed:
            raise ConnectFailed("the upstream client is closed")
        while self.open_connections >= self.max_connections:
            if self._idle_count:  # idle on another backend: make room
                self._close_oldest_idle()
                continue
            slot = asyncio.get_running_loop().create_future()
            self._slots.append(slot)
            try:
                await slot
            finally:
                if slot in self._slots:
                    self._slots.remove(slot)
            reused = self._reuse(key)
            if reused is not None:
                return reused
        host, port, tls = key
        conn = _Connection(self, key)
        self._connecting += 1
        try:
            async with asyncio.timeout(within_s):
                await asyncio.get_running_loop().create_connection(
                    lambda: conn, host, port, ssl=self._ssl() if tls else None
                )
        except TimeoutError:
            raise ConnectFailed(f"no connection to {host}:{port} within {within_s:g} s") from None
        except OSError as e:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {e.strerror or e}") from None
        finally:
            self._connecting -= 1
            self._wake_one()
        if conn.transport is None:  # lost while connecting
            raise ConnectFailed(f"connection to {host}:{port} closed at once")
        self._open.add(conn)
        return conn

    def _ssl(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def put_back(self, conn: _Connection) -> None:
        """A connection whose response was read to its end."""
        if self._closed or self._idle_count >= self.max_keepalive or conn.transport is None:
            conn.drop()
            return
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)
        self._idle_count += 1
        self._wake_one()

    def forget(self, conn: _Connection) -> None:
        """A connection closed: it holds no slot any more."""
        if conn in self._open:
            self._open.discard(conn)
            idle = self._idle.get(conn.key)
            if idle and conn in idle:
                idle.remove(conn)
                self._idle_count -= 1
            self._wake_one()

    def _close_oldest_idle(self) -> None:
        oldest = min((c for conns in self._idle.values() for c in conns), key=lambda c: c.idle_since)
        self._idle[oldest.key].remove(oldest)
        self._idle_count -= 1
        self._open.discard(oldest)
        if oldest.transport is not None:
            oldest.transport.close()

    def _wake_one(self) -> None:
        while self._slots:
            slot = self._slots.popleft()
            if not slot.done():
                slot.set_result(None)
                return

    async def close(self) -> None:
        """Close every connection; a request in flight fails with ConnectionBroken."""
        self._closed = True
        for conn in list(self._open):
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
        self._idle_count = 0
        await asyncio.sleep(0)  # let the transports finish closing
