"""Parse and validate the OpenAI request envelope; the estimate room validates content parts (a backend's
error bodies are mapped by its kind: gateway/backends/kinds/errors.py).

Checks happen in the order a client would want to hear about them: content type, size, JSON, then fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
from starlette.requests import Request

from gateway.request.errors import ApiError, ErrorCode

Endpoint = Literal["chat", "completions", "embeddings", "speech"]
MAX_EMBEDDING_INPUTS = 2048  # OpenAI's limit on the items of one embeddings request


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool


async def read_body(request: Request, max_bytes: int) -> bytes:
    """Read the body, refusing early (413) when Content-Length or the streamed size passes the limit."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";", 1)[0].strip().lower() != "application/json":
        raise ApiError(415, "Content-Type must be application/json.", code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "Invalid Content-Length header.", code=ErrorCode.INVALID_REQUEST) from None
        if size > max_bytes:
            raise ApiError(
                413,
                f"Request body of {size} bytes exceeds the {max_bytes}-byte limit.",
                code=ErrorCode.REQUEST_TOO_LARGE,
            )
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > max_bytes:
            raise ApiError(
                413, f"Request body exceeds the {max_bytes}-byte limit.", code=ErrorCode.REQUEST_TOO_LARGE
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _expect(
    body: dict[str, Any], name: str, types: tuple[type, ...], what: str, required: bool = False
) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(
                400,
                f"Missing required parameter: '{name}'.",
                param=name,
                code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            )
        return None
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise ApiError(
            400, f"Invalid type for '{name}': expected {what}.", param=name, code=ErrorCode.INVALID_TYPE
        )
    return value


ROLES = ("system", "developer", "user", "assistant", "tool", "function")
"""The message roles OpenAI and SGLang's chat protocol take: any other is the client's error."""


def parse_request(raw: bytes, endpoint: Endpoint) -> ParsedRequest:
    if not raw:
        raise ApiError(400, "Request body is empty; expected a JSON object.", code=ErrorCode.INVALID_JSON)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ApiError(400, f"Request body is not valid JSON: {e}.", code=ErrorCode.INVALID_JSON) from None
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.", code=ErrorCode.INVALID_JSON)
    model = _expect(body, "model", (str,), "a string", required=True)
    if not model:
        raise ApiError(
            400, "Parameter 'model' must not be empty.", param="model", code=ErrorCode.INVALID_VALUE
        )
    if endpoint == "chat":
        messages = _expect(body, "messages", (list,), "an array", required=True)
        if not messages:
            raise ApiError(
                400, "Parameter 'messages' must not be empty.", param="messages", code=ErrorCode.INVALID_VALUE
            )
        for i, msg in enumerate(messages):
            if not isinstance(msg, dict):
                raise ApiError(
                    400,
                    f"messages[{i}] must be an object.",
                    param=f"messages[{i}]",
                    code=ErrorCode.INVALID_TYPE,
                )
            role = msg.get("role")
            if not isinstance(role, str):
                raise ApiError(
                    400,
                    f"messages[{i}].role must be a string.",
                    param=f"messages[{i}].role",
                    code=ErrorCode.INVALID_TYPE,
                )
            if role not in ROLES:
                raise ApiError(
                    400,
                    f"Invalid value for 'messages[{i}].role': '{role}'. Supported values are: "
                    + ", ".join(f"'{r}'" for r in ROLES)
                    + ".",
                    param=f"messages[{i}].role",
                    code=ErrorCode.INVALID_VALUE,
                )
            content = msg.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise ApiError(
                    400,
                    f"messages[{i}].content must be a string or an array of content parts.",
                    param=f"messages[{i}].content",
                    code=ErrorCode.INVALID_TYPE,
                )
        _check_speech_out(body)
    elif endpoint == "embeddings":
        _check_embedding(body)
    elif endpoint == "speech":
        _check_speech(body)
    else:
        prompt = body.get("prompt")
        if prompt is None:
            raise ApiError(
                400,
                "Missing required parameter: 'prompt'.",
                param="prompt",
                code=ErrorCode.MISSING_REQUIRED_PARAMETER,
            )
        if not isinstance(prompt, (str, list)):
            raise ApiError(
                400,
                "Invalid type for 'prompt': expected a string or an array.",
                param="prompt",
                code=ErrorCode.INVALID_TYPE,
            )
    stream = _expect(body, "stream", (bool,), "a boolean") or False
    if endpoint == "speech" and body.get("stream_format") == "sse":  # OpenAI's way to ask for a stream
        stream = True
    if stream and endpoint == "embeddings":
        raise ApiError(400, "Embeddings cannot be streamed.", param="stream", code=ErrorCode.INVALID_VALUE)
    for name in ("max_tokens", "max_completion_tokens", "n"):
        value = _expect(body, name, (int,), "an integer")
        if value is not None and value < (0 if name != "n" else 1):
            raise ApiError(
                400, f"Invalid value for '{name}': {value}.", param=name, code=ErrorCode.INVALID_VALUE
            )
    if (body.get("n") or 1) != 1:
        raise ApiError(400, "Only n=1 is supported.", param="n", code=ErrorCode.INVALID_VALUE)
    _expect(body, "temperature", (int, float), "a number")
    _expect(body, "top_p", (int, float), "a number")
    _expect(body, "priority", (int,), "an integer")
    options = _expect(body, "stream_options", (dict,), "an object") or {}
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise ApiError(
            400,
            "Invalid type for 'stream_options.include_usage': expected a boolean.",
            param="stream_options.include_usage",
            code=ErrorCode.INVALID_TYPE,
        )
    return ParsedRequest(
        endpoint=endpoint, body=body, model=model, stream=stream, include_usage=include_usage
    )


MODALITIES = ("text", "audio")


def _check_speech_out(body: dict[str, Any]) -> None:
    """A chat's `modalities` (text, audio) and `audio: {voice, format}`, as sglang-omni and OpenAI take."""
    modalities = _expect(body, "modalities", (list,), "an array")
    if modalities is not None and (
        not modalities
        or any(m not in MODALITIES for m in modalities)
        or len(set(modalities)) < len(modalities)
    ):
        raise ApiError(
            400,
            f"Invalid value for 'modalities': {modalities!r} (a non-empty array of 'text' and 'audio').",
            param="modalities",
            code=ErrorCode.INVALID_VALUE,
        )
    audio = _expect(body, "audio", (dict,), "an object")
    if audio is not None:
        for key in ("voice", "format"):
            if key in audio and not isinstance(audio[key], str):
                raise ApiError(
                    400,
                    f"Invalid type for 'audio.{key}': expected a string.",
                    param=f"audio.{key}",
                    code=ErrorCode.INVALID_TYPE,
                )


def speaks(body: dict[str, Any]) -> bool:
    """A validated chat body asks for audio out."""
    return "audio" in (body.get("modalities") or ())


def _check_speech(body: dict[str, Any]) -> None:
    """/v1/audio/speech: `input` a non-empty string; `voice`, `response_format` strings; `speed` positive."""
    text = _expect(body, "input", (str,), "a string", required=True)
    if not text:
        raise ApiError(
            400, "Parameter 'input' must not be empty.", param="input", code=ErrorCode.INVALID_VALUE
        )
    _expect(body, "voice", (str,), "a string")
    _expect(body, "response_format", (str,), "a string")
    speed = _expect(body, "speed", (int, float), "a number")
    if speed is not None and speed <= 0:
        raise ApiError(
            400,
            f"Invalid value for 'speed': {speed} (must be positive).",
            param="speed",
            code=ErrorCode.INVALID_VALUE,
        )


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_embedding(body: dict[str, Any]) -> None:
    """`input`: a non-empty string, token ids, or an array of up to 2048 of either; `encoding_format`
    float or base64; `dimensions` a positive integer."""
    value = _expect(body, "input", (str, list), "a string or an array", required=True)
    items = [value] if isinstance(value, str) or _is_tokens(value) else value
    if not isinstance(items, list) or not items or len(items) > MAX_EMBEDDING_INPUTS:
        raise ApiError(
            400,
            f"'input' must be a string, an array of token ids, or an array of 1 to {MAX_EMBEDDING_INPUTS} "
            "of either.",
            param="input",
            code=ErrorCode.INVALID_VALUE,
        )
    for i, item in enumerate(items):
        if not (isinstance(item, str) or _is_tokens(item)) or not item:
            where = "input" if items is not value else f"input[{i}]"
            raise ApiError(
                400,
                f"'{where}' must be a non-empty string or array of token ids.",
                param=where,
                code=ErrorCode.INVALID_VALUE,
            )
    encoding = _expect(body, "encoding_format", (str,), "a string")
    if encoding not in (None, "float", "base64"):
        raise ApiError(
            400,
            f"Invalid value for 'encoding_format': {encoding!r} (float or base64).",
            param="encoding_format",
            code=ErrorCode.INVALID_VALUE,
        )
    dimensions = _expect(body, "dimensions", (int,), "an integer")
    if dimensions is not None and dimensions < 1:
        raise ApiError(
            400,
            f"Invalid value for 'dimensions': {dimensions}.",
            param="dimensions",
            code=ErrorCode.INVALID_VALUE,
        )
