"""OpenAI-style API errors: every stage raises ApiError, the app turns it into one JSON body.

Keeping the error type in its own tiny module lets every room (estimate, tenants, admission) raise
client-facing errors without importing the HTTP layer.
"""

from __future__ import annotations

from typing import Any

import orjson

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """A failure the client should see as `{"error": {"message","type","param","code"}}`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPE_BY_STATUS.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        self.retry_after = retry_after
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def response_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["retry-after"] = str(max(1, int(-(-self.retry_after // 1))))
        return headers

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r}, code={self.code!r})"
