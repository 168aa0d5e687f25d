"""HTTP limits at the edge: what uvicorn's protocol does not bound, bounded before any request is parsed.

uvicorn's httptools protocol keeps every header byte a peer sends (one 50 MB header is answered 200), arms
its keep-alive timer only after a response — a fresh connection, or a kept-alive one that has started its
next request, may send its headers as slowly as it likes, forever — and `limit_concurrency` answers only
once a request's headers are complete. This subclass adds, per connection:

- **a header-size cap** (`limits.max_header_bytes`, request line and headers): the bytes received while a
  request's headers are incomplete are counted before they reach the parser; past the cap the peer gets
  431 and the connection closes, so one connection holds at most the cap plus one socket read;
- **a header-read timeout** (`limits.header_timeout_s`), from the connection's start or a request's
  first byte until its headers are complete: 408, then close;
- **a connection limit** (`limits.max_connections`): a connection beyond it is answered 503
  `too_many_connections` with `Retry-After` at once and closed, before it can hold anything.

Each request's scope carries a `DisconnectHook` (gateway/http/disconnect.py), fired when the connection is
lost before its response completed: the completion routes learn that their client left without a task of
their own waiting for `http.disconnect`.

It also sends each response's header block together with the first body bytes of the same loop turn
(`HeadCork`): uvicorn writes the head as soon as the app starts the response, so a whole response would
take two sends, and on loopback or a LAN a send costs about as much CPU as the Python that built the reply.

The keep-alive idle timeout between requests is uvicorn's own (`timeout_keep_alive`, set from
`limits.keepalive_timeout_s`). Every refusal is an OpenAI-style JSON error with `Connection: close`,
counted in `omnigate_edge_refusals_total{reason}`.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.http.disconnect import EXTENSION, DisconnectHook
from gateway.observability import metrics
from gateway.request.errors import ApiError, ErrorCode
from gateway.settings.config import LimitsConfig

_HEADER_OVERHEAD = 4  # ": " and CRLF around each header


def _raw_response(err: ApiError) -> bytes:
    body = err.body_bytes()
    head = [STATUS_LINE[err.status], b"content-type: application/json\r\n"]
    head.append(b"content-length: %d\r\n" % len(body))
    head += [f"{k}: {v}\r\n".encode("latin-1") for k, v in err.response_headers().items()]
    head.append(b"connection: close\r\n\r\n")
    return b"".join(head) + body


HEADERS_TOO_LARGE = "headers_too_large"
HEADER_TIMEOUT = "header_timeout"
TOO_MANY_CONNECTIONS = "too_many_connections"
BAD_REQUEST = "bad_request"


_CORK_MAX = 65536  # a body past this is written after the head rather than copied onto it


class HeadCork:
    """One response's transport while its head is out: holds the first write (uvicorn's header block) until
    the next write or the end of this loop turn, whichever comes first, and sends both as one; then hands
    `owner` (the request's cycle) its transport back, so the rest of the response pays no wrapper."""

    __slots__ = ("_held", "_owner", "_transport")

    def __init__(self, owner: Any, transport: asyncio.Transport) -> None:
        self._owner = owner
        self._transport = transport
        self._held: bytes | None = None
        owner.transport = self

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            asyncio.get_running_loop().call_soon(self.flush)
            return
        self._uncork()
        if len(data) <= _CORK_MAX:
            self._transport.write(held + data)
        else:
            self._transport.write(held)
            self._transport.write(data)

    def flush(self) -> None:
        held = self._held
        if held is None:
            return  # nothing held, or it left with the body
        self._uncork()
        if not self._transport.is_closing():
            self._transport.write(held)

    def _uncork(self) -> None:
        self._held = None
        self._owner.transport = self._transport

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above; `limits` is set by `edge_protocol`."""

    limits: ClassVar[LimitsConfig]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_headers = True  # a request's headers are incomplete (or none has started)
        self._header_bytes = 0  # received while they were
        self._header_timer: asyncio.TimerHandle | None = None
        self._refused = False  # answered and closing: whatever else arrives is dropped

    # -- the limits ------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(
                ApiError(
                    503,
                    "The gateway has too many open connections; retry shortly.",
                    code=ErrorCode.TOO_MANY_CONNECTIONS,
                    retry_after=1,
                ),
                TOO_MANY_CONNECTIONS,
            )
            return
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {EXTENSION: {"hook": DisconnectHook()}}

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._reading_headers:
            if self._header_bytes > self.limits.max_header_bytes:
                self._headers_too_large()
                return
            if self._header_timer is None:  # the next request on a kept-alive connection has begun
                self._arm_header_timer()
            self._header_bytes += len(data)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._cancel_header_timer()
        size = len(self.url) + sum(len(n) + len(v) + _HEADER_OVERHEAD for n, v in self.headers)
        if size > self.limits.max_header_bytes:  # a whole oversized block in one read
            self._headers_too_large()
            return
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.transport is self.transport:
            HeadCork(cycle, self.transport)

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._reading_headers, self._header_bytes = True, 0  # what comes next is the next request

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)
        cycle = self.cycle
        if cycle is not None and cycle.disconnected:  # lost before its response completed
            hook = cycle.scope["extensions"][EXTENSION]["hook"]
            if isinstance(hook, DisconnectHook):
                hook.fire()

    def send_400_response(self, msg: str) -> None:
        """A request the parser cannot read: an OpenAI-style 400 rather than uvicorn's plain text."""
        self._refuse(ApiError(400, f"Invalid HTTP request: {msg}", code=ErrorCode.INVALID_HTTP), BAD_REQUEST)

    # -- helpers ---------------------------------------------------------------------------------
    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._reading_headers and not self.transport.is_closing():
            message = f"The request's headers did not arrive within {self.limits.header_timeout_s:g} s."
            self._refuse(ApiError(408, message, code=ErrorCode.HEADER_TIMEOUT), HEADER_TIMEOUT)

    def _headers_too_large(self) -> None:
        message = f"The request line and headers exceed {self.limits.max_header_bytes} bytes."
        self._refuse(ApiError(431, message, code=ErrorCode.HEADERS_TOO_LARGE), HEADERS_TOO_LARGE)

    def _refuse(self, err: ApiError, reason: str) -> None:
        self._refused = True
        self._cancel_header_timer()
        metrics.EDGE_REFUSALS.labels(reason).inc()
        if not self.transport.is_closing():
            self.transport.write(_raw_response(err))
            self.transport.close()


def edge_protocol(limits: LimitsConfig) -> type[EdgeProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to these limits."""
    return type("EdgeProtocol", (EdgeProtocol,), {"limits": limits})
