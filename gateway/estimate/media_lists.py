"""sglang-omni's top-level media lists of a chat request — `images`, `videos`, `audios`: lists of strings,
each a data URL, an http(s) or file URL, or a path on the server. The one walk over them: the pricer
(content.py) and the request shaping that turns them into content parts (gateway/backends/kinds/shapes.py)
both go through `media_list_items`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.request.errors import ApiError, ErrorCode

MediaKind = Literal["image", "video", "audio"]
MEDIA_LISTS: tuple[tuple[str, MediaKind], ...] = (
    ("images", "image"),
    ("videos", "video"),
    ("audios", "audio"),
)
"""The lists in the order the server places their items before the last user message's text."""


@dataclass(frozen=True, slots=True)
class ListItem:
    key: str
    kind: MediaKind
    index: int
    value: str

    @property
    def param(self) -> str:
        return f"{self.key}[{self.index}]"


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", code=ErrorCode.INVALID_CONTENT_PART, param=param)


def media_list_items(body: dict[str, Any]) -> list[ListItem]:
    """Every item of the request's media lists, in the server's order; ApiError(400) naming the param for a
    list that is not a list of strings."""
    items: list[ListItem] = []
    for key, kind in MEDIA_LISTS:
        values = body.get(key)
        if values is None:
            continue
        if not isinstance(values, list):
            raise _bad(key, f"must be a list of strings, got {type(values).__name__}")
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise _bad(f"{key}[{i}]", f"must be a string, got {type(value).__name__}")
            items.append(ListItem(key, kind, i, value))
    return items
