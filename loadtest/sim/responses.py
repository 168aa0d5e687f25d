"""SGLang's response bodies: OpenAI objects, SSE framing and the error format, built as plain dicts.

Two releases (`SimConfig.sglang_version`): 0.5.23, measured against the real server in tests/engine/, and
0.5.9, whose chunks carry `"usage": null` and every delta key, and whose ids are prefixed (`chatcmpl-`).
"""

from __future__ import annotations

import time
from http import HTTPStatus
from typing import Any

import orjson
from starlette.responses import Response

IM_END_TOKEN_ID = 151645  # Qwen's <|im_end|>, what SGLang reports as matched_stop on a natural stop
_WORDS = (
    "the",
    "model",
    "sees",
    "a",
    "quiet",
    "harbor",
    "with",
    "boats",
    "and",
    "gulls",
    "under",
    "grey",
    "sky",
    "while",
    "waves",
    "roll",
    "slowly",
    "toward",
    "old",
    "stones",
)


def output_text(start: int, end: int) -> str:
    """Deterministic text for output tokens [start, end): one word per token."""
    return "".join(" " + _WORDS[(i * 7) % len(_WORDS)] for i in range(start, end))


def json_response(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content), status_code=status, media_type="application/json")


def error_body(message: str, err_type: str, status: int) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def error_type(status: int) -> str:
    # SGLang's HTTPException handler uses the bare status as type (e.g. "503" for a full queue)
    return _TYPES.get(status, str(status))


def error_response(status: int, message: str, err_type: str | None = None) -> Response:
    return json_response(error_body(message, err_type or error_type(status), status), status)


def sse(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def usage(prompt: int, completion: int, legacy: bool = False, cached: int | None = None) -> dict[str, Any]:
    """`cached`: the prompt's tokens served from the radix cache, told as SGLang's --enable-cache-report
    tells them (None: not reported)."""
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None if cached is None else {"cached_tokens": cached},
        "reasoning_tokens": 0,
    }
    if not legacy:
        out["completion_tokens_details"] = None
    return out


def matched_stop(finish_reason: str) -> int | None:
    return IM_END_TOKEN_ID if finish_reason == "stop" else None


class ChunkFactory:
    """Builds one response's chunks and final body; `chat` selects chat vs. text completion shapes,
    `legacy` SGLang 0.5.9's shapes (0.5.23's otherwise)."""

    def __init__(self, rid: str, model: str, chat: bool, legacy: bool = False) -> None:
        self.rid = rid
        self.model = model
        self.chat = chat
        self.legacy = legacy
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]], use: dict[str, Any] | None) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        out = {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if use is not None or self.legacy:  # 0.5.23 has no "usage" key on a chunk without usage
            out["usage"] = use
        return out

    def _choice(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        stop = matched_stop(finish) if finish else None
        if not self.chat:
            return {
                "index": 0,
                "text": text or "",
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": stop,
            }
        delta: dict[str, Any]
        if self.legacy:
            delta = {
                "role": "assistant" if role else None,
                "content": text,
                "reasoning_content": None,
                "tool_calls": None,
            }
        else:  # 0.5.23 leaves out what is unset: role only on the first chunk, content not on the last
            delta = {"reasoning_content": None}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": stop}

    def role_chunk(self) -> bytes:
        return sse(self._envelope([self._choice("", None, role=True)], None))

    def content_chunk(self, text: str) -> bytes:
        return sse(self._envelope([self._choice(text, None)], None))

    def finish_chunk(self, finish: str) -> bytes:
        return sse(self._envelope([self._choice(None if self.chat else "", finish)], None))

    def usage_chunk(self, prompt: int, completion: int, cached: int | None = None) -> bytes:
        return sse(self._envelope([], usage(prompt, completion, self.legacy, cached)))

    def complete(
        self, text: str, finish: str, prompt: int, completion: int, cached: int | None = None
    ) -> dict[str, Any]:
        stop = matched_stop(finish)
        if self.chat:
            message = {"role": "assistant", "content": text, "reasoning_content": None}
            if self.legacy:
                message["tool_calls"] = None
            choice = {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": stop,
            }
            obj = "chat.completion"
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": stop,
            }
            obj = "text_completion"
        metadata: dict[str, Any] = {"weight_version": "default"}
        if not self.legacy:
            metadata["weight_versions"] = [{"version": "default", "start": 0, "end": completion}]
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(prompt, completion, self.legacy, cached),
            "metadata": metadata,
        }


def stream_error(message: str, status: int, legacy: bool = False) -> bytes:
    """An error event inside a stream; 0.5.23 names its type by the status (`SERVICE_UNAVAILABLE`)."""
    kind = error_type(status) if legacy else HTTPStatus(status).name
    return sse({"error": error_body(message, kind, status)})
