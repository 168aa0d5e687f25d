"""Shared test tools: a fake clock, a real webhook receiver on loopback, sinks that refuse or never answer."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.support.servers import serve
from tests.support.sockets import silent_url as hung_url


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Receiver:
    """Records every POST body by path; `script[path]` lists responses to give before answering 200."""

    url: str = ""
    received: list[tuple[str, Any]] = field(default_factory=list)
    script: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, path: str) -> list[Any]:
        with self.lock:
            return [body for p, body in self.received if p == path]

    async def wait_for(self, path: str, count: int) -> list[Any]:
        """Bounded wait until `count` bodies reached `path` (delivery is asynchronous by design)."""
        await eventually(lambda: len(self.bodies(path)) >= count)
        return self.bodies(path)


async def eventually(predicate: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Poll a condition another thread or task makes true; fail (not hang) past `limit_s`."""
    with anyio.fail_after(limit_s):
        while not predicate():  # noqa: ASYNC110 - set from the receiver's thread, no event to await
            await anyio.sleep(0.01)


def _app(rx: Receiver) -> Starlette:
    async def hook(request: Request) -> Response:
        path = request.url.path
        body = await request.json()
        with rx.lock:
            rx.received.append((path, body))
            queued = rx.script.get(path)
            status, reply = queued.pop(0) if queued else (200, None)
        if path.startswith("/slack"):
            return PlainTextResponse("ok" if status == 200 else "invalid_payload", status_code=status)
        if reply is None:
            reply = {"errcode": 0, "errmsg": "ok"}
        return JSONResponse(reply, status_code=status)

    return Starlette(routes=[Route("/{name:path}", hook, methods=["POST"])])


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    rx = Receiver()
    with serve(_app(rx)) as server:
        rx.url = server.url
        yield rx


@pytest.fixture
def rx(receiver: Receiver) -> Receiver:
    """The module's receiver, emptied for this test."""
    with receiver.lock:
        receiver.received.clear()
        receiver.script.clear()
    return receiver


@pytest.fixture
def silent_url() -> Iterator[str]:
    with hung_url() as url:
        yield url


@pytest.fixture
def refused_url() -> str:
    """A loopback port nobody listens on: connection refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


Sleeps = list[float]


@pytest.fixture
def fast_sleep() -> tuple[Sleeps, Callable[[float], Any]]:
    """Backoff sleep that records the delays asked for and yields without waiting."""
    asked: Sleeps = []

    async def sleep(seconds: float) -> None:
        asked.append(seconds)
        await anyio.lowlevel.checkpoint()

    return asked, sleep
