"""sglang-omni's request bodies (`serve/protocol.py`) and FastAPI's way of refusing them: 422 with a
`{"detail": [...]}` list. Unknown fields are ignored, as pydantic's default there (`stream_options`,
`priority`, … pass unnoticed)."""

from __future__ import annotations

import email.message
import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError


class ChatMessage(BaseModel):
    role: str
    content: Any = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(BaseModel):
    model: str | None = None
    messages: list[ChatMessage]
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    audios: list[str] | None = None
    images: list[str] | None = None
    videos: list[str] | None = None
    stage_sampling: dict[str, dict[str, Any]] | None = None
    stage_params: dict[str, dict[str, Any]] | None = None
    request_id: str | None = None
    user: str | None = None

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class SpeechReference(BaseModel):
    audio_path: str | None = None
    text: str | None = None
    vq_codes: list[list[int]] | list[int] | None = None


class CreateSpeechRequest(BaseModel):
    model: str | None = None
    input: str
    voice: str = "default"
    response_format: str = "wav"
    speed: float = 1.0
    stream: bool = False
    stream_format: Literal["audio", "sse"] = "audio"
    task_type: str | None = None
    language: str | None = None
    instructions: str | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    references: list[SpeechReference] | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stage_params: dict[str, dict[str, Any]] | None = None


# client/types.py SamplingParams: stage_sampling entries are splatted into it, so any other key is a TypeError
SAMPLING_PARAM_FIELDS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "stop",
        "stop_token_ids",
        "seed",
        "max_new_tokens",
    }
)

M = TypeVar("M", bound=BaseModel)


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def parse_body(raw: bytes, content_type: str | None, model: type[M]) -> M | list[dict[str, Any]]:
    """The validated body, or the error list FastAPI would answer 422 with."""
    if not raw:
        return [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}]
    body: Any = raw
    if _is_json(content_type):
        try:
            body = json.loads(raw)
        except json.JSONDecodeError as exc:
            return [
                {
                    "type": "json_invalid",
                    "loc": ["body", exc.pos],
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": exc.msg},
                }
            ]
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = []
        for error in exc.errors(include_url=False):
            item: dict[str, Any] = {**error, "loc": ["body", *error["loc"]]}
            if isinstance(item["input"], bytes):
                item["input"] = item["input"].decode("utf-8", "replace")
            if "ctx" in item:
                item["ctx"] = {
                    k: v if isinstance(v, str | int | float | bool) else str(v)
                    for k, v in item["ctx"].items()
                }
            errors.append(item)
        return errors
