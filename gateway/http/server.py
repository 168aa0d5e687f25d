"""The HTTP server `omnigate serve` runs: uvicorn, with a graceful drain between SIGTERM and the exit.

uvicorn on its own closes the listener at the first SIGTERM (clients get connection refused), gives
running requests `timeout_graceful_shutdown`, and re-raises the signal so the process ends by it. Here the
first SIGTERM (or Ctrl-C) starts the gateway's drain (gateway/process/drain.py) with the listener still open,
and the server shuts down once no request is left or `shutdown.drain_s` has passed; the process then exits 0.
A second signal is uvicorn's own: shut down now.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from types import FrameType

import uvicorn
from starlette.applications import Starlette

from gateway.http.edge import edge_protocol
from gateway.process.drain import Drain
from gateway.settings.config import LimitsConfig

log = logging.getLogger("omnigate")

CLOSE_GRACE_S = 2  # after the drain: for what is still open (a scrape, a stream past drain_s) to end


class GatewayServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Drain, drain_s: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.drain_s = drain_s
        self.drain_deadline: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A signal handler: the first signal starts the drain (on the loop, at once), a second one is
        uvicorn's immediate shutdown."""
        if self.drain_deadline is not None or self._loop is None or self.should_exit:
            super().handle_exit(sig, frame)
            return
        self.drain_deadline = time.monotonic() + self.drain_s
        self._loop.call_soon_threadsafe(self.drain.begin)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and (self.drain.done or time.monotonic() >= self.drain_deadline):
            if not self.drain.done:
                log.warning("drain: %.0f s are over; %d request(s) cut", self.drain_s, self.drain.requests)
            return True
        return await super().on_tick(counter)


def serve(
    app: Starlette,
    host: str,
    port: int,
    limits: LimitsConfig,
    drain: Drain,
    drain_s: float,
    sock: socket.socket | None = None,
) -> None:
    """Run `app` with the edge limits (gateway/http/edge.py) until a signal and its drain end it; on `sock`
    (a worker's shared port) if given, else on a socket of its own bound to (host, port)."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        loop="auto",
        http=edge_protocol(limits),
        timeout_keep_alive=limits.keepalive_timeout_s,
        timeout_graceful_shutdown=CLOSE_GRACE_S,
        # Nothing reads the client's address, so no X-Forwarded-* rewriting layer on every request; and
        # no `server: uvicorn` header telling the world what runs here.
        proxy_headers=False,
        server_header=False,
    )
    GatewayServer(config, drain, drain_s).run(sockets=None if sock is None else [sock])
