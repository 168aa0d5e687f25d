"""The prefix index: a prompt's chunk chain (prefix_key.py) and what a backend is expected to hold
(prefix_index.py): longest prefix, LRU eviction under its token budget, deepest chunks first."""

from __future__ import annotations

import base64
from typing import Any

from gateway.backends.prefix_index import PrefixIndex
from gateway.backends.prefix_key import media_sample, prefix_key
from gateway.request.ticket import Cost, PrefixKey

SYSTEM = {"role": "system", "content": "You are helpful. " * 40}  # 680 characters: two chunks of 512


def _image(seed: int) -> dict[str, Any]:
    data = base64.b64encode(bytes([seed]) * 3000 + bytes(range(256)) * 10).decode()
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}


def _chat(*messages: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "messages": [SYSTEM, *messages]}


def _key(body: dict[str, Any], text: int = 1000, vision: int = 0, session: str | None = None) -> PrefixKey:
    return prefix_key(body, "chat", Cost(text_tokens=text, vision_tokens=vision), 512, session)


TURN1 = [{"role": "user", "content": [_image(1), {"type": "text", "text": "What is this?"}]}]
TURN2 = [*TURN1, {"role": "assistant", "content": "A cat."}, {"role": "user", "content": "And its colour?"}]


def test_a_message_always_ends_a_chunk_and_media_is_one_chunk_each() -> None:
    key = _key(_chat(*TURN1), text=200, vision=800)
    # system: 2 chunks; user: its role piece, the image, its text
    assert len(key.keys) == 5
    assert key.tokens == 1000  # the whole priced prompt is spread over the chunks
    assert key.ends[3] - key.ends[2] == 800  # the image carries the media tokens


def test_a_later_turn_repeats_the_earlier_turns_chunks() -> None:
    one, two = _key(_chat(*TURN1)), _key(_chat(*TURN2))
    assert two.keys[: len(one.keys)] == one.keys
    assert two.keys[len(one.keys)] != one.keys[-1]
    other = _key(_chat({"role": "user", "content": [_image(2), {"type": "text", "text": "What is this?"}]}))
    assert other.keys[:2] == one.keys[:2] and other.keys[3] != one.keys[3]  # same system, another image


def test_the_session_is_the_first_message_after_the_system_prompt_or_the_header() -> None:
    one, two = _key(_chat(*TURN1)), _key(_chat(*TURN2))
    assert one.session is not None and one.session == two.session
    assert _key(_chat({"role": "user", "content": "hi"})).session != one.session
    assert _key(_chat(*TURN1), session="s-1").session == _key(_chat(*TURN2), session="s-1").session
    assert _key(_chat(*TURN1), session="s-1").session != one.session


def test_a_media_sample_tells_big_items_apart_by_their_content() -> None:
    a = "x" * 100_000
    assert len(media_sample(a)) < 2_000 and media_sample("short") == "short"
    assert media_sample(a) != media_sample(a + "z")  # length
    assert media_sample(a.replace("x", "w", 1)) != media_sample(a)  # the head


def test_match_is_the_longest_prefix_sent_before() -> None:
    index = PrefixIndex(10_000)
    one, two = _key(_chat(*TURN1)), _key(_chat(*TURN2))
    assert index.match(one) == 0 and index.match(None) == 0
    index.sent(one, 0, None)
    assert index.match(one) == one.tokens
    assert index.match(two) == two.ends[len(one.keys) - 1]
    hi = _key(_chat({"role": "user", "content": "hi"}))
    assert index.match(hi) == hi.ends[1]  # the system prompt, as this prompt's price weighs it


def test_eviction_keeps_the_budget_and_drops_the_oldest_chains_deepest_first() -> None:
    index = PrefixIndex(2000)
    bodies = [_chat({"role": "user", "content": f"question {i} " * 100}) for i in range(3)]
    keys = [_key(b) for b in bodies]  # 1000 tokens each, 383 of them the shared system prompt
    for k in keys:
        index.sent(k, 0, None)
    assert index.tokens <= 2000
    assert index.match(keys[2]) == keys[2].tokens  # the newest whole
    assert index.match(keys[0]) == keys[0].ends[2]  # the oldest lost its deepest chunks
    index.sent(keys[0], keys[0].ends[1], 1200)  # a smaller budget applies at once
    assert index.tokens <= 1200 and index.match(keys[0]) == keys[0].tokens
    assert index.match(keys[2]) == keys[2].ends[1]


def test_stats_count_predictions_and_the_engines_reports() -> None:
    index = PrefixIndex()
    key = _key(_chat(*TURN1), text=200, vision=800)
    index.sent(key, 0, None)
    index.sent(key, 600, None)
    index.reported(1000, 450)
    snap = index.snapshot()
    assert snap["chunks"] == len(key.keys) and snap["tokens"] == key.tokens
    assert (snap["requests"], snap["hits"], snap["hit_rate"]) == (2, 1, 0.5)
    assert snap["predicted_token_share"] == 0.3 and snap["engine_token_share"] == 0.45
