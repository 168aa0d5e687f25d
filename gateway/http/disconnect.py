"""How a completion learns that its client left: from the connection itself under omnigate's own server,
from `http.disconnect` under any other.

Under `omnigate serve` the edge protocol (gateway/http/edge.py) puts a `DisconnectHook` in each request's
scope and fires it when the connection is lost before the response completed, so a request pays no task
of its own to wait for the disconnect (a task per request, started and cancelled, cost ~4 % of a whole
request's CPU). Any other ASGI server gets a task that waits for `http.disconnect` on `receive`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from starlette.types import Receive, Scope

EXTENSION = "omnigate.disconnect"  # scope["extensions"][EXTENSION]["hook"]: the request's hook


class DisconnectHook:
    """Calls what a request registered once its connection is lost before the response completed."""

    __slots__ = ("callback", "fired")

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None
        self.fired = False  # the connection is gone (perhaps before anything was registered)

    def fire(self) -> None:
        self.fired = True
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()

    def stop(self) -> None:
        self.callback = None


def watch(scope: Scope, receive: Receive, left: Callable[[], None]) -> Callable[[], object]:
    """Call `left` once when the client disconnects; returns how to stop watching."""
    extension = (scope.get("extensions") or {}).get(EXTENSION)
    hook = extension.get("hook") if extension else None
    if isinstance(hook, DisconnectHook):
        if hook.fired:
            left()
        else:
            hook.callback = left
        return hook.stop
    return asyncio.create_task(_wait(receive, left)).cancel


async def _wait(receive: Receive, left: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    left()
