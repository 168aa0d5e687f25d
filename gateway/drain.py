"""Graceful drain: what a replica does between SIGTERM and its exit.

On `begin()` the replica stops taking work but keeps its listener open: `/readyz` answers 503 at once (the
load balancer stops sending), every new request and every request still waiting in a queue gets a 503
`shutting_down` with `Retry-After` (an answer, never a cut connection: the client retries elsewhere), and
the requests already on a backend run to their end. The server (gateway/server.py) exits once none is
left, or when `shutdown.drain_s` has passed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import anyio

from gateway.errors import ApiError, ErrorCode

log = logging.getLogger("omnigate")

RETRY_AFTER_S = 1.0  # by then the load balancer has seen /readyz fail and sends the retry elsewhere


def shutting_down() -> ApiError:
    return ApiError(
        503,
        "The gateway is shutting down; retry the request (another replica will take it).",
        code=ErrorCode.SHUTTING_DOWN,
        retry_after=RETRY_AFTER_S,
        headers={"connection": "close"},  # the client's next attempt opens a connection elsewhere
    )


class Drain:
    """Serving until `begin()`, draining after it; counts the requests a drain waits for."""

    def __init__(self) -> None:
        self.draining = False
        self.requests = 0  # completion requests inside the gateway, queued or running
        self._waiting: set[anyio.CancelScope] = set()

    def begin(self) -> None:
        """Stop taking work; answer every queued request at once. Safe to call twice."""
        if self.draining:
            return
        self.draining = True
        queued = len(self._waiting)
        log.warning("draining: %d request(s) running, %d queued", self.requests - queued, queued)
        for scope in self._waiting:
            scope.cancel()

    @property
    def done(self) -> bool:
        return self.draining and self.requests == 0

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Around one request's whole life in the gateway (what the drain waits for)."""
        self.requests += 1
        try:
            yield
        finally:
            self.requests -= 1

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise shutting_down()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a wait for a backend: a drain that begins meanwhile ends it with `shutting_down`."""
        self.refuse_if_draining()
        with anyio.CancelScope() as scope:
            self._waiting.add(scope)
            try:
                yield
            finally:
                self._waiting.discard(scope)
        if scope.cancelled_caught:
            raise shutting_down()
