"""Incremental SSE inspection for the streaming relay: pass events through byte-exact, learn from them.

The relay forwards every complete event unchanged, except the usage-only chunk the gateway asked for on the
client's behalf. While passing through, it notes the first output (a content token or audio), each audio
chunk's seconds (gateway/speech: from its WAV header, the base64 around it never parsed), the final usage and
whether the stream ended properly with `[DONE]` — all without buffering more than one event.

Per-event cost matters (a stream is hundreds of events; a substring scan costs a fifth of a JSON parse):
once the first token is seen, a chunk whose top-level object ends in `"usage":null}` (compact JSON, as
SGLang sends) and is not finished counts as a token without being parsed, unless its content is an empty
string or it carries audio. Everything else (usage, errors, the finish chunk, other spellings) is parsed, an
audio chunk without its base64 payload.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

from gateway.speech.events import AUDIO_KEY, EVENT_SCAN, read_json
from gateway.speech.meter import SpeechMeter

_SEP = b"\n\n"
SPEECH_DONE = "speech.audio.done"
# Compact-JSON markers; JSON escaping keeps them out of string values.
_NO_USAGE_END = b'"usage":null}'
_NOT_FINISHED = b'"finish_reason":null'
_EMPTY_CONTENT = b'"content":""'
# A compact chunk's answer text, still JSON-escaped (an escape never spans two pieces, so pieces join).
_TEXT = re.compile(rb'"(?:content|text|reasoning_content|arguments)":"((?:[^"\\]|\\.)*)"')
_TEXT_FLUSH = 1 << 16  # count the kept answer text every 64 KiB: a long answer costs no more memory


def _escaped(value: Any) -> bytes:
    return orjson.dumps(value)[1:-1] if isinstance(value, str) and value else b""


def _answer_text(obj: dict[str, Any]) -> bytes:
    """The answer text (content, reasoning, tool-call arguments) of a parsed chunk or a whole answer,
    JSON-escaped."""
    out = b""
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        out += _escaped(choice.get("text"))
        delta = choice.get("delta") or choice.get("message")
        if isinstance(delta, dict):
            out += _escaped(delta.get("content")) + _escaped(delta.get("reasoning_content"))
            for call in delta.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    out += _escaped(function.get("arguments"))
    return out


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


def whole_answer_tokens(obj: Any, count_text: Callable[[str], int]) -> int:
    """Tokens of a whole (not streamed) answer's text: what a 200 without `usage` is charged."""
    text = _answer_text(obj) if isinstance(obj, dict) else b""
    return count_text(orjson.loads(b'"' + text + b'"')) if text else 0


class SSERelay:
    """Feed raw upstream bytes, get back the bytes to send to the client. With `count_text`, it also keeps
    the answer's text to count its tokens (`answer_tokens`): what a stream cut short is charged."""

    __slots__ = (
        "_buf",
        "_count_text",
        "_counted",
        "_text",
        "audio",
        "content_chunks",
        "done",
        "error",
        "first_token_at",
        "last_token_at",
        "pcm_rate",
        "strip_usage",
        "usage",
    )

    def __init__(
        self, strip_usage: bool, count_text: Callable[[str], int] | None = None, pcm_rate: int | None = None
    ) -> None:
        self.strip_usage = strip_usage
        self.pcm_rate = pcm_rate  # the stream's x-sample-rate: sizes `speech.audio.delta` PCM
        self._buf = b""
        self._count_text = count_text
        self._text = bytearray()
        self._counted = 0
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.content_chunks = 0
        self.usage: dict[str, Any] | None = None
        self.done = False
        self.error: dict[str, Any] | None = None
        self.audio = SpeechMeter()

    def feed(self, data: bytes, now: float) -> bytes:
        buf = self._buf + data if self._buf else data
        first = buf.find(_SEP)
        if first < 0:
            self._buf = buf
            return b""
        end = buf.rfind(_SEP) + 2
        complete, self._buf = (buf, b"") if end == len(buf) else (buf[:end], buf[end:])
        if first + 2 == end:  # one event, the usual case: no split, no join
            return complete if self._inspect(complete[:first], now) else b""
        events = complete.split(_SEP)
        events.pop()  # the empty tail after the last separator
        keep = [self._inspect(event, now) for event in events]
        if all(keep):
            return complete
        return b"".join(event + _SEP for event, kept in zip(events, keep, strict=True) if kept)

    def flush(self) -> bytes:
        """Whatever trailing bytes never formed a complete event; forwarded as they are."""
        rest, self._buf = self._buf, b""
        return rest

    def answer_tokens(self) -> int:
        """Tokens of the answer relayed so far: its text counted, at least one per content chunk."""
        self._count_kept()
        return max(self._counted, self.content_chunks)

    def _keep(self, escaped: bytes) -> None:
        if self._count_text is not None and escaped:
            self._text += escaped
            if len(self._text) >= _TEXT_FLUSH:
                self._count_kept()

    def _count_kept(self) -> None:
        if self._count_text is not None and self._text:
            self._counted += self._count_text(orjson.loads(b'"' + bytes(self._text) + b'"'))
            self._text.clear()

    def _inspect(self, event: bytes, now: float) -> bool:
        """Record what the event says; False for the injected usage chunk the client must not see."""
        if self.first_token_at is not None and event.startswith(b"data: ") and _plain_content(event):
            self.content_chunks += 1
            self.last_token_at = now
            if self._count_text is not None:
                self._keep(b"".join(_TEXT.findall(event)))
            return True
        payload = _data_line(event)
        if payload is None:
            return True
        if payload == b"[DONE]":
            self.done = True
            return True
        try:
            obj, audio_seconds = read_json(payload, pcm_rate=self.pcm_rate)
        except orjson.JSONDecodeError:
            return True
        if not isinstance(obj, dict):
            return True
        if audio_seconds is not None:  # audio is output: the first of it may come before any text
            self.audio.add(now, audio_seconds)
            if self.first_token_at is None:
                self.first_token_at = now
        if isinstance(obj.get("error"), dict):
            self.error = obj["error"]
            return True
        usage = obj.get("usage")
        if obj.get("type") == SPEECH_DONE:  # a speech SSE stream's end (no [DONE] follows), Realtime names
            self.done = True
            usage = _openai_usage(usage)
        if isinstance(usage, dict):
            self.usage = usage
        if _has_content(obj):
            self._keep(_answer_text(obj))
            self.content_chunks += 1
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_token_at = now
        return not (self.strip_usage and obj.get("choices") == [] and isinstance(usage, dict))


def _openai_usage(usage: Any) -> dict[str, Any] | None:
    """`speech.audio.done`'s usage (`input_tokens` / `output_tokens`) in chat's names."""
    if not isinstance(usage, dict):
        return None
    return {"prompt_tokens": usage.get("input_tokens"), "completion_tokens": usage.get("output_tokens")}


def leading_error(first: bytes) -> tuple[int, bytes] | None:
    """A stream whose first event is an error (sglang-omni 0.1.9 refuses a streamed chat so, inside its
    200): the status its `code` gives (500 without one) and the error's JSON, as if it had come before the
    200; None when the stream starts with anything else."""
    if not first.startswith(b"data: {"):
        return None
    end = first.find(_SEP)
    payload = first[6:end] if end >= 0 else first[6:]
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    error = obj.get("error") if isinstance(obj, dict) else None
    if not isinstance(error, dict):
        return None
    code = error.get("code")
    return (code if isinstance(code, int) and 400 <= code < 600 else 500), payload


def _data_line(event: bytes) -> bytes | None:
    if event.startswith(b"data: ") and b"\n" not in event:
        return event[6:].strip()
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return None


def _plain_content(event: bytes) -> bool:
    """A not-finished compact chunk with no usage, no empty content and no audio: a token, without a parse."""
    return (
        event.endswith(_NO_USAGE_END)
        and _NOT_FINISHED in event
        and _EMPTY_CONTENT not in event
        and event.find(AUDIO_KEY, 0, EVENT_SCAN) < 0
    )


def error_event(message: str, code: int = 502, err_type: str = "upstream_error") -> bytes:
    """A mid-stream error in SGLang's format, followed by the terminating `[DONE]`."""
    body = {"error": {"object": "error", "message": message, "type": err_type, "param": None, "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"
