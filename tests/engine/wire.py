"""What the engine tier reads off an SGLang server: SSE events, Prometheus samples, a long stream held open.

Kept raw on purpose (httpx, the prometheus parser): the contract is about the bytes and series a server
emits, not about what a client library makes of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.support.engine import SERVED_MODEL

PROMPT = "Tell me a long story about a lighthouse."
LONG = 3000  # max_tokens of a request meant to be cut: it never ends by itself within a test


def chat_body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


def parse_sse(raw: bytes) -> list[Any]:
    """Each event's payload ("[DONE]" kept as the string); asserts SSE framing: `data: …` + blank line."""
    text = raw.decode()
    assert text.endswith("\n\n"), f"the stream does not end with a blank line: {text[-80:]!r}"
    events = text[:-2].split("\n\n")
    out: list[Any] = []
    for event in events:
        assert event.startswith("data: ") and "\n" not in event, f"not one data line: {event!r}"
        data = event[len("data: ") :]
        out.append(data if data == "[DONE]" else orjson.loads(data))
    return out


def stream_chat(url: str, body: dict[str, Any]) -> list[Any]:
    with httpx.stream(
        "POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120, trust_env=False
    ) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return parse_sse(resp.read())


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def scrape(url: str) -> Samples:
    return samples(httpx.get(url + "/metrics", timeout=10.0, trust_env=False).text)


def names(found: Samples) -> set[str]:
    return {name for name, _ in found}


def value(found: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over the series whose labels include `labels` (0 when there is none)."""
    want = set(labels.items())
    return math.fsum(v for (n, lab), v in found.items() if n == name and want <= lab)


def loads(url: str) -> dict[str, Any]:
    resp = httpx.get(url + "/v1/loads", timeout=10.0, trust_env=False)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


@dataclass
class OpenStream:
    """A streamed chat held open: its events so far, and whether it ended by itself."""

    events: list[Any] = field(default_factory=list)
    status: int | None = None
    ended: bool = False
    first_token: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def tokens(self) -> int:
        return sum(1 for e in self.events if _content(e))


def _content(event: Any) -> bool:
    if not isinstance(event, dict) or not event.get("choices"):
        return False
    return bool(event["choices"][0].get("delta", {}).get("content"))


async def _read(client: httpx.AsyncClient, url: str, body: dict[str, Any], held: OpenStream) -> None:
    async with client.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}) as resp:
        held.status = resp.status_code
        buffer = b""
        async for chunk in resp.aiter_bytes():
            buffer += chunk
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = event.decode().removeprefix("data: ")
                held.events.append(data if data == "[DONE]" else orjson.loads(data))
                if _content(held.events[-1]):
                    held.first_token.set()
    held.ended = True


@contextlib.asynccontextmanager
async def open_stream(url: str, body: dict[str, Any]) -> AsyncIterator[tuple[OpenStream, asyncio.Task[None]]]:
    """Start a streamed chat in the background; leaving the block closes its connection (a client
    disconnect) unless it has ended. Yields the stream's record and its reader task (cancel = disconnect)."""
    held = OpenStream()
    async with httpx.AsyncClient(timeout=120, trust_env=False) as client:
        task = asyncio.create_task(_read(client, url, body, held))
        try:
            yield held, task
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await task


async def wait_until(probe: Any, within: float = 60.0, interval: float = 0.1) -> Any:
    """Poll a sync `probe` in a thread until it returns something truthy; its value."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        got = await asyncio.to_thread(probe)
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached in {within} s; last: {got!r}")
        await asyncio.sleep(interval)


async def wait_for(probe: Any, want: Any, within: float = 60.0) -> None:
    """Poll a sync `probe` until it returns `want`; the failure names the last value it returned."""
    seen: list[Any] = []

    def check() -> bool:
        seen.append(probe())
        return bool(seen[-1] == want)

    try:
        await wait_until(check, within)
    except AssertionError:
        raise AssertionError(f"wanted {want!r} within {within} s; last seen {seen[-1]!r}") from None


CAP = 2  # --max-running-requests of every engine of the tier


def running_waiting(url: str) -> tuple[int, int]:
    load = loads(url)["loads"][0]
    return load["num_running_reqs"], load["num_waiting_reqs"]


async def occupy(
    stack: contextlib.AsyncExitStack, url: str, waiting: int, priority: int = 0
) -> list[tuple[OpenStream, asyncio.Task[None]]]:
    """Fill the running batch, then queue `waiting` more, one at a time (sent together, the engine may
    count requests it has not admitted yet against the queue limit and refuse one)."""
    held = []
    for n in range(CAP + waiting):
        held.append(await stack.enter_async_context(open_stream(url, chat_body(LONG, priority=priority))))
        await wait_for(lambda: running_waiting(url), (min(n + 1, CAP), max(0, n + 1 - CAP)))
    return held
