"""Converting a chat request's media between OpenAI content parts and sglang-omni's top-level lists."""

from __future__ import annotations

import copy
from typing import Any

import orjson

from gateway.backends.kinds import adapter_for
from gateway.backends.kinds.shapes import to_content_parts, to_media_lists
from gateway.settings.config import PoolConfig


def _parts_body() -> dict[str, Any]:
    return {
        "model": "m",
        "images": ["https://example.invalid/already.png"],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"},
                    },
                    {"type": "text", "text": "Compare these."},
                    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "mp3"}},
                    {"type": "audio_url", "audio_url": {"url": "https://a.invalid/b.wav"}},
                ],
            },
            {"role": "assistant", "content": "Sure."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "And this"},
                    {"type": "video_url", "video_url": {"url": "https://v.invalid/c.mp4", "duration": 4}},
                    {"type": "text", "text": "clip?"},
                ],
            },
        ],
    }


def test_parts_move_to_the_lists_and_contents_become_their_text() -> None:
    body = _parts_body()
    to_media_lists(body)
    assert body == {
        "model": "m",
        "images": ["https://example.invalid/already.png", "data:image/png;base64,AAAA"],
        "audios": ["data:audio/mp3;base64,UklGRg==", "https://a.invalid/b.wav"],
        "videos": ["https://v.invalid/c.mp4"],
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Compare these."},
            {"role": "assistant", "content": "Sure."},
            {"role": "user", "content": "And this\nclip?"},
        ],
    }
    again = copy.deepcopy(body)
    to_media_lists(again)
    assert again == body  # a retry converts nothing twice


def test_list_items_become_parts_of_the_last_user_message_before_its_text() -> None:
    body = {
        "model": "m",
        "audios": ["data:audio/wav;base64,UklGRg=="],
        "images": ["https://i.invalid/a.png", "/srv/b.png"],
        "videos": ["https://v.invalid/c.mp4"],
        "messages": [
            {"role": "user", "content": "first"},
            {"role": "user", "content": "What do you see and hear?"},
            {"role": "assistant", "content": "Let me look."},
        ],
    }
    to_content_parts(body)
    assert body == {
        "model": "m",
        "messages": [
            {"role": "user", "content": "first"},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "https://i.invalid/a.png"}},
                    {"type": "image_url", "image_url": {"url": "/srv/b.png"}},
                    {"type": "video_url", "video_url": {"url": "https://v.invalid/c.mp4"}},
                    {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,UklGRg=="}},
                    {"type": "text", "text": "What do you see and hear?"},
                ],
            },
            {"role": "assistant", "content": "Let me look."},
        ],
    }


def test_list_items_join_a_content_that_is_already_parts() -> None:
    text = {"type": "text", "text": "Which?"}
    body = {"model": "m", "images": ["a"], "messages": [{"role": "user", "content": [text]}]}
    to_content_parts(body)
    assert body["messages"][0]["content"] == [{"type": "image_url", "image_url": {"url": "a"}}, text]


def test_a_request_without_media_is_left_as_it_is() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for convert in (to_media_lists, to_content_parts):
        convert(body)
        assert body == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _payload(kind: str, body: dict[str, Any], **omni: str) -> dict[str, Any]:
    pool = {"name": "p", "kind": kind, "models": ["m"], "backends": ["http://b:1"]}
    if omni:
        pool["sglang_omni"] = omni
    parsed: dict[str, Any] = orjson.loads(adapter_for(PoolConfig.model_validate(pool)).payload(body, 0))
    return parsed


def test_each_kind_sends_the_shape_its_server_reads() -> None:
    snapshot = _payload("sglang-omni", _parts_body(), version="snapshot")
    assert [m["content"] for m in snapshot["messages"]] == [
        "Be brief.",
        "Compare these.",
        "Sure.",
        "And this\nclip?",
    ]
    assert (len(snapshot["images"]), len(snapshot["audios"]), len(snapshot["videos"])) == (2, 2, 1)
    later = _payload("sglang-omni", _parts_body(), version="later")
    assert later == _parts_body()  # it reads both shapes
    plain = _payload("sglang", _parts_body())
    assert "images" not in plain
    assert plain["messages"][3]["content"][0] == {
        "type": "image_url",
        "image_url": {"url": "https://example.invalid/already.png"},
    }
