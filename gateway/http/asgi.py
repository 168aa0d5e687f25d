"""Small ASGI helpers: a request-id + access-log middleware, a request whose headers are looked up in a dict,
and safe response sending."""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.observability import metrics
from gateway.request.errors import ApiError

access_log = logging.getLogger("omnigate.access")
_RID_OK = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_duration = functools.cache(metrics.REQUEST_DURATION.labels)  # (route, status): bounded, looked up once each


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"x-request-id":
            rid = value.decode("latin-1")
            if _RID_OK.match(rid):
                return rid
    return os.urandom(16).hex()


class RequestIdMiddleware:
    """Give every response an `x-request-id` and log one JSON line per request (no secrets, no prompts).

    Completion routes log their own richer line (gateway/observability/accesslog.py) and mark it done.
    """

    def __init__(self, app: ASGIApp, enabled_log: bool = True) -> None:
        self.app = app
        self.enabled_log = enabled_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_from(scope["headers"])
        scope.setdefault("state", {})["request_id"] = rid
        start = time.monotonic()
        status = 0
        rid_header = (b"x-request-id", rid.encode())

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), rid_header]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            duration = time.monotonic() - start
            route = scope.get("route")
            path = getattr(route, "path", "unmatched")
            _duration(path, str(status)).observe(duration)
            if self.enabled_log and not scope["state"].get("access_logged"):
                record: dict[str, Any] = {
                    "ts": round(time.time(), 3),
                    "request_id": rid,
                    "method": scope["method"],
                    "path": path,
                    "status": status,
                    "duration_ms": round(duration * 1000, 2),
                }
                access_log.info(orjson.dumps(record).decode())


class IndexedHeaders(Headers):
    """Starlette's headers with each name's first value in a dict: a completion reads about eight headers,
    and each of Starlette's lookups scans the whole list in Python."""

    def __init__(self, scope: Scope) -> None:
        super().__init__(scope=scope)
        self._first = dict(reversed(self._list))

    def get(self, key: str, default: Any = None) -> Any:
        value = self._first.get(key.lower().encode("latin-1"))
        return default if value is None else value.decode("latin-1")

    def __getitem__(self, key: str) -> str:
        value = self._first.get(key.lower().encode("latin-1"))
        if value is None:
            raise KeyError(key)
        return value.decode("latin-1")

    def __contains__(self, key: Any) -> bool:
        return key.lower().encode("latin-1") in self._first


class IndexedRequest(Request):
    """A Starlette request with `IndexedHeaders`."""

    @property
    def headers(self) -> Headers:
        if not hasattr(self, "_headers"):
            self._headers = IndexedHeaders(self.scope)
        return self._headers


async def send_json(
    send: Send,
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    media_type: str = "application/json",
) -> None:
    raw_headers = [(b"content-type", media_type.encode()), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, err: ApiError, headers: dict[str, str] | None = None) -> None:
    await send_json(send, err.status, err.body_bytes(), {**(headers or {}), **err.response_headers()})
