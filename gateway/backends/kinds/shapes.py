"""A chat request's media in the two shapes servers read, and the conversions between them (request shaping).

OpenAI content parts (`image_url`, `video_url`, `input_audio`, `audio_url` inside `messages[].content`) are
what SGLang reads, and later sglang-omni servers too. sglang-omni's own shape is the top-level `images` /
`videos` / `audios` lists; the snapshot reads only those — a list `content` is `json.dumps`ed into the prompt
text there — and SGLang ignores them. The request was priced and validated in whichever shape it came; the
pool's kind converts it to the shape its server reads, so an OpenAI SDK client works against either.
"""

from __future__ import annotations

from typing import Any

from gateway.estimate.media_lists import MEDIA_LISTS, MediaKind, media_list_items

_LIST_OF: dict[MediaKind, str] = {kind: key for key, kind in MEDIA_LISTS}
_PART_OF: dict[MediaKind, str] = {"image": "image_url", "video": "video_url", "audio": "audio_url"}


def _media(part: dict[str, Any]) -> tuple[MediaKind, str] | None:
    """The medium and the list value (a URL, data URL or path) of a media content part; None for text."""
    kind = part.get("type")
    if kind == "input_audio":
        audio = part["input_audio"]
        return "audio", f"data:audio/{audio.get('format') or 'wav'};base64,{audio['data']}"
    for medium, part_type in _PART_OF.items():
        if kind == part_type:
            return medium, part[part_type]["url"]
    return None


def to_media_lists(body: dict[str, Any]) -> None:
    """Move every media part into the top-level lists (after the items already there) and make each list
    `content` the text of its text parts. The server places every listed item before the text of the last
    user message, so an item's place among the messages is lost; its order within its medium is kept."""
    moved: dict[str, list[str]] = {}
    for message in body.get("messages") or ():
        content = message.get("content")
        if not isinstance(content, list):
            continue
        texts = []
        for part in content:
            media = _media(part)
            if media is None:
                texts.append(part.get("text") or "")
            else:
                moved.setdefault(_LIST_OF[media[0]], []).append(media[1])
        message["content"] = "\n".join(texts)
    for key, values in moved.items():
        body[key] = [*(body.get(key) or ()), *values]


def to_content_parts(body: dict[str, Any]) -> None:
    """Move the top-level lists' items into content parts of the last user message, before its text — where
    sglang-omni would have placed them (images, videos, then audio clips)."""
    items = media_list_items(body)
    for key, _ in MEDIA_LISTS:
        body.pop(key, None)
    messages = body.get("messages")
    if not items or not messages:
        return
    target = next((m for m in reversed(messages) if m.get("role") == "user"), messages[-1])
    content = target.get("content")
    text = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or ())
    parts = [{"type": _PART_OF[i.kind], _PART_OF[i.kind]: {"url": i.value}} for i in items]
    target["content"] = parts + text
