"""A backend's error body as the client's OpenAI error: the one mapping every kind shares."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import ApiError, ErrorCode


def upstream_error(status: int, raw: bytes) -> ApiError:
    """Map a backend's error body (SGLang `{"object":"error",...}`, `{"detail":...}`, or anything) to ours."""
    message = None
    code: Any = None
    err_type = None
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        nested = data.get("error")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else data
        message = inner.get("message") or inner.get("detail")
        code = inner.get("code")
        err_type = inner.get("type")
    if not isinstance(message, str) or not message:
        message = f"Backend returned HTTP {status}."
    mapped = status if status in (400, 404, 413, 422, 429) else (503 if status == 503 else 502)
    return ApiError(
        mapped,
        message,
        code=str(code) if code is not None else ErrorCode.UPSTREAM_ERROR,
        type=err_type if isinstance(err_type, str) else None,
    )
