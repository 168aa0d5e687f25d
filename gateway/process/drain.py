"""Graceful drain: what a replica does between SIGTERM and its exit.

On `begin()` the replica stops taking work but keeps its listener open: `/readyz` answers 503 at once (the
load balancer stops sending), every new request and every request still waiting in a queue gets a 503
`shutting_down` with `Retry-After` (an answer, never a cut connection: the client retries elsewhere), and
the requests already on a backend run to their end. The server (gateway/http/server.py) exits once none is
left, or when `shutdown.drain_s` has passed.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

import anyio

from gateway.request.errors import ApiError, ErrorCode

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
        self._waiting: set[_Waiting] = set()
        self._counted = _Counted(self)

    def begin(self) -> None:
        """Stop taking work; answer every queued request at once. Safe to call twice."""
        if self.draining:
            return
        self.draining = True
        queued = len(self._waiting)
        log.warning("draining: %d request(s) running, %d queued", self.requests - queued, queued)
        for wait in self._waiting:
            wait.drained = True
            wait.scope.cancel()

    @property
    def done(self) -> bool:
        return self.draining and self.requests == 0

    def request(self) -> _Counted:
        """Around one request's whole life in the gateway (what the drain waits for)."""
        return self._counted

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise shutting_down()

    def waiting(self, scope: anyio.CancelScope) -> _Waiting:
        """Around a wait for a backend inside the request's `scope`: a drain that begins meanwhile cancels
        the scope and the wait ends with `shutting_down`. (The request's scope, not one of the wait's own:
        a cancel scope per request costs ~2 % of a whole request's CPU.)"""
        return _Waiting(self, scope)


# Plain context managers, not @contextmanager generators: both are entered on every request, and a
# generator-based one costs a generator and a wrapper object per entry.
class _Counted:
    __slots__ = ("_drain",)

    def __init__(self, drain: Drain) -> None:
        self._drain = drain

    def __enter__(self) -> None:
        self._drain.requests += 1

    def __exit__(self, *exc: object) -> None:
        self._drain.requests -= 1


class _Waiting:
    __slots__ = ("_drain", "drained", "scope")

    def __init__(self, drain: Drain, scope: anyio.CancelScope) -> None:
        self._drain = drain
        self.scope = scope
        self.drained = False

    def __enter__(self) -> None:
        self._drain.refuse_if_draining()
        self._drain._waiting.add(self)

    def __exit__(
        self, etype: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._drain._waiting.discard(self)
        if self.drained and etype is not None and issubclass(etype, asyncio.CancelledError):
            raise shutting_down() from None  # the drain cancelled this wait
