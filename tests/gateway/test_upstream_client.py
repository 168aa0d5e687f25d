"""gateway/relay/upstream.py against raw asyncio servers on loopback: framing, keep-alive, limits,
failures."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from gateway.relay.upstream import ConnectFailed, ConnectionBroken, Upstream

pytestmark = pytest.mark.e2e

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"


class Server:
    """A loopback server running `handler` per connection; counts connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/chat/completions"

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        """One request's head and body, or None when the client closed."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        return body

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        finally:
            writer.close()


def echo(server_of: Callable[[], Server]) -> Handler:
    """Answers every request on the connection with its body, keep-alive, content-length framed."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (body := await server_of().read_request(reader)) is not None:
            writer.write(OK_HEAD + b"content-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    return handler


async def _server(handler_of: Callable[[Server], Handler]) -> Server:
    holder: list[Server] = []
    server = Server(lambda r, w: handler_of(holder[0])(r, w))
    holder.append(server)
    return server


async def test_whole_body_and_keep_alive_reuse() -> None:
    server = await _server(lambda s: echo(lambda: s))
    async with server:
        client = Upstream(max_connections=4, max_keepalive=4)
        sent: list[int] = []
        for i in range(3):
            r = await client.post(
                server.url,
                b'{"n":%d}' % i,
                {"content-type": "application/json"},
                connect_timeout=1,
                sent=lambda: sent.append(1),
            )
            assert (r.status, r.headers["content-type"]) == (200, "application/json")
            assert await r.read() == b'{"n":%d}' % i
            r.close()
        assert server.connections == 1  # one connection served all three
        assert sent == [1, 1, 1]
        head = server.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
        assert head[0] == b"POST /v1/chat/completions HTTP/1.1"
        assert b"content-length: 7" in head
        await client.close()


async def test_chunked_stream_read_as_it_comes_and_a_half_read_response_closes_its_connection() -> None:
    gate = asyncio.Event()

    def handler_of(s: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await s.read_request(reader) is not None:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                writer.write(b"5\r\nfirst\r\n")
                await writer.drain()
                await gate.wait()
                writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
                await writer.drain()

        return handler

    server = await _server(handler_of)
    async with server:
        client = Upstream(max_connections=4, max_keepalive=4)
        r = await client.post(server.url, b"{}", {}, connect_timeout=1)
        assert await r.readany() == b"first"
        gate.set()
        assert b"".join([c async for c in r.iter_any()]) == b"second"
        r.close()  # read to its end: pooled
        gate.clear()
        r = await client.post(server.url, b"{}", {}, connect_timeout=1)
        assert server.connections == 1
        assert await r.readany() == b"first"
        r.close()  # half-read: closed, never reused
        gate.set()
        r = await client.post(server.url, b"{}", {}, connect_timeout=1)
        assert await r.read() == b"firstsecond"
        r.close()
        assert server.connections == 2
        await client.close()


async def test_a_body_without_length_ends_with_the_connection() -> None:
    def handler_of(s: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await s.read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
            await writer.drain()

        return handler

    server = await _server(handler_of)
    async with server:
        client = Upstream(max_connections=4, max_keepalive=4)
        r = await client.post(server.url, b"{}", {}, connect_timeout=1)
        assert await r.read() == b"all of it"
        r.close()
        assert client.open_connections == 0
        await client.close()


async def test_refused_connection_is_connect_failed() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = Upstream(max_connections=4, max_keepalive=4)
    with pytest.raises(ConnectFailed):
        await client.post(f"http://127.0.0.1:{port}/x", b"{}", {}, connect_timeout=1)
    assert client.open_connections == 0


async def test_server_closing_before_or_during_the_response_is_connection_broken() -> None:
    def handler_of(s: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            body = await s.read_request(reader)
            if body == b"mid":
                writer.write(OK_HEAD + b"content-length: 100\r\n\r\nonly part")
                await writer.drain()
            if body == b"garbage":
                writer.write(b"NOT HTTP AT ALL\r\n\r\n")
                await writer.drain()

        return handler

    server = await _server(handler_of)
    async with server:
        client = Upstream(max_connections=4, max_keepalive=4)
        with pytest.raises(ConnectionBroken):
            await client.post(server.url, b"before", {}, connect_timeout=1)
        r = await client.post(server.url, b"mid", {}, connect_timeout=1)
        with pytest.raises(ConnectionBroken):
            await r.read()
        r.close()
        with pytest.raises(ConnectionBroken):
            await client.post(server.url, b"garbage", {}, connect_timeout=1)
        await asyncio.sleep(0.05)
        assert client.open_connections == 0
        await client.close()


async def test_connections_are_capped_and_a_request_past_the_cap_waits_for_one() -> None:
    release = asyncio.Event()

    def handler_of(s: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while await s.read_request(reader) is not None:
                await release.wait()
                writer.write(OK_HEAD + b"content-length: 2\r\n\r\nok")
                await writer.drain()

        return handler

    server = await _server(handler_of)
    async with server:
        client = Upstream(max_connections=2, max_keepalive=2)

        async def one() -> bytes:
            r = await client.post(server.url, b"{}", {}, connect_timeout=1)
            try:
                return await r.read()
            finally:
                r.close()

        tasks = [asyncio.create_task(one()) for _ in range(3)]
        await asyncio.sleep(0.1)
        assert server.connections == 2 and len(server.requests) == 2  # the third waits for a connection
        release.set()
        assert await asyncio.gather(*tasks) == [b"ok"] * 3
        assert server.connections == 2 and len(server.requests) == 3
        await client.close()


async def test_idle_connections_beyond_max_keepalive_or_past_their_time_are_closed() -> None:
    server = await _server(lambda s: echo(lambda: s))
    async with server:
        client = Upstream(max_connections=8, max_keepalive=1, keepalive_s=0.2)

        async def one() -> None:
            r = await client.post(server.url, b"{}", {}, connect_timeout=1)
            await r.read()
            await asyncio.sleep(0.02)  # both in flight at once
            r.close()

        await asyncio.gather(one(), one())
        await asyncio.sleep(0.05)
        assert server.connections == 2
        assert client.open_connections == 1  # only one kept idle
        await one()
        assert server.connections == 2  # reused
        await asyncio.sleep(0.3)
        await one()
        assert server.connections == 3  # the idle one had expired
        await client.close()


async def test_a_slow_reader_pauses_the_backend_socket_and_loses_nothing() -> None:
    size = 4 << 20

    def handler_of(s: Server) -> Handler:
        async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await s.read_request(reader)
            writer.write(OK_HEAD + b"content-length: %d\r\n\r\n" % size)
            writer.write(bytes(range(256)) * (size // 256))
            await writer.drain()

        return handler

    server = await _server(handler_of)
    async with server:
        client = Upstream(max_connections=2, max_keepalive=2)
        r = await client.post(server.url, b"{}", {}, connect_timeout=1)
        await asyncio.sleep(0.2)  # the backend writes while nobody reads
        assert sum(len(c) for c in r.chunks) < size  # paused: not all of it buffered here
        body = await r.read()
        assert body == bytes(range(256)) * (size // 256)
        r.close()
        await client.close()


async def test_a_header_value_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    server = await _server(lambda s: echo(lambda: s))
    async with server:
        client = Upstream(max_connections=2, max_keepalive=2)
        with pytest.raises(ValueError, match="line break"):
            await client.post(server.url, b"{}", {"x-request-id": "a\r\nx-evil: 1"}, connect_timeout=1)
        assert server.connections == 0
        await client.close()
