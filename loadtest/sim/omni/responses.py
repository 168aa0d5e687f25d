"""sglang-omni's response bodies byte for byte: FastAPI's compact JSONResponse for whole answers and errors
(`{"detail": …}`), and the SSE events `openai_api.py` writes with a plain `json.dumps` (", " and ": ")."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

SSE_DONE = b"data: [DONE]\n\n"


def json_response(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def detail_response(status: int, detail: Any, headers: dict[str, str] | None = None) -> Response:
    return json_response({"detail": detail}, status, headers)


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode("ascii") + b"\n\n"


def usage(prompt: int, completion: int, engine_time_s: float | None = None) -> dict[str, Any]:
    use: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if engine_time_s is not None:
        use["engine_time_s"] = engine_time_s
    return use


class ChatChunks:
    """One chat response's envelopes (`ChatCompletionStreamResponse.model_dump(exclude_none=True)`)."""

    def __init__(self, request_id: str, model: str, created: int) -> None:
        self.id = f"chatcmpl-{request_id}"
        self.model = model
        self.created = created

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def delta(self, delta: dict[str, Any]) -> bytes:
        return sse(
            self._envelope("chat.completion.chunk", [{"index": 0, "delta": delta, "finish_reason": None}])
        )

    def finish(self, finish_reason: str, use: dict[str, Any]) -> bytes:
        choice = {"index": 0, "delta": {}, "finish_reason": finish_reason}
        return sse({**self._envelope("chat.completion.chunk", [choice]), "usage": use})

    def complete(self, message: dict[str, Any], finish_reason: str, use: dict[str, Any]) -> dict[str, Any]:
        choice = {"index": 0, "message": message, "finish_reason": finish_reason}
        return {**self._envelope("chat.completion", [choice]), "usage": use}


class SpeechChunks:
    """`audio.speech.chunk` events of one streamed /v1/audio/speech answer."""

    def __init__(self, request_id: str) -> None:
        self.id = f"speech-{request_id}"

    def audio(self, index: int, data_b64: str, fmt: str, mime: str, sample_rate: int) -> bytes:
        audio = {"data": data_b64, "format": fmt, "mime_type": mime, "sample_rate": sample_rate}
        return sse(
            {
                "id": self.id,
                "object": "audio.speech.chunk",
                "index": index,
                "audio": audio,
                "finish_reason": None,
            }
        )

    def final(self, index: int, finish_reason: str, use: dict[str, Any]) -> bytes:
        return sse(
            {
                "id": self.id,
                "object": "audio.speech.chunk",
                "index": index,
                "audio": None,
                "finish_reason": finish_reason,
                "usage": use,
            }
        )
