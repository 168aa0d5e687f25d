"""A prompt as the chain of chunks an engine's prefix cache would share with other prompts.

SGLang's radix cache matches a new prompt against the token sequences it holds, images as the hash of
their content (the multimodal pad values of its radix keys), so a request that repeats an earlier one's
messages (a system prompt, the earlier turns of a conversation and their images) prefills only the rest.
The gateway cannot tokenize as the engine does; it cuts the prompt into chunks it can compare cheaply:
each message's text in pieces of `chunk_chars` characters (a message always ends a chunk, so the same
message gives the same chunks whatever follows it), every media item one chunk named by a sample of its
content. Chunk `i`'s key hashes chunk `i` with key `i-1`, so equal keys mean equal prompts up to there.

Each chunk carries its share of the request's priced prompt: text by characters (of the priced text
tokens), a media item the priced media tokens over the items — an approximation, as is the whole index.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

from gateway.estimate.media_lists import media_list_items
from gateway.request.ticket import Cost, PrefixKey

MEDIA_PARTS = ("image_url", "input_audio", "audio_url", "video_url")
SAMPLE_EDGE = 512  # characters of a media item's head and tail that name it
SAMPLE_STRIDE = 256  # and about this many more, spread evenly over the rest


def media_sample(value: str) -> str:
    """What names a media item: its length, head, tail and an even sample of the rest. Hashing a whole
    multi-megabyte data URL per request would cost more than it tells; two different images agree on
    such a sample only by accident, and then a request is only placed as if it had a cached prefix."""
    if len(value) <= 2 * SAMPLE_EDGE + SAMPLE_STRIDE:
        return value
    middle = value[SAMPLE_EDGE : -SAMPLE_EDGE : (len(value) - 2 * SAMPLE_EDGE) // SAMPLE_STRIDE]
    return f"{len(value)}|{value[:SAMPLE_EDGE]}|{middle}|{value[-SAMPLE_EDGE:]}"


def _media_value(part: dict[str, Any], kind: str) -> str:
    spec = part.get(kind)
    if isinstance(spec, dict):
        value = spec.get("url", spec.get("data"))
        return value if isinstance(value, str) else repr(sorted(spec.items()))
    return spec if isinstance(spec, str) else ""


def _pieces(body: dict[str, Any], endpoint: str) -> Iterator[tuple[bool, str]]:
    """The prompt in order as (is_media, text): a text piece ends where a message (or prompt item) ends."""
    if endpoint == "chat":
        for message in body.get("messages") or ():
            if isinstance(message, dict):
                yield from _message_pieces(message)
    else:
        prompt = body.get("prompt", "")
        items = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        for item in items:
            yield False, item if isinstance(item, str) else repr(item)
    for item in media_list_items(body):
        yield True, media_sample(item.value)


def _message_pieces(message: dict[str, Any]) -> Iterator[tuple[bool, str]]:
    role, content = str(message.get("role", "")), message.get("content")
    if isinstance(content, str):
        yield False, f"{role}\x1e{content}"
    elif isinstance(content, list):
        yield False, role + "\x1e"
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                yield False, str(part.get("text", ""))
            elif kind in MEDIA_PARTS:
                yield True, media_sample(_media_value(part, kind))
    if message.get("tool_calls"):
        yield False, repr(message["tool_calls"])


def prefix_key(
    body: dict[str, Any], endpoint: str, cost: Cost, chunk_chars: int, session_id: str | None = None
) -> PrefixKey:
    """The chunk chain of a validated, priced request (`cost`: its price, spread over the chunks); its
    conversation is named by the client's `session_id` (`x-session-id`) when it sends one."""
    chunks: list[tuple[bool, str]] = []
    chars = media = 0
    for is_media, text in _pieces(body, endpoint):
        if is_media:
            chunks.append((True, text))
            media += 1
            continue
        chars += len(text)
        chunks.extend((False, text[i : i + chunk_chars]) for i in range(0, len(text), chunk_chars))
    per_char = cost.text_tokens / chars if chars else 0.0
    per_item = (cost.vision_tokens + cost.audio_tokens) / media if media else 0.0
    keys: list[bytes] = []
    ends: list[int] = []
    key, spent = b"", 0.0
    for is_media, text in chunks:
        key = _digest(key + (b"\x01" if is_media else b"\x00") + text.encode())
        spent += per_item if is_media else per_char * len(text)
        keys.append(key)
        ends.append(round(spent))
    session = _digest(session_id.encode()) if session_id else _session(body, endpoint)
    return PrefixKey(tuple(keys), tuple(ends), session)


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=8).digest()


def _session(body: dict[str, Any], endpoint: str) -> bytes | None:
    """The conversation's name: its first message after the system prompt (which many share)."""
    if endpoint != "chat":
        return None
    for message in body.get("messages") or ():
        if isinstance(message, dict) and message.get("role") not in ("system", "developer"):
            named = "\x1f".join(text for _, text in _message_pieces(message))
            return _digest(named.encode())
    return None
