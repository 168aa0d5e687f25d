"""OpenAI-style API errors: every stage raises ApiError, the app turns it into one JSON body.

Keeping the error type in its own tiny module lets every room (estimate, tenants, admission) raise
client-facing errors without importing the HTTP layer. The vocabularies live here too: `ErrorCode`, the one
`code` of each refusal, and `RejectionReason`, the coarser `reason` label of `omnigate_rejections_total`
that ops alert on (`rejection_reason` maps one to the other).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import orjson


class ErrorCode(StrEnum):
    """The `code` of every error body the gateway itself writes (a backend's own codes pass through)."""

    # the request itself
    INVALID_JSON = "invalid_json"
    INVALID_TYPE = "invalid_type"
    INVALID_VALUE = "invalid_value"
    INVALID_REQUEST = "invalid_request"
    INVALID_HEADER = "invalid_header"
    INVALID_HTTP = "invalid_http"
    HEADERS_TOO_LARGE = "request_header_fields_too_large"
    HEADER_TIMEOUT = "request_header_timeout"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    MISSING_REQUIRED_PARAMETER = "missing_required_parameter"
    REQUEST_TOO_LARGE = "request_too_large"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    INVALID_CONTENT_PART = "invalid_content_part"
    INVALID_IMAGE = "invalid_image"
    INVALID_AUDIO = "invalid_audio"
    INVALID_VIDEO = "invalid_video"
    UNSUPPORTED_MEDIA = "unsupported_media"
    MEDIA_URL_NOT_ALLOWED = "media_url_not_allowed"
    TOO_MANY_IMAGES = "too_many_images"
    TOO_MANY_AUDIOS = "too_many_audios"
    TOO_MANY_VIDEOS = "too_many_videos"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    MODEL_NOT_FOUND = "model_not_found"
    INVALID_TRAFFIC_CLASS = "invalid_traffic_class"
    NO_POOL_FOR_CLASS = "no_pool_for_class"
    NOT_FOUND = "not_found"
    ROUTE_NOT_SERVED = "route_not_served"  # the model's backends have no such route
    METHOD_NOT_ALLOWED = "method_not_allowed"
    HTTP_ERROR = "http_error"
    # who is asking
    MISSING_API_KEY = "missing_api_key"
    INVALID_API_KEY = "invalid_api_key"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    CLASS_NOT_ALLOWED = "class_not_allowed"
    ADMIN_DISABLED = "admin_disabled"
    MISSING_ADMIN_TOKEN = "missing_admin_token"
    INVALID_ADMIN_TOKEN = "invalid_admin_token"
    TENANT_NOT_FOUND = "tenant_not_found"
    TENANT_EXISTS = "tenant_exists"
    KEY_NOT_FOUND = "key_not_found"
    # quotas (one per limit) and their store
    INPUT_TPM_EXCEEDED = "input_tokens_per_minute_exceeded"
    OUTPUT_TPM_EXCEEDED = "output_tokens_per_minute_exceeded"
    TOTAL_TPM_EXCEEDED = "tokens_per_minute_exceeded"
    RPM_EXCEEDED = "requests_per_minute_exceeded"
    AUDIO_SPM_EXCEEDED = "audio_seconds_per_minute_exceeded"
    CONCURRENCY_EXCEEDED = "concurrent_requests_exceeded"
    QUEUED_EXCEEDED = "queued_requests_exceeded"
    DAILY_BUDGET_EXCEEDED = "daily_token_budget_exceeded"
    MONTHLY_BUDGET_EXCEEDED = "monthly_token_budget_exceeded"
    DAILY_AUDIO_BUDGET_EXCEEDED = "daily_audio_budget_exceeded"
    MONTHLY_AUDIO_BUDGET_EXCEEDED = "monthly_audio_budget_exceeded"
    QUOTA_STORE_UNAVAILABLE = "quota_store_unavailable"
    # admission
    SLO_UNATTAINABLE = "slo_unattainable"
    CAPACITY_UNAVAILABLE = "capacity_unavailable"  # a deadline refusal while the pool has lost backends
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    DISPLACED = "displaced"
    NO_HEALTHY_BACKEND = "no_healthy_backend"
    NO_BACKEND = "no_backend"
    SHUTTING_DOWN = "shutting_down"
    # the backend
    BACKEND_CONNECT = "backend_connect"
    BACKEND_FIRST_BYTE = "backend_first_byte"
    BACKEND_TOTAL_TIMEOUT = "backend_total_timeout"
    UPSTREAM_ERROR = "upstream_error"
    BACKEND_REQUEST_FAILED = "backend_request_failed"  # a healthy backend failed this one request
    BACKEND_OVERLOADED = "backend_overloaded"  # the backend refused it for load inside a started stream
    INTERNAL_ERROR = "internal_error"


class RejectionReason(StrEnum):
    """The `reason` label of `omnigate_rejections_total`: why a request was refused, in terms ops act on."""

    QUOTA = "quota"
    BUDGET = "budget"
    SLO_UNATTAINABLE = "slo_unattainable"
    CAPACITY_UNAVAILABLE = "capacity_unavailable"
    DISPLACED = "displaced"
    QUEUE_FULL = "queue_full"
    BAD_INPUT = "bad_input"
    BACKEND_ERROR = "backend_error"
    SHUTTING_DOWN = "shutting_down"


_REASON_OF_CODE: dict[str | None, RejectionReason] = {
    ErrorCode.SLO_UNATTAINABLE: RejectionReason.SLO_UNATTAINABLE,
    ErrorCode.CAPACITY_UNAVAILABLE: RejectionReason.CAPACITY_UNAVAILABLE,
    ErrorCode.DISPLACED: RejectionReason.DISPLACED,
    ErrorCode.QUEUE_FULL: RejectionReason.QUEUE_FULL,
    ErrorCode.QUEUE_TIMEOUT: RejectionReason.QUEUE_FULL,
    ErrorCode.DAILY_BUDGET_EXCEEDED: RejectionReason.BUDGET,
    ErrorCode.MONTHLY_BUDGET_EXCEEDED: RejectionReason.BUDGET,
    ErrorCode.DAILY_AUDIO_BUDGET_EXCEEDED: RejectionReason.BUDGET,
    ErrorCode.MONTHLY_AUDIO_BUDGET_EXCEEDED: RejectionReason.BUDGET,
    ErrorCode.SHUTTING_DOWN: RejectionReason.SHUTTING_DOWN,
}
CAPACITY_REJECTIONS = frozenset(
    {
        RejectionReason.SLO_UNATTAINABLE,
        RejectionReason.CAPACITY_UNAVAILABLE,
        RejectionReason.DISPLACED,
        RejectionReason.QUEUE_FULL,
    }
)
"""Refusals for lack of capacity: they count against the class's SLO attainment."""


def rejection_reason(status: int, code: str | None) -> RejectionReason:
    """The rejections-metric reason of a refusal with this status and code."""
    reason = _REASON_OF_CODE.get(code)
    if reason is not None:
        return reason
    if status == 429:
        return RejectionReason.QUOTA
    if status >= 500:
        return RejectionReason.BACKEND_ERROR
    return RejectionReason.BAD_INPUT


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
