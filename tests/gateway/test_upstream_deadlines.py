"""Upstream deadlines (first byte, idle gap, total) through a real gateway; limits are far from the stalls.

Each stalling backend waits seconds where the policy allows a fraction of one, so CPU contention cannot
flip an outcome; what is asserted is the outcome (status, error event, upstream closed), never a duration.
"""

from __future__ import annotations

import socket
from pathlib import Path

import anyio
import httpx
import orjson
import pytest
from starlette.types import Receive, Scope, Send

from gateway.relay.sse import error_event
from tests.support.fake_sglang import expected_stream
from tests.support.servers import serve
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
STALL_S = 5.0


def _limits(policy_file: Path, *, first_byte: float = 30, idle: float = 30, total: float = 60) -> None:
    policy_file.write_text(
        "version: 1\npool_defaults:\n"
        f"  timeouts: {{connect: 1.0, first_byte: {first_byte}, idle: {idle}, total: {total}}}\n"
    )


def _post(url: str, body: dict, rid: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"x-request-id": rid}, timeout=20)


class SilentBackend:
    """Healthy, but sits on every completion request without answering; records when the gateway hangs up."""

    def __init__(self) -> None:
        self.started = 0
        self.hung_up = 0
        self.ended = 0  # `/abort_request` calls: the gateway asks it to end what it left, then hangs up

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                phase = (await receive())["type"].split(".")[1]
                await send({"type": f"lifespan.{phase}.complete"})
                if phase == "shutdown":
                    return
        if scope["method"] == "GET" or scope["path"] == "/abort_request":  # an end it does not act on
            self.ended += scope["path"] == "/abort_request"
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}" if "info" in scope["path"] else b""})
            return
        self.started += 1
        with anyio.move_on_after(STALL_S):
            while (await receive())["type"] != "http.disconnect":
                pass
            self.hung_up += 1


def test_first_byte_deadline_answers_504_and_hangs_up(start_gateway, policy_file):
    _limits(policy_file, first_byte=0.3)
    backend = SilentBackend()
    with serve(backend) as server:
        gw = start_gateway([server.url])
        resp = _post(gw.url, {**CHAT, "stream": True}, rid="fb-1")
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "backend_first_byte"
        assert wait_for(lambda: backend.hung_up == 1)


def test_total_deadline_for_a_whole_response_answers_504(start_gateway, policy_file):
    _limits(policy_file, total=0.3)
    backend = SilentBackend()
    with serve(backend) as server:
        gw = start_gateway([server.url])
        resp = _post(gw.url, CHAT, rid="tot-1")
        assert resp.status_code == 504
        assert resp.json()["error"]["code"] == "backend_total_timeout"
        assert wait_for(lambda: backend.hung_up == 1)


def _first_event_then_error(content: bytes, rid: str) -> dict:
    first = expected_stream(f"chatcmpl-{rid}", "test-model", 4, False, 7).split(b"\n\n")[0] + b"\n\n"
    assert content.startswith(first)
    tail = content[len(first) :]
    error = orjson.loads(tail.split(b"\n\n")[0][len(b"data: ") :])
    assert tail == error_event(error["error"]["message"], 504)
    return error["error"]


def test_idle_gap_mid_stream_sends_error_event_and_cancels_upstream(
    start_backend, start_gateway, policy_file
):
    _limits(policy_file, idle=0.3)
    backend = start_backend(token_delay=STALL_S)
    gw = start_gateway([backend.url])
    resp = _post(gw.url, {**CHAT, "stream": True}, rid="idle-1")
    assert resp.status_code == 200
    error = _first_event_then_error(resp.content, "idle-1")
    assert error["message"] == "Backend sent nothing for 0.3 s."
    assert wait_for(lambda: [rid for rid, _ in backend.record.aborted] == ["idle-1"])


def test_total_deadline_mid_stream_sends_error_event(start_backend, start_gateway, policy_file):
    _limits(policy_file, idle=30, total=0.5)
    backend = start_backend(token_delay=STALL_S)
    gw = start_gateway([backend.url])
    resp = _post(gw.url, {**CHAT, "stream": True}, rid="total-1")
    assert resp.status_code == 200
    error = _first_event_then_error(resp.content, "total-1")
    assert error["message"] == "Backend exceeded the total request time limit."
    assert wait_for(lambda: [rid for rid, _ in backend.record.aborted] == ["total-1"])


def test_slow_but_steady_stream_is_not_an_idle_gap(start_backend, start_gateway, policy_file):
    """Gaps 20x under the idle limit for twice its length: the timer re-arms and the stream completes."""
    _limits(policy_file, idle=1.0)
    backend = start_backend(token_delay=0.05)
    gw = start_gateway([backend.url])
    resp = _post(gw.url, {**CHAT, "stream": True, "max_tokens": 40}, rid="steady-1")
    assert resp.content == expected_stream("chatcmpl-steady-1", "test-model", 40, False, 7)


def test_client_leaving_a_whole_request_hangs_up_on_the_backend(start_gateway, policy_file):
    """Non-streaming too: the client's disconnect closes the upstream connection (SGLang aborts on it)."""
    _limits(policy_file)
    backend = SilentBackend()
    with serve(backend) as server:
        gw = start_gateway([server.url])
        body = orjson.dumps(CHAT)
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        )
        with socket.create_connection(("127.0.0.1", gw.port)) as client:
            client.sendall(head.encode() + body)
            assert wait_for(lambda: backend.started == 1)
        assert wait_for(lambda: backend.hung_up == 1)
        assert backend.ended >= 1  # asked to end it by its rid first (SGLang answers with its usage)
