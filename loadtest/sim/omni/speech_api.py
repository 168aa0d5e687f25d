"""sglang-omni 0.1.9's /v1/audio/speech surface (`serve/openai_api.py`, `speech_service.py`,
`speech_errors.py`): its checks and OpenAI-envelope errors, raw PCM and `speech.audio.*` SSE streams, and the
outcomes of finished PCM streams that GET /v1/audio/speech/{id} serves."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from starlette.responses import Response

from loadtest.sim.omni.protocol import CreateSpeechRequest
from loadtest.sim.omni.responses import json_response, sse

QUEUE_FULL = "The request queue is full."
FORMATS = ("aac", "flac", "mp3", "opus", "pcm", "wav")
SPEED_RANGE = (0.25, 4.0)
MAX_INPUT_CHARS = 4096
MAX_OUTCOMES = 1024  # the server keeps the latest finished streams' outcomes (a bounded FIFO)


def envelope(status: int, message: str, param: str | None = None) -> Response:
    """`speech_error_response`: 400 `BadRequestError` (code 400), 503 / 500 `server_error` (code null)."""
    kind, code = ("BadRequestError", 400) if status == 400 else ("server_error", None)
    error = {"message": message, "type": kind, "param": param, "code": code}
    return json_response({"error": error}, status)


def failure_message(status: int, message: str) -> str:
    """A full queue is told by its fixed message whatever the stage said (`speech_generation_error`)."""
    return QUEUE_FULL if status == 503 else message


def parse_errors(errors: list[dict[str, Any]]) -> Response:
    """A body pydantic refused: `validation_error_message` of its first error (or the JSON error)."""
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return envelope(400, "speech request body must be valid JSON")
    loc = [str(x) for x in first.get("loc", [])[1:]]
    message = str(first.get("msg") or "invalid speech request")
    return envelope(400, f"{'.'.join(loc)}: {message}" if loc else message)


def check(req: CreateSpeechRequest) -> Response | None:
    """`prepare_generation_updates`: input, format, streaming needs PCM, speed; model and voice unchecked."""
    if not req.input.strip():
        return envelope(400, "input must be a non-empty string", "input")
    if len(req.input) > MAX_INPUT_CHARS:
        return envelope(400, f"input must be at most {MAX_INPUT_CHARS} characters", "input")
    fmt = req.response_format.strip().lower()
    if fmt not in FORMATS:
        return envelope(400, f"response_format must be one of: {', '.join(FORMATS)}", "response_format")
    if streams(req) and fmt != "pcm":
        return envelope(400, "stream=true requires response_format='pcm'", "response_format")
    low, high = SPEED_RANGE
    if not low <= req.speed <= high:
        return envelope(400, f"speed must be between {low} and {high}", "speed")
    return None


def streams(req: CreateSpeechRequest) -> bool:
    return req.stream or req.stream_format == "sse"


def stream_headers(request_id: str, sample_rate: int, pcm: bool) -> dict[str, str]:
    headers = {
        "X-Request-Id": request_id,
        "X-Sample-Rate": str(sample_rate),
        "X-Channels": "1",
        "X-Bit-Depth": "16",
    }
    if pcm:
        headers["X-SGLang-Omni-Speech-Id"] = request_id
    return headers


def delta(b64: str) -> bytes:
    return sse({"type": "speech.audio.delta", "audio": b64})


def done(use: dict[str, Any], finish_reason: str = "stop") -> bytes:
    usage = {
        "input_tokens": use["prompt_tokens"],
        "output_tokens": use["completion_tokens"],
        "total_tokens": use["total_tokens"],
    }
    return sse({"type": "speech.audio.done", "usage": usage, "finish_reason": finish_reason})


def error_event(status: int, message: str) -> bytes:
    kind, code = ("BadRequestError", 400) if status == 400 else ("server_error", None)
    body = {"type": "error", "error": {"message": message, "type": kind, "param": None, "code": code}}
    return b"data: " + json.dumps(body).encode("ascii") + b"\n\n"


class Outcomes:
    """Finished PCM streams' `{request_id, finish_reason, usage}` by id, the newest MAX_OUTCOMES kept."""

    def __init__(self) -> None:
        self._by_id: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def record(self, request_id: str, use: dict[str, Any], finish_reason: str = "stop") -> None:
        self._by_id[request_id] = {"request_id": request_id, "finish_reason": finish_reason, "usage": use}
        while len(self._by_id) > MAX_OUTCOMES:
            self._by_id.popitem(last=False)

    def get(self, request_id: str) -> dict[str, Any] | None:
        return self._by_id.get(request_id)
