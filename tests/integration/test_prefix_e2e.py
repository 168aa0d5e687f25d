"""Prefix caches end to end: a gateway in front of simulated SGLang engines running their radix cache with
--enable-cache-report. A conversation's later turns go where its earlier turns are cached, the engines
report the cached prefix, and /admin/state shows each backend's index and hit rates."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.integration.test_admission_e2e import ADMIN, IMAGES, MODEL, Stack, stack, wait_ready

pytestmark = pytest.mark.e2e
__all__ = ["stack"]  # the fixture, shared with the admission tests

SYSTEM = {"role": "system", "content": "You answer questions about pictures, briefly. " * 20}


async def _turn(client: httpx.AsyncClient, gw: str, messages: list[dict[str, Any]]) -> tuple[str, str, int]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8}
    resp = await client.post(gw + "/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    return resp.headers["x-omnigate-backend"], answer["choices"][0]["message"]["content"], cached


async def _conversation(client: httpx.AsyncClient, gw: str, n: int) -> list[tuple[str, int]]:
    """Three turns, the picture in the first; the backend and the engine's cached tokens of each."""
    messages: list[dict[str, Any]] = [
        SYSTEM,
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": IMAGES[n % 2]}},
                {"type": "text", "text": f"Conversation {n}: what is in it?"},
            ],
        },
    ]
    out = []
    for follow_up in ("Which colour?", "Anything else?", None):
        backend, text, cached = await _turn(client, gw, messages)
        out.append((backend, cached))
        if follow_up is not None:
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": follow_up}]
    return out


async def test_a_conversation_stays_where_its_prefix_is_cached_and_the_engines_report_it(
    stack: Stack,
) -> None:
    sims = [
        stack.sim(seed=s, time_scale=20, radix_cache=True, enable_cache_report=True).url for s in (1, 2, 3)
    ]
    gw = stack.gateway([{"name": "interactive", "backends": sims}])
    await wait_ready(gw)
    async with httpx.AsyncClient(timeout=30) as client:
        runs = await asyncio.gather(*(_conversation(client, gw, n) for n in range(4)))
        state = (await client.get(gw + "/admin/state", headers=ADMIN)).json()
    for turns in runs:
        assert len({backend for backend, _ in turns}) == 1  # the later turns went where the first did
        assert all(cached > 0 for _, cached in turns[1:])  # and found their earlier turns there
    indexes = [b["prefix_index"] for b in state["pools"]["interactive"]["backends"]]
    assert sum(i["requests"] for i in indexes) == 12
    assert sum(i["hits"] for i in indexes) >= 8  # every later turn was predicted to hit
    warm = [i for i in indexes if i["requests"]]
    assert all(i["chunks"] > 0 and i["tokens"] <= i["capacity_tokens"] for i in warm)
    assert all(i["engine_token_share"] is not None and i["engine_token_share"] > 0 for i in warm)
