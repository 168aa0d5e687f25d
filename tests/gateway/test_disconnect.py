"""How a completion learns its client left: the edge protocol's hook, or `http.disconnect` elsewhere."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http.disconnect import EXTENSION, DisconnectHook, watch

pytestmark = pytest.mark.unit


def hooked() -> tuple[dict[str, Any], DisconnectHook]:
    hook = DisconnectHook()
    return {"type": "http", "extensions": {EXTENSION: {"hook": hook}}}, hook


async def never() -> dict[str, Any]:
    raise AssertionError("the hook's scope never reads `receive`")


async def test_the_hook_calls_back_once_when_the_connection_is_lost() -> None:
    scope, hook = hooked()
    left: list[int] = []
    watch(scope, never, lambda: left.append(1))
    hook.fire()
    hook.fire()
    assert left == [1]


async def test_a_connection_lost_before_the_watch_began_is_told_at_once() -> None:
    scope, hook = hooked()
    hook.fire()
    left: list[int] = []
    watch(scope, never, lambda: left.append(1))
    assert left == [1]


async def test_stopped_the_hook_calls_nothing() -> None:
    scope, hook = hooked()
    left: list[int] = []
    watch(scope, never, lambda: left.append(1))()
    hook.fire()
    assert left == []


async def test_without_the_hook_a_task_waits_for_http_disconnect() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    left: list[int] = []
    watch({"type": "http"}, messages.get, lambda: left.append(1))
    await messages.put({"type": "http.request", "body": b"", "more_body": False})
    await asyncio.sleep(0)
    assert left == []
    await messages.put({"type": "http.disconnect"})
    for _ in range(3):
        await asyncio.sleep(0)
    assert left == [1]


async def test_stopped_the_task_is_cancelled() -> None:
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    left: list[int] = []
    watch({"type": "http"}, messages.get, lambda: left.append(1))()
    await messages.put({"type": "http.disconnect"})
    for _ in range(3):
        await asyncio.sleep(0)
    assert left == []
