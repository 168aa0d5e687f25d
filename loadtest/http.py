"""A minimal keep-alive HTTP/1.1 client on raw asyncio streams.

Why not httpx: the load generator must never be the bottleneck, and an httpx client collapsed well
below the rates raw asyncio streams hold (docs/decisions/0009-loadgen-raw-http-client.md). So it speaks
just enough HTTP/1.1: one request per connection at a time, Content-Length or chunked or close-delimited
bodies, and a pool of idle connections per origin.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit


class HttpError(Exception):
    """Transport-level failure: connect refused, reset, malformed response, timeout."""


@dataclass(slots=True)
class Origin:
    scheme: str
    host: str
    port: int
    base_path: str

    @classmethod
    def parse(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[str, str]
    _reader: asyncio.StreamReader
    _mode: str
    _remaining: int
    _reusable: bool
    _conn: _Conn
    _pool: HttpPool
    done: bool = field(default=False)

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive; returns the connection to the pool once the body is complete."""
        r = self._reader
        try:
            if self._mode == "chunked":
                while True:
                    size_line = await r.readline()
                    if not size_line:
                        raise HttpError("connection closed inside a chunked body")
                    size = int(size_line.split(b";", 1)[0].strip(), 16)
                    if size == 0:
                        await r.readuntil(b"\r\n")
                        break
                    data = await r.readexactly(size + 2)
                    yield data[:-2]
            elif self._mode == "length":
                while self._remaining > 0:
                    data = await r.read(min(self._remaining, 65536))
                    if not data:
                        raise HttpError("connection closed before Content-Length was reached")
                    self._remaining -= len(data)
                    yield data
            else:
                while data := await r.read(65536):
                    yield data
        except (asyncio.IncompleteReadError, ValueError, ConnectionError) as e:
            self._conn.close()
            raise HttpError(f"broken response body: {e!r}") from e
        self.done = True
        self._pool.release(self._conn, self._reusable)

    async def read(self) -> bytes:
        return b"".join([piece async for piece in self.iter_bytes()])

    def close(self) -> None:
        """Abandon the response; a connection with an unread body cannot be reused."""
        if not self.done:
            self._conn.close()
            self.done = True


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        self.writer.close()


class HttpPool:
    """Keep-alive connections to one origin; unbounded by design (open-loop load must never queue here)."""

    def __init__(self, url: str) -> None:
        self.origin = Origin.parse(url)
        self._idle: list[_Conn] = []
        self._ssl = ssl.create_default_context() if self.origin.scheme == "https" else None
        self._host_header = f"{self.origin.host}:{self.origin.port}".encode()

    async def _connect(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.writer.is_closing() and not conn.reader.at_eof():
                return conn
        try:
            reader, writer = await asyncio.open_connection(
                self.origin.host, self.origin.port, ssl=self._ssl, limit=1 << 20
            )
        except OSError as e:
            raise HttpError(f"connect to {self.origin.host}:{self.origin.port} failed: {e}") from e
        return _Conn(reader, writer)

    def release(self, conn: _Conn, reusable: bool) -> None:
        if reusable and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.close()

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Response:
        """Send a request and read the status line and headers; the body is read via the Response."""
        head = [f"{method} {self.origin.base_path}{path} HTTP/1.1".encode(), b"host: " + self._host_header]
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}".encode())
        head.append(b"content-length: %d" % len(body))
        payload = b"\r\n".join(head) + b"\r\n\r\n" + body
        for attempt in (0, 1):
            fresh = attempt == 1 or not self._idle
            conn = await self._connect()
            try:
                conn.writer.write(payload)
                raw = await conn.reader.readuntil(b"\r\n\r\n")
                break
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as e:
                conn.close()
                if fresh:  # a stale keep-alive connection gets one retry on a new one
                    raise HttpError(f"no response from {self.origin.host}:{self.origin.port}: {e!r}") from e
        return self._parse_head(raw, conn)

    def _parse_head(self, raw: bytes, conn: _Conn) -> Response:
        lines = raw.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as e:
            conn.close()
            raise HttpError(f"malformed status line: {lines[0]!r}") from e
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            mode, remaining = "chunked", 0
        elif "content-length" in headers:
            mode, remaining = "length", int(headers["content-length"])
        else:
            mode, remaining = "close", 0
        reusable = mode != "close" and headers.get("connection", "").lower() != "close"
        resp = Response(status, headers, conn.reader, mode, remaining, reusable, conn, self)
        if mode == "length" and remaining == 0:
            resp.done = True
            self.release(conn, reusable)
        return resp

    async def aclose(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()
