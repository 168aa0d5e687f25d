"""The sim's own token counting against the Hugging Face reference tables (tests/data)."""

from __future__ import annotations

import csv
import io
import wave
from pathlib import Path

import pytest
from PIL import Image

from loadtest.sim.profile import AudioModel, VisionModel, load_profile
from loadtest.sim.tokens import PromptCounter, PromptError, image_size, text_tokens
from loadtest.sim.vision import audio_tokens, image_tokens, video_tokens

DATA = Path(__file__).resolve().parents[1] / "data"


def _rows(name: str) -> list[dict[str, str]]:
    with (DATA / name).open() as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize(
    "row", _rows("vision_tokens_reference.csv"), ids=lambda r: f"{r['height']}x{r['width']}"
)
def test_qwen2_vl_image_tokens_match_hf_processor(row: dict[str, str]) -> None:
    assert image_tokens(int(row["height"]), int(row["width"]), VisionModel()) == int(row["qwen2_vl_tokens"])


@pytest.mark.parametrize("row", _rows("audio_tokens_reference.csv"), ids=lambda r: r["seconds"])
def test_audio_tokens_match_reference(row: dict[str, str]) -> None:
    seconds = float(row["seconds"])
    assert audio_tokens(seconds, AudioModel(family="qwen2_5_omni")) == int(row["qwen2_5_omni_tokens"])
    assert audio_tokens(seconds, AudioModel(family="qwen3_omni")) == int(row["qwen3_omni_tokens"])


def test_fixed_families_and_video_pairs_frames() -> None:
    assert image_tokens(1080, 1920, VisionModel(family="llava_1_5")) == 576
    assert image_tokens(1080, 1920, VisionModel(family="gemma3")) == 256
    # 360×420 rounds to 364×420, over the 151,200-pixel frame budget → floored to 336×420 = 12×15 per pair
    assert video_tokens(16, 360, 420, VisionModel()) == 8 * 180
    assert video_tokens(3, None, None, VisionModel(family="gemma3")) == 3 * 256


def test_text_rule_counts_cjk_per_character_and_bytes_otherwise() -> None:
    assert text_tokens("abcdefgh", 4.0) == 2
    assert text_tokens("abcdefghi", 4.0) == 3
    assert text_tokens("你好世界", 4.0) == 4
    assert text_tokens("hi 你好", 4.0) == 2 + 1  # two CJK chars + ceil(3 bytes / 4)


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _wav(seconds: float, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * int(seconds * rate))
    return buf.getvalue()


def test_chat_count_adds_template_overhead_images_and_audio() -> None:
    import base64

    counter = PromptCounter(load_profile("default"))
    img = "data:image/png;base64," + base64.b64encode(_png(1280, 720)).decode()
    wav = base64.b64encode(_wav(2.0)).decode()
    count = counter.chat(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "abcdefgh"},
                    {"type": "image_url", "image_url": {"url": img}},
                    {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
                ],
            },
        ]
    )
    assert image_size(_png(1280, 720)) == (720, 1280)
    assert (count.images, count.image_tokens, count.audio_tokens) == (1, 1196, 50)
    # 3 (assistant opener) + 4 per message + "user" (1) + "abcdefgh" (2); markers 2 + 2
    assert count.text == 3 + 4 + 1 + 2 and count.markers == 4
    assert count.total == 10 + 1196 + 50 + 4


@pytest.mark.parametrize(
    ("part", "message"),
    [
        ({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, "no network"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "not valid base64"),
        ({"type": "image_url", "image_url": {"url": "aGVsbG8="}}, "Failed to load image"),
        ({"type": "video_url", "video_url": {"url": "x"}}, "declared 'frames'"),
        ({"type": "input_audio", "input_audio": {"data": "aGVsbG8=", "format": "mp3"}}, "duration"),
        ({"type": "hologram"}, "unsupported content part"),
    ],
)
def test_bad_parts_are_clear_400s(part: dict[str, object], message: str) -> None:
    counter = PromptCounter(load_profile("default"))
    with pytest.raises(PromptError) as exc:
        counter.chat([{"role": "user", "content": [part]}])
    assert exc.value.status == 400 and message in exc.value.message
