"""A backend's error body as the client's OpenAI error, whatever shape the server wrote it in."""

from __future__ import annotations

import orjson
import pytest

from gateway.backends.kinds.errors import upstream_error


def _body(obj: object) -> bytes:
    return orjson.dumps(obj)


def test_sglang_error_object_keeps_message_type_and_code() -> None:
    raw = _body(
        {"object": "error", "message": "too long", "type": "BadRequestError", "param": None, "code": 400}
    )
    e = upstream_error(400, raw)
    assert (e.status, e.message, e.type, e.code) == (400, "too long", "BadRequestError", "400")


def test_nested_openai_error_is_read_from_inside() -> None:
    raw = _body({"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limited"}})
    e = upstream_error(429, raw)
    assert (e.status, e.message, e.type, e.code) == (429, "slow down", "rate_limit_error", "rate_limited")


def test_fastapi_detail_string_is_the_message() -> None:
    e = upstream_error(400, _body({"detail": "Preprocessing failed"}))
    assert (e.status, e.message, e.type, e.code) == (
        400,
        "Preprocessing failed",
        "invalid_request_error",
        "upstream_error",
    )


@pytest.mark.parametrize("raw", [b"", b"Internal Server Error", b"[1, 2]", _body({"detail": ""})])
def test_a_body_without_a_message_says_the_status(raw: bytes) -> None:
    e = upstream_error(500, raw)
    assert (e.status, e.message, e.type, e.code) == (
        502,
        "Backend returned HTTP 500.",
        "upstream_error",
        "upstream_error",
    )


@pytest.mark.parametrize(("status", "mapped"), [(401, 502), (403, 502), (503, 503), (504, 502), (418, 502)])
def test_statuses_the_client_cannot_act_on_become_a_gateway_status(status: int, mapped: int) -> None:
    assert upstream_error(status, b"").status == mapped
