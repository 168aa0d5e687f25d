"""The Estimator entry point: whole requests priced, bad shapes rejected with the exact param."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.estimate.estimator import Estimator
from gateway.estimate.settings import BucketPolicy, EstimationPolicy, ModelProfile
from gateway.estimate.text import estimate_text_tokens
from gateway.request.errors import ApiError
from gateway.request.media_urls import MediaUrlPolicy
from tests.estimate.helpers import b64, chat, data_uri, image_bytes, image_part, wav_bytes

QWEN = ModelProfile(match="qwen*", context_length=32768, default_max_tokens=2048)
LLAVA = ModelProfile(match="llava-1.5*", vision="llava_1_5", audio="none", context_length=4096)
REMOTE_OK = MediaUrlPolicy(allow_public_hosts=True)  # a pool whose engines may fetch public URLs


def make(**policy: Any) -> Estimator:
    return Estimator(EstimationPolicy(models=[QWEN, LLAVA], **policy), BucketPolicy())


def rejected(est: Estimator, body: dict[str, Any], endpoint: str = "chat") -> ApiError:
    with pytest.raises(ApiError) as info:
        est.estimate(body, endpoint=endpoint, tenant="t")  # type: ignore[arg-type]
    assert info.value.status == 400
    return info.value


def test_image_request_priced_like_the_backend() -> None:
    png = data_uri(image_bytes("PNG", 640, 480))  # 480×640 → 476×644 → 17·23 = 391 (CSV row)
    cost, bucket = make().estimate(
        chat({"type": "text", "text": "hi"}, image_part(png)), endpoint="chat", tenant="t"
    )
    assert cost.vision_tokens == 391 + 2  # + <|vision_start|> <|vision_end|>
    assert cost.text_tokens == 5 + 1 + 3  # ChatML message overhead + "hi" + assistant prompt
    assert (cost.images, cost.remote_media, bucket) == (1, 0, "single_image")
    assert (cost.max_output_tokens, cost.expected_output_tokens) == (2048, 256)


def test_family_selected_by_glob() -> None:
    est = make()
    png = data_uri(image_bytes("PNG", 640, 480))
    cost, _ = est.estimate(chat(image_part(png), model="llava-1.5-7b"), endpoint="chat", tenant="t")
    assert cost.vision_tokens == 576
    assert est.profile("mistral-7b") == ModelProfile()  # no match: family defaults


def test_remote_images_use_hints_and_are_counted() -> None:
    body = chat(
        image_part("https://example.invalid/a.jpg"), image_part("http://x.invalid/b.png", detail="low")
    )
    cost, bucket = make().estimate(body, endpoint="chat", tenant="t", urls=REMOTE_OK)
    # 1024×1024 → 1225 tokens; low detail 512×512 → round(18.29)=18 → 18·18 = 324; + 2 markers each
    assert cost.vision_tokens == 1225 + 2 + 324 + 2
    assert (cost.remote_media, bucket) == (2, "multi_image")


def test_audio_and_video_parts() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": b64(wav_bytes(2.5)), "format": "wav"}}
    video = {
        "type": "video_url",
        "video_url": {"url": "https://v.invalid/a.mp4", "duration": 10, "width": 640, "height": 360},
    }
    cost, bucket = make().estimate(chat(audio), endpoint="chat", tenant="t")
    assert (cost.audio_tokens, cost.audios, bucket) == (62 + 2, 1, "audio")
    cost, bucket = make().estimate(chat(audio, video), endpoint="chat", tenant="t", urls=REMOTE_OK)
    assert (cost.vision_tokens, cost.remote_media, bucket) == (2990 + 2, 1, "video")
    url_audio = {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + b64(wav_bytes(1.0))}}
    assert make().estimate(chat(url_audio), endpoint="chat", tenant="t")[0].audio_tokens == 25 + 2


def test_completions_prompt_shapes() -> None:
    est = make()
    body: dict[str, Any] = {"model": "qwen2", "prompt": [1, 2, 3, 4]}
    assert est.estimate(body, endpoint="completions", tenant="t")[0].text_tokens == 4
    body["prompt"] = [[1, 2], "hello"]
    assert est.estimate(body, endpoint="completions", tenant="t")[0].text_tokens == 3
    body["prompt"] = ["ok", [1, 2], None]
    assert rejected(est, body, "completions").param == "prompt[2]"


def test_output_cap_from_request_and_context() -> None:
    est = make()
    cost, _ = est.estimate(chat({"type": "text", "text": "hi"}, max_tokens=100), endpoint="chat", tenant="t")
    assert (cost.max_output_tokens, cost.expected_output_tokens) == (100, 100)
    cost, _ = est.estimate(
        chat({"type": "text", "text": "hi"}, max_completion_tokens=10, n=2), endpoint="chat", tenant="t"
    )
    assert (cost.max_output_tokens, cost.expected_output_tokens) == (20, 20)
    assert rejected(est, chat(max_tokens="5")).param == "max_tokens"
    assert rejected(est, chat(n=0)).param == "n"


def test_context_length_rejection_uses_sglang_wording() -> None:
    est = make()
    big = data_uri(image_bytes("PNG", 1024, 1024))
    body = chat(*[image_part(big)] * 8, model="llava-1.5-7b")  # 8 × 576 (no markers) + 5 + 3 template
    err = rejected(est, body)
    assert err.code == "context_length_exceeded"
    assert err.message == ("The input (4616 tokens) is longer than the model's context length (4096 tokens).")


def test_estimated_text_gets_the_benefit_of_the_doubt() -> None:
    est = Estimator(EstimationPolicy(models=[ModelProfile(context_length=1000)]), BucketPolicy())
    near = "word " * 900
    assert estimate_text_tokens(near) == 1018  # over 1000, but 0.85 × (1018 + 8) = 872: the backend decides
    cost, _ = est.estimate(chat({"type": "text", "text": near}), endpoint="chat", tenant="t")
    assert (cost.prompt_tokens, cost.max_output_tokens) == (1026, 1)
    err = rejected(est, chat({"type": "text", "text": "word " * 1100}))  # 0.85 × (1245 + 8) ≥ 1000
    assert err.message == "The input (1253 tokens) is longer than the model's context length (1000 tokens)."


def test_audio_to_a_model_without_an_audio_encoder() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": b64(wav_bytes(0.1)), "format": "wav"}}
    err = rejected(make(), chat({"type": "text", "text": "hi"}, audio, model="llava-1.5-7b"))
    assert (err.code, err.param) == ("unsupported_media", "messages[0].content[1]")


def test_too_many_media_items() -> None:
    est = make(max_images_per_request=2, max_audios_per_request=0)
    img = image_part(data_uri(image_bytes("PNG", 8, 8)))
    err = rejected(est, chat(img, img, img))
    assert (err.code, err.param) == ("too_many_images", "messages[0].content[2]")
    audio = {"type": "input_audio", "input_audio": {"data": b64(wav_bytes(0.1)), "format": "wav"}}
    assert rejected(est, chat(audio)).code == "too_many_audios"


@pytest.mark.parametrize(
    ("content", "param"),
    [
        (5, "messages[0].content"),
        (["plain string part"], "messages[0].content[0]"),
        ([{"type": "text", "text": None}], "messages[0].content[0].text"),
        ([{"type": "hologram"}], "messages[0].content[0].type"),
        ([{"type": "image_url", "image_url": "https://x.invalid/a.png"}], "messages[0].content[0].image_url"),
        ([{"type": "image_url", "image_url": {"url": 7}}], "messages[0].content[0].image_url.url"),
        (
            [{"type": "image_url", "image_url": {"url": "https://x", "detail": "ultra"}}],
            "messages[0].content[0].image_url.detail",
        ),
        (
            [{"type": "input_audio", "input_audio": {"format": "wav"}}],
            "messages[0].content[0].input_audio.data",
        ),
        (
            [{"type": "video_url", "video_url": {"url": "https://x", "fps": -1}}],
            "messages[0].content[0].video_url.fps",
        ),
    ],
)
def test_bad_part_shapes_name_the_param(content: Any, param: str) -> None:
    body = {"model": "qwen2", "messages": [{"role": "user", "content": content}]}
    err = rejected(make(), body)
    assert err.param == param
    assert err.message.startswith(param + ": ")


def test_undecodable_image_names_message_and_part() -> None:
    body = {
        "model": "qwen2",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "look"}, image_part("data:image/png;base64,@@@@")],
            },
        ],
    }
    err = rejected(make(), body)
    assert (err.code, err.param) == ("invalid_image", "messages[1].content[1]")
    assert err.message == "messages[1].content[1]: invalid image: not valid base64"


def test_extreme_aspect_ratio_is_a_400() -> None:
    err = rejected(make(), chat(image_part(data_uri(image_bytes("PNG", 3000, 10)))))
    assert err.code == "invalid_image" and "aspect ratio" in err.message


def test_bad_tokenizer_path_fails_at_construction() -> None:
    with pytest.raises(ValueError, match=r"estimation\.tokenizer_json"):
        Estimator(EstimationPolicy(tokenizer_json="/nonexistent/tokenizer.json"), BucketPolicy())


def test_observe_feeds_output_learner_and_survives_reconfigure() -> None:
    est = make(output_min_samples=2)
    cost, bucket = est.estimate(chat({"type": "text", "text": "hi"}), endpoint="chat", tenant="acme")
    for _ in range(2):
        est.observe("acme", bucket, 40)
    est2 = est.reconfigure(EstimationPolicy(models=[QWEN], output_min_samples=2), BucketPolicy())
    cost, _ = est2.estimate(chat({"type": "text", "text": "hi"}), endpoint="chat", tenant="acme")
    assert cost.expected_output_tokens == 40
    cost, _ = est2.estimate(chat({"type": "text", "text": "hi"}), endpoint="chat", tenant="other")
    assert cost.expected_output_tokens == 256
