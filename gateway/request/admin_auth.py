"""Admin bearer-token check shared by every /admin route (constant-time comparison)."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from gateway.request.errors import ApiError, ErrorCode


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def require_admin(request: Request, admin_token: str | None) -> None:
    """Raise 401 without a token, 403 with a wrong one (tenant keys included), 503 if none is configured."""
    if not admin_token:
        raise ApiError(
            503, "Admin API is disabled: no admin token configured.", code=ErrorCode.ADMIN_DISABLED
        )
    token = bearer_token(request)
    if token is None:
        raise ApiError(401, "Missing admin bearer token.", code=ErrorCode.MISSING_ADMIN_TOKEN)
    if not hmac.compare_digest(token.encode(), admin_token.encode()):
        raise ApiError(403, "Invalid admin token.", code=ErrorCode.INVALID_ADMIN_TOKEN)
