"""HTTP limits at the edge, against a real `omnigate serve` process over raw sockets: oversized headers get
431 (also unfinished ones, long before they end), slow or silent connections 408, idle kept-alive ones are
closed, a connection over the limit gets 503 `too_many_connections` — each an OpenAI-style JSON error with
`Connection: close` — and every refusal is counted."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.observability.exposition import sample_sum, sample_value
from tests.support.processes import ManagedProcess, Processes
from tests.support.servers import free_port

pytestmark = pytest.mark.e2e

HEADER_CAP = 4096


def _gateway(tmp_path: Path, **limits: Any) -> Iterator[ManagedProcess]:
    group = Processes(tmp_path)
    (tmp_path / "policy.yaml").write_text("version: 1\n")
    config = {
        "policy_path": str(tmp_path / "policy.yaml"),
        "watch_policy": False,
        "auth": {"required": False},
        "store": {"kind": "memory"},
        "access_log": False,
        "limits": limits,
        "pools": [{"name": "interactive", "models": ["m"], "backends": [f"http://127.0.0.1:{free_port()}"]}],
    }
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    try:  # no backend: /readyz stays 503; the process is up once /healthz answers
        yield group.gateway(tmp_path / "gateway.yaml", ready_path="/healthz")
    finally:
        group.close()


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[ManagedProcess]:
    yield from _gateway(tmp_path, max_header_bytes=HEADER_CAP, header_timeout_s=0.5, keepalive_timeout_s=1)


@pytest.fixture
def few_connections(tmp_path: Path) -> Iterator[ManagedProcess]:
    yield from _gateway(tmp_path, max_connections=4, header_timeout_s=30)


def _connect(gw: ManagedProcess) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
    s.settimeout(5)
    return s


def _read_all(s: socket.socket) -> bytes:
    """Everything until the server closes (the refusals all close)."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def _read_one(s: socket.socket) -> bytes:
    """One whole response on a kept-alive connection (head and body may come in separate reads)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        raw += s.recv(65536)
    head, _, body = raw.partition(b"\r\n\r\n")
    length = next(
        int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += s.recv(65536)
    return raw


def _response(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, orjson.loads(body) if body else None


def _refusals(gw: ManagedProcess, reason: str) -> float:
    text = httpx.get(gw.url + "/metrics").text
    return sample_value(text, "omnigate_edge_refusals_total", reason=reason) or 0.0


def test_oversized_headers_are_431_even_unfinished(strict: ManagedProcess) -> None:
    with _connect(strict) as s:  # one block over the cap, complete
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * HEADER_CAP + b"\r\n\r\n")
        status, headers, body = _response(_read_all(s))
    assert (status, headers["connection"], body["error"]["code"]) == (
        431,
        "close",
        "request_header_fields_too_large",
    )
    assert body["error"]["message"] == f"The request line and headers exceed {HEADER_CAP} bytes."

    sent = 0
    with _connect(strict) as s:  # a header that never ends: cut long before its 50 MB
        s.sendall(b"GET /healthz HTTP/1.1\r\nX-Endless: ")
        with pytest.raises(OSError):  # the server refused and closed with our bytes unread: a reset
            while sent < 50_000_000:
                s.sendall(b"a" * 65536)
                sent += 65536
                time.sleep(0.001)
    assert sent < 4_000_000, sent  # what the kernel buffers took before the reset, not the 50 MB
    assert _refusals(strict, "headers_too_large") == 2
    r = httpx.get(strict.url + "/healthz", headers={"x-fine": "a" * (HEADER_CAP // 2)})
    assert r.status_code == 200  # under the cap is served as ever


def test_slow_and_silent_connections_get_408_and_are_closed(strict: ManagedProcess) -> None:
    with _connect(strict) as silent, _connect(strict) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line
        start = time.monotonic()
        for s in (silent, slow):
            status, headers, body = _response(_read_all(s))
            assert (status, headers["connection"], body["error"]["code"]) == (
                408,
                "close",
                "request_header_timeout",
            )
        assert 0.4 < time.monotonic() - start < 3.0
    assert _refusals(strict, "header_timeout") == 2


def test_idle_kept_alive_connections_close_and_a_stalled_next_request_gets_408(
    strict: ManagedProcess,
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with _connect(strict) as s:
        s.sendall(request)
        assert _read_one(s).startswith(b"HTTP/1.1 200")
        start = time.monotonic()
        assert s.recv(65536) == b""  # closed by the keep-alive timeout, nothing sent
        assert 0.9 < time.monotonic() - start < 3.0
    with _connect(strict) as s:
        s.sendall(request)
        assert _read_one(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request starts, and stalls
        status, _, body = _response(_read_all(s))
        assert (status, body["error"]["code"]) == (408, "request_header_timeout")


def test_a_connection_over_the_limit_is_answered_503_and_closed(few_connections: ManagedProcess) -> None:
    gw = few_connections
    held = [_connect(gw) for _ in range(4)]
    try:
        time.sleep(0.2)  # the server has accepted them
        with _connect(gw) as extra:
            status, headers, body = _response(_read_all(extra))
        assert (status, headers["connection"], headers["retry-after"]) == (503, "close", "1")
        assert body["error"] == {
            "message": "The gateway has too many open connections; retry shortly.",
            "type": "service_unavailable",
            "param": None,
            "code": "too_many_connections",
        }
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert httpx.get(gw.url + "/healthz").status_code == 200  # room again
    assert _refusals(gw, "too_many_connections") == 1


def test_a_request_the_parser_cannot_read_is_a_json_400(strict: ManagedProcess) -> None:
    with _connect(strict) as s:
        s.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        status, headers, body = _response(_read_all(s))
    assert (status, headers["connection"], body["error"]["code"]) == (400, "close", "invalid_http")
    assert _refusals(strict, "bad_request") == 1


def test_a_client_that_leaves_while_sending_its_body_is_cancelled_not_a_500(
    few_connections: ManagedProcess,
) -> None:
    """The body is cut short (the connection closes after 10 of its 1,000 bytes): the request ends as
    the client's cancel, not as an internal error that raises an alert."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n"
    )
    with _connect(few_connections) as s:
        s.sendall(head + b'{"model": ')
    text = ""
    for _ in range(100):  # the request is counted once the gateway noticed the close
        text = httpx.get(few_connections.url + "/metrics").text
        if sample_sum(text, "omnigate_requests_total"):
            break
        time.sleep(0.05)
    assert sample_sum(text, "omnigate_requests_total", outcome="cancelled") == 1
    assert sample_sum(text, "omnigate_requests_total", outcome="internal_error") == 0
