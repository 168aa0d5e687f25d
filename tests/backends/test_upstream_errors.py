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


def test_fastapi_validation_list_names_each_field() -> None:
    detail = [
        {"type": "missing", "loc": ["body", "messages"], "msg": "Field required", "input": {}},
        {"type": "string_type", "loc": ["body", "stop", "str"], "msg": "Input should be a valid string"},
        {"type": "int_type", "loc": ["body", "messages", 0, "content", 2], "msg": "Bad part"},
    ]
    e = upstream_error(422, _body({"detail": detail}))
    assert (e.status, e.param, e.type, e.code) == (422, "messages", "invalid_request_error", "upstream_error")
    assert e.message == (
        "messages: Field required; stop.str: Input should be a valid string; messages[0].content[2]: Bad part"
    )


def test_a_validation_error_without_a_location_is_its_message() -> None:
    e = upstream_error(422, _body({"detail": [{"msg": "Invalid JSON"}, "junk"]}))
    assert (e.message, e.param) == ("Invalid JSON", None)


def test_a_validation_list_without_messages_says_the_status() -> None:
    e = upstream_error(422, _body({"detail": [{"loc": ["body"]}]}))
    assert (e.status, e.message) == (422, "Backend returned HTTP 422.")


def test_a_detail_object_gives_its_message() -> None:
    e = upstream_error(409, _body({"detail": {"success": False, "message": "mixed stage weight_version"}}))
    assert (e.status, e.message) == (409, "mixed stage weight_version")
