"""The simulator's own prompt-token count (independent of the gateway's estimator, on purpose).

Text: one token per CJK character, other characters by UTF-8 bytes / bytes_per_token, plus a chat-template
overhead per message. Images: real dimensions from the decoded header (Pillow lazy open) through the
profile's vision formula. Audio: real WAV duration (or a declared `duration`). Video: declared frames.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import wave
from dataclasses import dataclass
from typing import Any

from PIL import Image, UnidentifiedImageError

from loadtest.sim.profile import Profile
from loadtest.sim.radix_cache import PromptPages
from loadtest.sim.vision import audio_tokens, image_tokens, video_tokens


class PromptError(Exception):
    """A request the sim cannot read: SGLang answers these with 400."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class PromptCount:
    text: int = 0
    images: int = 0
    image_tokens: int = 0
    audio_tokens: int = 0
    video_tokens: int = 0
    markers: int = 0
    pages: PromptPages | None = None  # the prompt as the radix cache keys it (radix_cache.py), when it runs

    @property
    def encoder_tokens(self) -> int:
        return self.image_tokens + self.audio_tokens + self.video_tokens

    @property
    def total(self) -> int:
        return self.text + self.encoder_tokens + self.markers


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (
        0x3040 <= o <= 0x30FF  # kana
        or 0x3400 <= o <= 0x4DBF
        or 0x4E00 <= o <= 0x9FFF
        or 0xAC00 <= o <= 0xD7AF  # hangul
        or 0xF900 <= o <= 0xFAFF
        or 0xFF00 <= o <= 0xFFEF  # full-width forms
    )


def text_tokens(text: str, bytes_per_token: float) -> int:
    cjk = sum(1 for ch in text if _is_cjk(ch))
    other_bytes = len(text.encode("utf-8")) - 3 * cjk
    return cjk + math.ceil(max(other_bytes, 0) / bytes_per_token)


def _decode_base64(data: str, what: str) -> bytes:
    if data.startswith("data:"):
        _, _, data = data.partition(",")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PromptError(f"Invalid {what} data: not valid base64 ({exc}).") from exc


def _source(part: dict[str, Any], key: str) -> str:
    value = part.get(key)
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise PromptError(f"Content part of type {key!r} needs a non-empty url.")
    if url.startswith(("http://", "https://")):
        raise PromptError(
            f"Failed to load {key.split('_')[0]} from {url}: the simulated backend has no network."
        )
    return url


def image_size(data: bytes) -> tuple[int, int]:
    """(height, width) from the image header; pixels are never decoded."""
    try:
        with Image.open(io.BytesIO(data)) as img:
            width, height = img.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise PromptError(f"Failed to load image: {exc}") from exc
    return height, width


def wav_seconds(data: bytes) -> float:
    try:
        with wave.open(io.BytesIO(data)) as wav:
            return wav.getnframes() / float(wav.getframerate())
    except (wave.Error, EOFError, ZeroDivisionError) as exc:
        raise PromptError(f"Failed to load audio: not a readable WAV file ({exc}).") from exc


class PromptCounter:
    def __init__(self, profile: Profile, pages: bool = False) -> None:
        self.profile = profile
        self.pages = pages  # also cut the prompt into the radix cache's pages

    def text(self, text: str) -> int:
        return text_tokens(text, self.profile.text.bytes_per_token)

    def chat(self, messages: Any) -> PromptCount:
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list.")
        count = PromptCount(text=self.profile.text.tokens_per_prompt)
        pages = count.pages = PromptPages() if self.pages else None
        if pages is not None:
            pages.add(b"template", count.text)
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise PromptError(f"messages[{i}] must be an object with a string 'role'.")
            header = self.profile.text.tokens_per_message + self.text(msg["role"])
            count.text += header
            if pages is not None:
                pages.add(b"role:" + msg["role"].encode(), header)
            content = msg.get("content")
            if content is None or isinstance(content, str):
                count.text += self.text(content or "")
                if pages is not None:
                    pages.text(content or "", self.text)
            elif isinstance(content, list):
                for j, part in enumerate(content):
                    self._part(part, count, f"messages[{i}].content[{j}]")
            else:
                raise PromptError(f"messages[{i}].content must be a string or a list of content parts.")
        return count

    def _part(self, part: Any, count: PromptCount, where: str) -> None:
        if not isinstance(part, dict):
            raise PromptError(f"{where} must be an object.")
        kind = part.get("type")
        if kind == "text":
            count.text += self.text(str(part.get("text", "")))
            if count.pages is not None:
                count.pages.text(str(part.get("text", "")), self.text)
        elif kind == "image_url":
            self.add_image(_decode_base64(_source(part, "image_url"), "image"), count)
        elif kind in ("input_audio", "audio_url"):
            self._audio(part, kind, count)
        elif kind == "video_url":
            self._video(part, count)
        else:
            raise PromptError(f"{where}: unsupported content part type {kind!r}.")

    def add_image(self, data: bytes, count: PromptCount) -> None:
        height, width = image_size(data)
        tokens = image_tokens(height, width, self.profile.vision)
        count.images += 1
        count.image_tokens += tokens
        count.markers += self.profile.vision.markers_per_image
        if count.pages is not None:
            count.pages.add(data, tokens + self.profile.vision.markers_per_image, tokens)

    def _audio(self, part: dict[str, Any], kind: str, count: PromptCount) -> None:
        spec = part.get(kind)
        declared = spec.get("duration") if isinstance(spec, dict) else None
        if isinstance(declared, int | float) and declared > 0:
            seconds = float(declared)
        elif kind == "input_audio":
            if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
                raise PromptError("input_audio needs base64 'data'.")
            fmt = spec.get("format", "wav")
            if fmt != "wav":
                raise PromptError(
                    f"input_audio format {fmt!r} needs a declared 'duration' (only WAV is read)."
                )
            seconds = wav_seconds(_decode_base64(spec["data"], "audio"))
        else:
            seconds = wav_seconds(_decode_base64(_source(part, "audio_url"), "audio"))
        tokens = audio_tokens(seconds, self.profile.audio)
        count.audio_tokens += tokens
        count.markers += self.profile.audio.markers_per_clip
        if count.pages is not None:
            count.pages.add(repr(spec).encode(), tokens + self.profile.audio.markers_per_clip, tokens)

    def _video(self, part: dict[str, Any], count: PromptCount) -> None:
        spec = part.get("video_url")
        spec = spec if isinstance(spec, dict) else {}
        frames = spec.get("frames")
        if not isinstance(frames, int) and isinstance(spec.get("duration"), int | float):
            frames = math.ceil(spec["duration"] * self.profile.vision.video_fps)
        if not isinstance(frames, int) or frames <= 0:
            raise PromptError(
                "video_url needs declared 'frames' or 'duration' (the sim does not decode video)."
            )
        h, w = spec.get("height"), spec.get("width")
        dims_ok = isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0
        tokens = video_tokens(frames, h if dims_ok else None, w if dims_ok else None, self.profile.vision)
        count.video_tokens += tokens
        count.markers += self.profile.vision.markers_per_image
        if count.pages is not None:
            count.pages.add(repr(spec).encode(), tokens + self.profile.vision.markers_per_image, tokens)
