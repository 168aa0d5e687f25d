"""Run a real uvicorn server on a free loopback port in a background thread, for integration tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from loadtest.ports import free_port


class ServerThread:
    """A uvicorn server bound to 127.0.0.1 on its own event loop in a daemon thread."""

    def __init__(self, app: Any, port: int | None = None, **kwargs: Any) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=2,
            **kwargs,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 10.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("server thread exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@contextmanager
def serve(app: Any, **kwargs: Any) -> Iterator[ServerThread]:
    server = ServerThread(app, **kwargs).start()
    try:
        yield server
    finally:
        server.stop()
