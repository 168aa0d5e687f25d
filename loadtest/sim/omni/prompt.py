"""The omni simulator's own prompt count: text, images, audio and video as sglang-omni's preprocessing
sees them.

Independent of the gateway's estimator on purpose. Text and WAV/image headers go through the plain
simulator's helpers (`loadtest/sim/tokens.py`); images use Qwen3-Omni's 32-px smart resize; audio the
Qwen3-Omni formula. Media come from sglang-omni's top-level `images` / `audios` / `videos` lists (data URLs
or local paths) and, in the later release, from OpenAI content parts. The snapshot json.dumps a list
`content` into the prompt text.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.sim.omni.profile import OmniProfile
from loadtest.sim.tokens import PromptError, image_size, text_tokens, wav_seconds
from loadtest.sim.vision import audio_tokens, smart_resize


class OmniInputError(Exception):
    """A request the pipeline fails on; `bad_request` decides 400 vs 500 where the release distinguishes."""

    def __init__(self, message: str, bad_request: bool = True) -> None:
        super().__init__(message)
        self.message = message
        self.bad_request = bad_request


@dataclass
class OmniPrompt:
    text: int = 0
    markers: int = 0
    image_items: list[int] = field(default_factory=list)  # LLM tokens per image or video (image encoder work)
    audio_items: list[int] = field(default_factory=list)  # LLM tokens per audio clip (audio encoder work)
    audio_seconds: float = 0.0

    @property
    def total(self) -> int:
        return self.text + self.markers + sum(self.image_items) + sum(self.audio_items)


def _read_source(source: str, what: str) -> bytes:
    """Bytes behind a media string as sglang-omni accepts it: data URL, file:// URL or local path."""
    if source.startswith("data:"):
        _, _, payload = source.partition(",")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise OmniInputError(f"Failed to load {what}: invalid base64 in data URL ({exc}).") from exc
    if source.startswith(("http://", "https://")):
        raise OmniInputError(
            f"Failed to load {what} from {source}: the simulated backend has no network.", bad_request=False
        )
    path = Path(source.removeprefix("file://"))
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OmniInputError(f"Failed to load {what} from {source}: {exc.strerror or exc}.") from exc


def _as_input_error(exc: PromptError) -> OmniInputError:
    return OmniInputError(exc.message)


class OmniCounter:
    def __init__(self, profile: OmniProfile, content_parts: bool) -> None:
        self.profile = profile
        self.content_parts = content_parts

    def text(self, text: str) -> int:
        return text_tokens(text, self.profile.text.bytes_per_token)

    # -- whole prompts ---------------------------------------------------------------------------------
    def chat(
        self,
        messages: list[tuple[str, Any]],
        images: list[str] | None,
        audios: list[str] | None,
        videos: list[str] | None,
    ) -> OmniPrompt:
        t = self.profile.text
        prompt = OmniPrompt(text=t.tokens_per_prompt)
        for role, content in messages:
            prompt.text += t.tokens_per_message + self.text(role)
            if isinstance(content, str):
                prompt.text += self.text(content)
            elif self.content_parts and isinstance(content, list):
                for part in content:
                    self._part(part, prompt)
            else:
                # normalize_messages: anything but a string becomes its JSON text (None → "null")
                prompt.text += self.text(json.dumps(content, ensure_ascii=True))
        for source in images or []:
            self.add_image(_read_source(source, "image"), prompt)
        for source in audios or []:
            self.add_audio(self._wav(_read_source(source, "audio")), prompt)
        for source in videos or []:
            raise OmniInputError(
                f"Failed to load video from {source[:64]}: the simulated backend does not decode video "
                "(send a video_url content part with declared frames or duration)."
            )
        return prompt

    def speech(self, text: str) -> OmniPrompt:
        """/v1/audio/speech as one user turn the thinker reads back."""
        t = self.profile.text
        return OmniPrompt(
            text=t.tokens_per_prompt + t.tokens_per_message + self.text("user") + self.text(text)
        )

    # -- media -----------------------------------------------------------------------------------------
    def add_image(self, data: bytes, prompt: OmniPrompt) -> None:
        try:
            height, width = image_size(data)
        except PromptError as exc:
            raise _as_input_error(exc) from exc
        prompt.image_items.append(self._grid(height, width, self.profile.vision.max_pixels))
        prompt.markers += self.profile.vision.markers_per_image

    def add_audio(self, seconds: float, prompt: OmniPrompt) -> None:
        prompt.audio_items.append(audio_tokens(seconds, self.profile.audio))
        prompt.audio_seconds += seconds
        prompt.markers += self.profile.audio.markers_per_clip

    def _grid(self, height: int, width: int, max_pixels: int) -> int:
        v = self.profile.vision
        h, w = smart_resize(height, width, v.min_pixels, max_pixels, factor=v.patch_factor)
        return (h // v.patch_factor) * (w // v.patch_factor)

    @staticmethod
    def _wav(data: bytes) -> float:
        try:
            return wav_seconds(data)
        except PromptError as exc:
            raise _as_input_error(exc) from exc

    # -- OpenAI content parts (later release: preprocessing/chat_content.py) ---------------------------
    def _part(self, part: Any, prompt: OmniPrompt) -> None:
        if not isinstance(part, dict):
            raise OmniInputError(f"Content parts must be objects, got {type(part).__name__}.")
        kind = part.get("type")
        if kind in ("text", "input_text"):
            prompt.text += self.text(str(part.get("text", "")))
        elif kind in ("image_url", "input_image"):
            self.add_image(_read_source(_url(part, "image_url"), "image"), prompt)
        elif kind == "audio_url":
            self.add_audio(self._declared_or_wav(part, "audio_url", _url(part, "audio_url")), prompt)
        elif kind == "input_audio":
            spec = part.get("input_audio")
            if not isinstance(spec, dict) or not isinstance(spec.get("data"), str):
                raise OmniInputError("input_audio needs base64 'data'.")
            if spec.get("format", "wav") not in ("wav", "mp3"):
                raise OmniInputError(
                    f"Unsupported input_audio format {spec.get('format')!r}: use wav or mp3."
                )
            self.add_audio(self._declared_or_wav(part, "input_audio", "data:," + spec["data"]), prompt)
        elif kind == "video_url":
            self._video(part.get("video_url"), prompt)
        else:
            raise OmniInputError(f"Unsupported content part type: {kind!r}.")

    def _declared_or_wav(self, part: dict[str, Any], key: str, source: str) -> float:
        """A declared `duration` (simulator extension, e.g. for mp3) or the WAV header's length."""
        spec = part.get(key)
        declared = spec.get("duration") if isinstance(spec, dict) else None
        if isinstance(declared, int | float) and declared > 0:
            return float(declared)
        return self._wav(_read_source(source, "audio"))

    def _video(self, spec: Any, prompt: OmniPrompt) -> None:
        """Video is never decoded: the part declares `frames` or `duration` (and optionally its size)."""
        v = self.profile.vision
        spec = spec if isinstance(spec, dict) else {}
        frames = spec.get("frames")
        if not isinstance(frames, int) and isinstance(spec.get("duration"), int | float):
            frames = math.ceil(spec["duration"] * v.video_fps)
        if not isinstance(frames, int) or frames <= 0:
            raise OmniInputError(
                "video_url needs declared 'frames' or 'duration' (the sim does not decode video)."
            )
        h, w = spec.get("height"), spec.get("width")
        if not (isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0):
            h = w = int(math.sqrt(v.video_frame_pixels))
        prompt.image_items.append(math.ceil(frames / 2) * self._grid(h, w, v.video_frame_pixels))
        prompt.markers += v.markers_per_image


def _url(part: dict[str, Any], key: str) -> str:
    value = part.get(key)
    url = value.get("url") if isinstance(value, dict) else value
    if not isinstance(url, str) or not url:
        raise OmniInputError(f"Content part {key!r} needs a non-empty url.")
    return url
