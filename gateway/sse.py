"""Incremental SSE inspection for the streaming relay: pass events through byte-exact, learn from them.

The relay forwards every complete event unchanged, except the usage-only chunk the gateway asked for on the
client's behalf. While passing through, it notes the first content token, the final usage and whether the
stream ended properly with `[DONE]` — all without buffering more than one event.
"""

from __future__ import annotations

from typing import Any

import orjson

_SEP = b"\n\n"


def _has_content(obj: dict[str, Any]) -> bool:
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
        ):
            return True
    return False


class SSERelay:
    """Feed raw upstream bytes, get back the bytes to send to the client."""

    __slots__ = (
        "_buf",
        "content_chunks",
        "done",
        "error",
        "first_token_at",
        "last_token_at",
        "strip_usage",
        "usage",
    )

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self._buf = b""
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.content_chunks = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: dict[str, Any] | None = None

    def feed(self, data: bytes, now: float) -> bytes:
        buf = self._buf + data if self._buf else data
        end = buf.rfind(_SEP)
        if end < 0:
            self._buf = buf
            return b""
        complete, self._buf = buf[: end + 2], buf[end + 2 :]
        if not self.strip_usage:
            for event in complete.split(_SEP)[:-1]:
                self._inspect(event, now)
            return complete
        kept = []
        for event in complete.split(_SEP)[:-1]:
            if self._inspect(event, now):
                kept.append(event + _SEP)
        return b"".join(kept)

    def flush(self) -> bytes:
        """Whatever trailing bytes never formed a complete event; forwarded as they are."""
        rest, self._buf = self._buf, b""
        return rest

    def _inspect(self, event: bytes, now: float) -> bool:
        """Record what the event says; False for the injected usage chunk the client must not see."""
        payload = None
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                payload = line[5:].strip()
                break
        if payload is None:
            return True
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return True
        if not isinstance(obj, dict):
            return True
        if isinstance(obj.get("error"), dict):
            self.error = obj["error"]
            return True
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if _has_content(obj):
            self.content_chunks += 1
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
        return not (self.strip_usage and obj.get("choices") == [] and isinstance(usage, dict))


def error_event(message: str, code: int = 502, err_type: str = "upstream_error") -> bytes:
    """A mid-stream error in SGLang's format, followed by the terminating `[DONE]`."""
    body = {"error": {"object": "error", "message": message, "type": err_type, "param": None, "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"
