"""A backend's error body as the client's OpenAI error: the one mapping every kind shares."""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.request.errors import ApiError, ErrorCode

PASSED_THROUGH = frozenset({400, 404, 409, 413, 422, 429})
"""Statuses the client can act on, passed as they are; 503 stays 503, anything else becomes 502."""
_REQUEST_PARTS = ("body", "query", "header", "path")  # FastAPI's first `loc` element: where, not what
_FIELD_FIRST = re.compile(r"^([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*): ")


def _where(loc: Any) -> str | None:
    """A FastAPI error location (`["body", "messages", 0, "content"]`) as a param (`messages[0].content`)."""
    if not isinstance(loc, list):
        return None
    parts = loc[1:] if loc and loc[0] in _REQUEST_PARTS else loc
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or None


def _field_of(message: Any) -> str | None:
    """The field a pydantic message names at its front (`input: Field required`, as sglang-omni's speech
    errors give it without a param)."""
    found = _FIELD_FIRST.match(message) if isinstance(message, str) else None
    return found.group(1) if found else None


def _validation(errors: list[Any]) -> tuple[str | None, str | None]:
    """FastAPI's 422 list (`[{type, loc, msg, input, ctx?}]`) as one message naming each field, and the
    first field as the param."""
    found = [(e.get("loc"), e.get("msg")) for e in errors if isinstance(e, dict)]
    named = [(_where(loc), msg) for loc, msg in found if isinstance(msg, str)]
    if not named:
        return None, None
    message = "; ".join(f"{where}: {msg}" if where else msg for where, msg in named)
    return message, named[0][0]


def upstream_error(status: int, raw: bytes) -> ApiError:
    """Map a backend's error body (SGLang `{"object":"error",...}`, nested `{"error":{...}}`, FastAPI's
    `{"detail": "..."}` and its 422 `{"detail": [...]}`, or anything) to ours."""
    message = param = None
    code: Any = None
    err_type = None
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        nested = data.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else data
        message = inner.get("message")
        code = inner.get("code")
        err_type = inner.get("type")
        named = inner.get("param")
        param = named if isinstance(named, str) and named else _field_of(message)
        detail = inner.get("detail")
        if not message and isinstance(detail, list):
            message, param = _validation(detail)
        elif not message and isinstance(detail, dict):
            message = detail.get("message") or detail.get("error")
        elif not message:
            message = detail
    if not isinstance(message, str) or not message:
        message = f"Backend returned HTTP {status}."
    mapped = status if status in PASSED_THROUGH else (503 if status == 503 else 502)
    return ApiError(
        mapped,
        message,
        code=str(code) if code is not None else ErrorCode.UPSTREAM_ERROR,
        param=param,
        type=err_type if isinstance(err_type, str) else None,
    )
