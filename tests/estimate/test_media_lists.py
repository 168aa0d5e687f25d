"""sglang-omni's top-level media lists are priced and bucketed like the same media sent as content parts."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.estimate.media_lists import ListItem, media_list_items
from gateway.request.media_urls import MediaUrlPolicy
from tests.estimate.helpers import b64, data_uri, image_bytes, image_part, wav_bytes
from tests.estimate.test_estimator import make, rejected

PNG = data_uri(image_bytes("PNG", 640, 480))
WAV = "data:audio/wav;base64," + b64(wav_bytes(2.5))
TEXT = {"type": "text", "text": "What is in these?"}
URLS = MediaUrlPolicy(
    allow=("v.invalid", "example.invalid", "a.invalid")
)  # the pool lets its engines fetch these


def _lists(**lists: Any) -> dict[str, Any]:
    return {"model": "qwen2.5-omni-7b", "messages": [{"role": "user", "content": TEXT["text"]}], **lists}


def _parts(*parts: Any) -> dict[str, Any]:
    return {"model": "qwen2.5-omni-7b", "messages": [{"role": "user", "content": [*parts, TEXT]}]}


@pytest.mark.parametrize(
    ("lists", "parts", "bucket"),
    [
        ({"images": [PNG]}, [image_part(PNG)], "single_image"),
        ({"images": [PNG, PNG]}, [image_part(PNG), image_part(PNG)], "multi_image"),
        ({"audios": [WAV]}, [{"type": "audio_url", "audio_url": {"url": WAV}}], "audio"),
        (
            {"videos": ["https://v.invalid/a.mp4"]},
            [{"type": "video_url", "video_url": {"url": "https://v.invalid/a.mp4"}}],
            "video",
        ),
    ],
)
def test_a_list_item_costs_what_the_same_content_part_costs(
    lists: dict[str, Any], parts: list[Any], bucket: str
) -> None:
    est = make()
    from_lists = est.estimate(_lists(**lists), endpoint="chat", tenant="t", urls=URLS)
    from_parts = est.estimate(_parts(*parts), endpoint="chat", tenant="t", urls=URLS)
    assert from_lists == from_parts
    assert from_lists[1] == bucket


def test_a_data_url_is_sized_from_its_header() -> None:
    cost, _ = make().estimate(_lists(images=[PNG], audios=[WAV]), endpoint="chat", tenant="t")
    assert (cost.vision_tokens, cost.audio_tokens) == (391 + 2, 62 + 2)  # 640×480 PNG; 2.5 s WAV
    assert (cost.images, cost.audios, cost.remote_media) == (1, 1, 0)


def test_allowed_urls_are_priced_from_the_policy_defaults_and_counted() -> None:
    body = _lists(
        images=["https://example.invalid/a.jpg", "https://example.invalid/b.png"],
        audios=["https://a.invalid/c.wav"],
        videos=["https://v.invalid/d.mp4"],
    )
    cost, bucket = make().estimate(body, endpoint="chat", tenant="t", urls=URLS)
    remote_video = {"type": "video_url", "video_url": {"url": "https://v.invalid/d.mp4"}}
    video = make().estimate(_parts(remote_video), endpoint="chat", tenant="t", urls=URLS)[0].vision_tokens
    assert cost.vision_tokens == 2 * (1225 + 2) + video  # remote_image_default_size 1024×1024
    assert cost.audio_tokens == 250 + 2  # audio_default_seconds 10 s at ~25 tokens/s
    assert (cost.remote_media, bucket) == (4, "video")


@pytest.mark.parametrize(
    "value", ["/srv/media/b.png", "file:///srv/media/c.wav", "https://other.invalid/x.png"]
)
def test_a_list_item_passes_the_pools_media_url_policy_like_a_part(value: str) -> None:
    error = rejected(make(), _lists(images=[PNG, value]))
    assert (error.param, error.code) == ("images[1]", "media_url_not_allowed")


def test_both_shapes_in_one_request_add_up_and_share_the_limits() -> None:
    est = make(max_images_per_request=2)
    cost, _ = est.estimate({**_parts(image_part(PNG)), "images": [PNG]}, endpoint="chat", tenant="t")
    assert (cost.images, cost.vision_tokens) == (2, 2 * (391 + 2))
    error = rejected(est, {**_parts(image_part(PNG)), "images": [PNG, PNG]})
    assert (error.param, error.code) == ("images[1]", "too_many_images")


@pytest.mark.parametrize(
    ("lists", "param", "message"),
    [
        ({"images": "a.png"}, "images", "images: must be a list of strings, got str"),
        ({"audios": [WAV, 5]}, "audios[1]", "audios[1]: must be a string, got int"),
        (
            {"images": [PNG, "data:image/png;base64,iVBORw0KGgo="]},
            "images[1]",
            "images[1]: invalid image: PNG image is truncated before its size",
        ),
        (
            {"audios": ["data:audio/wav,raw"]},
            "audios[0]",
            "audios[0]: invalid audio: data URI is not base64-encoded",
        ),
    ],
)
def test_a_bad_list_or_item_is_a_400_naming_it(lists: dict[str, Any], param: str, message: str) -> None:
    error = rejected(make(), _lists(**lists))
    assert (error.param, error.message) == (param, message)


def test_the_walk_gives_every_item_in_the_servers_order() -> None:
    body = {"audios": ["a0"], "images": ["i0", "i1"], "videos": ["v0"]}
    assert media_list_items(body) == [
        ListItem("images", "image", 0, "i0"),
        ListItem("images", "image", 1, "i1"),
        ListItem("videos", "video", 0, "v0"),
        ListItem("audios", "audio", 0, "a0"),
    ]
    assert media_list_items({}) == []
    assert ListItem("videos", "video", 3, "v").param == "videos[3]"


def test_a_completions_body_has_its_lists_priced_too() -> None:
    """The lists reach whatever server the body goes to: priced (and checked) on every route."""
    cost, bucket = make().estimate(
        {"model": "qwen2", "prompt": "hi", "images": [PNG]}, endpoint="completions", tenant="t"
    )
    assert (cost.images, bucket) == (1, "single_image")
