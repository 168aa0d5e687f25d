"""Multi-turn conversations for the scheduling benchmark's `multiturn` scenario.

A conversation opens with one of a few shared system prompts and a user turn carrying one or two pictures
of its own; every later turn resends the whole history (its pictures included) with the answer it got and
a new question, after a think time. Conversations arrive as a Poisson process; each runs its turns in
order, a refused or failed turn ends it (its user gave up). Times in the plan are the simulated engine's
seconds; the driver divides them by the time scale.
"""

from __future__ import annotations

import asyncio
import base64
import io
import random
import time
from dataclasses import dataclass
from typing import Any

from PIL import Image

from loadtest.client import PreparedRequest, send
from loadtest.http import HttpPool
from loadtest.records import RequestRecord

SYSTEMS = [
    f"You are assistant #{i}. Look at the user's pictures carefully and answer in plain words; "
    + "keep answers short, say what you are unsure of, never invent details. " * 8
    for i in range(3)
]
WORDS = (
    "what",
    "where",
    "which",
    "colour",
    "shape",
    "size",
    "left",
    "right",
    "near",
    "far",
    "count",
    "other",
)


@dataclass(frozen=True, slots=True)
class Conversation:
    start: float  # simulated seconds from the run's start
    system: str
    images: tuple[str, ...]  # data URLs, sent with the first user turn
    questions: tuple[str, ...]  # one per turn
    max_tokens: tuple[int, ...]
    think_s: tuple[float, ...]  # before each turn after the first


def _picture(rng: random.Random) -> str:
    """A PNG of a phone-photo size (its tokens come from its dimensions) and colour of its own."""
    w, h = rng.choice([(1024, 768), (1280, 960), (960, 1280), (800, 600)])
    colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
    buf = io.BytesIO()
    Image.new("RGB", (w, h), colour).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _question(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 150))) + "?"


def plan(seed: int, rate: float, duration: float, think_s: float, max_tokens: int) -> list[Conversation]:
    """Conversations arriving at `rate` per simulated second for `duration`: 3–10 turns, 1–2 pictures in
    the first, questions of 30–150 words, answers capped near `max_tokens` (lognormal), exponential think
    times of mean `think_s`."""
    rng = random.Random(seed)
    out: list[Conversation] = []
    t = rng.expovariate(rate)
    while t < duration:
        turns = rng.randint(3, 10)
        out.append(
            Conversation(
                start=t,
                system=rng.choice(SYSTEMS),
                images=tuple(_picture(rng) for _ in range(rng.randint(1, 2))),
                questions=tuple(
                    " ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 150))) + "?"
                    for _ in range(turns)
                ),
                max_tokens=tuple(
                    max(16, min(4 * max_tokens, round(rng.lognormvariate(0, 0.6) * max_tokens)))
                    for _ in range(turns)
                ),
                think_s=tuple(rng.expovariate(1 / think_s) for _ in range(turns)),
            )
        )
        t += rng.expovariate(rate)
    return out


def _answer(turn: int, tokens: int) -> str:
    """The assistant's answer as the next turn resends it (about `tokens` tokens)."""
    return " ".join(f"a{turn}" for _ in range(max(1, tokens)))


async def drive(
    url: str, model: str, conversations: list[Conversation], k: float, api_key: str, timeout_s: float
) -> list[RequestRecord]:
    """Run every conversation against `url` on a clock `k` times faster than the plan's; every turn's
    record (times in wall seconds from the run's start, bucket "turn<n>")."""
    pool = HttpPool(url)
    records: list[RequestRecord] = []
    origin = time.perf_counter()

    async def one(c: Conversation) -> None:
        await asyncio.sleep(max(0.0, origin + c.start / k - time.perf_counter()))
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in c.images]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": c.system},
            {"role": "user", "content": [*parts, {"type": "text", "text": c.questions[0]}]},
        ]
        for turn, question in enumerate(c.questions):
            if turn:
                await asyncio.sleep(c.think_s[turn] / k)
                messages.append({"role": "user", "content": question})
            body = {
                "model": model,
                "messages": messages,
                "max_tokens": c.max_tokens[turn],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            req = PreparedRequest(body, {"authorization": f"Bearer {api_key}"}, bucket=f"turn{turn + 1}")
            rec = RequestRecord(scheduled=time.perf_counter() - origin)
            records.append(await send(pool, req, rec, origin, timeout_s))
            if not rec.ok:
                return
            messages.append({"role": "assistant", "content": _answer(turn, rec.output_tokens)})

    try:
        await asyncio.gather(*(one(c) for c in conversations))
    finally:
        await pool.aclose()
    return records
