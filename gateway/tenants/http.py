"""Small HTTP helpers for the tenants routes: JSON bodies in, JSON or ApiError bodies out.

Routes here render their own errors, so they behave the same mounted in the gateway or in a bare test app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from gateway.request.errors import ApiError, ErrorCode
from gateway.settings.schema import describe, location

M = TypeVar("M", bound=BaseModel)
Endpoint = Callable[[Request], Awaitable[Response]]


def json_response(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


def error_response(err: ApiError) -> Response:
    return Response(
        err.body_bytes(), err.status, headers=err.response_headers(), media_type="application/json"
    )


def validation_error(err: ValidationError) -> ApiError:
    """400 naming every invalid field; `param` is the first."""
    loc = location(err)
    return ApiError(400, describe(err), code=ErrorCode.INVALID_REQUEST, param=loc or None)


async def parse_body(request: Request, model: type[M], *, empty_ok: bool = False) -> M:
    """The request's JSON object validated as `model`, strictly (the types the OpenAPI document
    publishes: no boolean for a number, no string for an integer); 400 naming the field otherwise.
    pydantic parses the JSON itself so that large integers stay exact (and meet their bounds)."""
    raw = await request.body()
    if not raw.strip() and empty_ok:
        raw = b"{}"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ApiError(400, "Request body is not valid JSON.", code=ErrorCode.INVALID_JSON) from None
    if not isinstance(data, dict):
        raise ApiError(400, "Request body must be a JSON object.", code=ErrorCode.INVALID_JSON)
    try:
        return model.model_validate_json(raw, strict=True)
    except ValidationError as e:
        raise validation_error(e) from None


def int_query(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise ApiError(
            400, f"{name} must be an integer from {lo} to {hi}.", code=ErrorCode.INVALID_REQUEST, param=name
        )
    return value


def rendering_errors(handler: Endpoint) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as e:
            return error_response(e)

    return endpoint
