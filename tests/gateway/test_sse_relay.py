"""SSERelay on its own: byte-exact output and the same findings whatever the chunking or JSON spelling."""

from __future__ import annotations

import json

import pytest

from gateway.relay.sse import SSERelay
from tests.support.fake_sglang import chunk, expected_stream

USAGE = {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}


def _spaced(stream: bytes) -> bytes:
    """The same events re-serialised with json.dumps' default `": "` spacing (the parse-everything path)."""
    out = []
    for event in stream.split(b"\n\n")[:-1]:
        payload = event[len(b"data: ") :]
        out.append(event if payload == b"[DONE]" else b"data: " + json.dumps(json.loads(payload)).encode())
    return b"\n\n".join(out) + b"\n\n"


def _splits(data: bytes) -> dict[str, list[bytes]]:
    events = [e + b"\n\n" for e in data.split(b"\n\n")[:-1]]
    return {
        "whole": [data],
        "per event": events,
        "per byte": [data[i : i + 1] for i in range(len(data))],
        "odd": [data[i : i + 37] for i in range(0, len(data), 37)],
    }


def _relay(pieces: list[bytes], strip: bool) -> tuple[bytes, SSERelay]:
    relay = SSERelay(strip)
    out = b"".join(relay.feed(piece, float(i)) for i, piece in enumerate(pieces)) + relay.flush()
    return out, relay


@pytest.mark.parametrize("spelling", ["compact", "spaced"])
@pytest.mark.parametrize("split", ["whole", "per event", "per byte", "odd"])
def test_usage_chunk_stripped_and_findings_recorded(spelling, split):
    spell = _spaced if spelling == "spaced" else (lambda b: b)
    upstream = spell(expected_stream("c1", "m", 4, True, 7))
    out, relay = _relay(_splits(upstream)[split], strip=True)
    assert out == spell(expected_stream("c1", "m", 4, False, 7))
    assert relay.usage == USAGE
    assert relay.done and relay.error is None
    assert relay.content_chunks == 4


@pytest.mark.parametrize("split", ["whole", "per event", "odd"])
def test_client_asked_for_usage_gets_every_byte(split):
    upstream = expected_stream("c1", "m", 4, True, 7)
    out, relay = _relay(_splits(upstream)[split], strip=False)
    assert out == upstream
    assert relay.usage == USAGE and relay.content_chunks == 4


def test_token_times_follow_content_chunks_only():
    events = [
        chunk("c", "m", {"role": "assistant", "content": ""}),
        chunk("c", "m", {"content": "a"}),
        chunk("c", "m", {"content": ""}),
        chunk("c", "m", {"content": "b"}),
        chunk("c", "m", {"reasoning_content": "r"}),
        chunk("c", "m", {"content": None}, finish="stop"),
    ]
    relay = SSERelay(strip_usage=False)
    for i, event in enumerate(events):
        assert relay.feed(event, float(i)) == event
    assert (relay.first_token_at, relay.last_token_at, relay.content_chunks) == (1.0, 4.0, 3)
    assert not relay.done


def test_look_alike_text_inside_content_does_not_fool_the_byte_checks():
    tricky = '"usage":{"prompt_tokens":1} "error":{} "finish_reason":"stop"'
    events = [chunk("c", "m", {"content": "a"}), chunk("c", "m", {"content": tricky})]
    relay = SSERelay(strip_usage=True)
    out = b"".join(relay.feed(e, 0.0) for e in events)
    assert out == b"".join(events)
    assert relay.content_chunks == 2 and relay.usage is None and relay.error is None


def test_error_event_mid_stream_is_recorded_and_forwarded():
    error = b'data: {"error":{"message":"boom","code":500}}\n\n'
    events = [chunk("c", "m", {"content": "a"}), error, b"data: [DONE]\n\n"]
    out, relay = _relay(events, strip=True)
    assert out == b"".join(events)
    assert relay.error == {"message": "boom", "code": 500} and relay.done


def test_incomplete_tail_is_held_then_flushed_unchanged():
    relay = SSERelay(strip_usage=True)
    assert relay.feed(b'data: {"x":', 0.0) == b""
    assert relay.flush() == b'data: {"x":'
