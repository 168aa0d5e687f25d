"""Walk a request's prompt (chat messages or a completions prompt, and sglang-omni's top-level media lists)
and price every part of it. A media item is priced by the same method whichever shape it came in.

This is where request shapes are validated: every wrong type or undecodable media item becomes a 400
naming the exact param (`messages[2].content[1].image_url.url`), so a client can find its mistake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from gateway.estimate.blob import MediaError
from gateway.estimate.imagehead import HeaderError
from gateway.estimate.media import price_audio, price_image, price_video
from gateway.estimate.media_lists import media_list_items
from gateway.estimate.settings import EstimationPolicy, ModelProfile
from gateway.estimate.vision import AspectError
from gateway.request.errors import ApiError, ErrorCode
from gateway.request.media_urls import MediaUrlPolicy, MediaUrlRefused
from gateway.request.ticket import Cost

TextCounter = Callable[[str], int]
_TOO_MANY = {
    "images": ErrorCode.TOO_MANY_IMAGES,
    "audios": ErrorCode.TOO_MANY_AUDIOS,
    "videos": ErrorCode.TOO_MANY_VIDEOS,
}


def _bad(param: str, message: str, code: ErrorCode = ErrorCode.INVALID_CONTENT_PART) -> ApiError:
    return ApiError(400, f"{param}: {message}", code=code, param=param)


def _obj(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad(param, f"must be an object, got {type(value).__name__}")
    return value


def _str(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise _bad(param, f"must be a string, got {type(value).__name__}")
    return value


def _refused(param: str, e: MediaUrlRefused) -> ApiError:
    return _bad(param, f"media URL not allowed: {e}", ErrorCode.MEDIA_URL_NOT_ALLOWED)


def _number(obj: dict[str, Any], key: str, param: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise _bad(f"{param}.{key}", "must be a positive number")
    return float(value)


class ContentPricer:
    """Prices chat messages / completion prompts into a Cost for one model profile."""

    def __init__(
        self,
        profile: ModelProfile,
        policy: EstimationPolicy,
        count_text: TextCounter,
        urls: MediaUrlPolicy,
    ) -> None:
        self.profile = profile
        self.policy = policy
        self.count_text = count_text
        self.urls = urls  # the pool's media URL policy: what its engines may be handed to fetch

    def chat(self, messages: list[Any], tools: Any = None) -> Cost:
        cost = Cost()
        p = self.profile
        has_system = False
        for i, message in enumerate(messages):
            where = f"messages[{i}]"
            msg = _obj(message, where)
            has_system = has_system or msg.get("role") in ("system", "developer")
            cost.text_tokens += p.message_overhead_tokens
            content = msg.get("content")
            if isinstance(content, str):
                cost.text_tokens += self.count_text(content)
            elif isinstance(content, list):
                for j, part in enumerate(content):
                    self._part(part, f"{where}.content[{j}]", cost)
            elif content is not None:
                got = type(content).__name__
                raise _bad(f"{where}.content", f"must be a string or a list of parts, got {got}")
            if msg.get("tool_calls"):
                cost.text_tokens += self.count_text(orjson.dumps(msg["tool_calls"]).decode())
        if tools:
            cost.text_tokens += self.count_text(orjson.dumps(tools).decode())
        if not has_system:
            cost.text_tokens += p.default_system_tokens
        cost.text_tokens += p.reply_overhead_tokens
        return cost

    def completion(self, prompt: Any, field: str = "prompt") -> Cost:
        """`prompt` (or an embedding request's `input`: `field`) as str, list of str, token ids, or list of
        token-id lists (all summed: one batch)."""
        cost = Cost()
        if isinstance(prompt, str):
            cost.text_tokens = self.count_text(prompt)
            return cost
        if not isinstance(prompt, list):
            raise _bad(field, f"must be a string or a list, got {type(prompt).__name__}")
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            cost.text_tokens = len(prompt)
            return cost
        for k, item in enumerate(prompt):
            if isinstance(item, str):
                cost.text_tokens += self.count_text(item)
            elif isinstance(item, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                cost.text_tokens += len(item)
            else:
                raise _bad(f"{field}[{k}]", "must be a string or a list of token ids")
        return cost

    def media_lists(self, body: dict[str, Any], cost: Cost) -> None:
        """sglang-omni's top-level `images` / `videos` / `audios`, priced item by item like content parts
        (data URLs from their headers, URLs and paths from the policy's defaults) — through the same door
        (the pool's media URL policy): the engine opens these too."""
        for item in media_list_items(body):
            if item.kind == "image":
                self.image(item.value, None, item.param, item.param, cost)
            elif item.kind == "video":
                self.video(item.value, item.param, item.param, cost)
            else:
                self.audio(item.value, item.param, item.param, cost)

    def _part(self, part: Any, where: str, cost: Cost) -> None:
        part = _obj(part, where)
        kind = part.get("type")
        if kind == "text":
            cost.text_tokens += self.count_text(_str(part.get("text"), f"{where}.text"))
        elif kind == "image_url":
            self._image(part, where, cost)
        elif kind in ("audio_url", "input_audio"):
            self._audio(part, kind, where, cost)
        elif kind == "video_url":
            self._video(part, where, cost)
        else:
            raise _bad(f"{where}.type", f"unsupported content part type {kind!r}")

    def _limit(self, count: int, limit: int, what: str, where: str) -> None:
        if count > limit:
            raise ApiError(
                400,
                f"{where}: too many {what} in one request (limit {limit})",
                code=_TOO_MANY[what],
                param=where,
            )

    def _image(self, part: dict[str, Any], where: str, cost: Cost) -> None:
        obj = _obj(part.get("image_url"), f"{where}.image_url")
        url = _str(obj.get("url"), f"{where}.image_url.url")
        detail = obj.get("detail")
        if detail is not None and detail not in ("auto", "low", "high"):
            raise _bad(f"{where}.image_url.detail", "must be one of 'auto', 'low', 'high'")
        self.image(url, detail, where, f"{where}.image_url.url", cost)

    def image(self, value: str, detail: str | None, where: str, field: str, cost: Cost) -> None:
        """One image, whichever shape it came in: `where` names the item, `field` the value itself."""
        cost.images += 1
        self._limit(cost.images, self.policy.max_images_per_request, "images", where)
        try:
            tokens, remote = price_image(value, detail, self.profile, self.policy, self.urls)
        except MediaUrlRefused as e:
            raise _refused(field, e) from None
        except (MediaError, HeaderError, AspectError) as e:
            raise _bad(where, f"invalid image: {e}", ErrorCode.INVALID_IMAGE) from None
        cost.vision_tokens += tokens + self.profile.marker_tokens
        cost.remote_media += remote

    def _video(self, part: dict[str, Any], where: str, cost: Cost) -> None:
        param = f"{where}.video_url"
        obj = _obj(part.get("video_url"), param)
        url = _str(obj.get("url"), f"{param}.url")
        w, h = _number(obj, "width", param), _number(obj, "height", param)
        size = (int(w), int(h)) if w and h else None
        seconds, fps = _number(obj, "duration", param), _number(obj, "fps", param)
        self.video(url, where, f"{param}.url", cost, seconds=seconds, fps=fps, size=size)

    def video(
        self,
        value: str,
        where: str,
        field: str,
        cost: Cost,
        *,
        seconds: float | None = None,
        fps: float | None = None,
        size: tuple[int, int] | None = None,
    ) -> None:
        """One video, whichever shape it came in; only a content part can declare its length and size."""
        cost.videos += 1
        self._limit(cost.videos, self.policy.max_videos_per_request, "videos", where)
        try:
            tokens, remote = price_video(
                value, self.profile, self.policy, self.urls, seconds=seconds, fps=fps, size=size
            )
        except MediaUrlRefused as e:
            raise _refused(field, e) from None
        except (MediaError, AspectError) as e:
            raise _bad(where, f"invalid video: {e}", ErrorCode.INVALID_VIDEO) from None
        cost.vision_tokens += tokens + self.profile.marker_tokens
        cost.remote_media += remote

    def _audio(self, part: dict[str, Any], kind: str, where: str, cost: Cost) -> None:
        obj = _obj(part.get(kind), f"{where}.{kind}")
        key = "data" if kind == "input_audio" else "url"
        field = f"{where}.{kind}.{key}"
        self.audio(_str(obj.get(key), field), where, field, cost)

    def audio(self, value: str, where: str, field: str, cost: Cost) -> None:
        """One audio clip, whichever shape it came in (base64 or a URL of a part, an item of `audios`)."""
        cost.audios += 1
        if self.profile.audio == "none":
            raise _bad(where, "this model does not accept audio input", ErrorCode.UNSUPPORTED_MEDIA)
        self._limit(cost.audios, self.policy.max_audios_per_request, "audios", where)
        try:
            tokens, remote = price_audio(value, self.profile, self.policy, self.urls)
        except MediaUrlRefused as e:
            raise _refused(field, e) from None
        except (MediaError, HeaderError) as e:
            raise _bad(where, f"invalid audio: {e}", ErrorCode.INVALID_AUDIO) from None
        cost.audio_tokens += tokens + self.profile.marker_tokens
        cost.remote_media += remote
