"""Every bad input gets a clear OpenAI-style error with the right status, and the gateway keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.gateway.conftest import ADMIN

pytestmark = pytest.mark.e2e

GOOD = b'{"model":"test-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


@pytest.fixture
def gw(start_backend, start_gateway):
    backend = start_backend()
    return start_gateway([backend.url], limits={"max_body_bytes": 4096})


def _post(gw, content: bytes, ctype: str = "application/json", path: str = "/v1/chat/completions"):
    return httpx.post(gw.url + path, content=content, headers={"content-type": ctype}, timeout=10)


@pytest.mark.parametrize(
    ("content", "ctype", "status", "code", "param"),
    [
        (GOOD, "text/plain", 415, "unsupported_media_type", None),
        (b"", "application/json", 400, "invalid_json", None),
        (b"{not json", "application/json", 400, "invalid_json", None),
        (b"[1, 2]", "application/json", 400, "invalid_json", None),
        (
            b'{"messages":[{"role":"user","content":"hi"}]}',
            "application/json",
            400,
            "missing_required_parameter",
            "model",
        ),
        (b'{"model":5,"messages":[]}', "application/json", 400, "invalid_type", "model"),
        (b'{"model":"test-model"}', "application/json", 400, "missing_required_parameter", "messages"),
        (b'{"model":"test-model","messages":"hi"}', "application/json", 400, "invalid_type", "messages"),
        (b'{"model":"test-model","messages":[]}', "application/json", 400, "invalid_value", "messages"),
        (b'{"model":"test-model","messages":[5]}', "application/json", 400, "invalid_type", "messages[0]"),
        (
            b'{"model":"test-model","messages":[{"content":"x"}]}',
            "application/json",
            400,
            "invalid_type",
            "messages[0].role",
        ),
        (
            b'{"model":"test-model","messages":[{"role":"wizard","content":"x"}]}',
            "application/json",
            400,
            "invalid_value",
            "messages[0].role",
        ),
        (
            b'{"model":"test-model","messages":[{"role":"user","content":7}]}',
            "application/json",
            400,
            "invalid_type",
            "messages[0].content",
        ),
        (
            b'{"model":"test-model","messages":[{"role":"user","content":"x"}],"stream":"yes"}',
            "application/json",
            400,
            "invalid_type",
            "stream",
        ),
        (
            b'{"model":"test-model","messages":[{"role":"user","content":"x"}],"max_tokens":"10"}',
            "application/json",
            400,
            "invalid_type",
            "max_tokens",
        ),
        (
            b'{"model":"test-model","messages":[{"role":"user","content":"x"}],"max_tokens":-1}',
            "application/json",
            400,
            "invalid_value",
            "max_tokens",
        ),
        (
            b'{"model":"test-model","messages":[{"role":"user","content":"x"}],"n":3}',
            "application/json",
            400,
            "invalid_value",
            "n",
        ),
        (
            b'{"model":"nope","messages":[{"role":"user","content":"x"}]}',
            "application/json",
            404,
            "model_not_found",
            "model",
        ),
        (b'{"x":"' + b"a" * 5000 + b'"}', "application/json", 413, "request_too_large", None),
    ],
)
def test_bad_input_is_refused_clearly(gw, content, ctype, status, code, param):
    resp = _post(gw, content, ctype)
    assert resp.status_code == status
    body = resp.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["param"] == param
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert resp.headers["x-request-id"]
    # the gateway keeps serving good requests after every bad one
    assert _post(gw, GOOD).status_code == 200


def test_completions_endpoint_validates_prompt(gw):
    resp = _post(gw, b'{"model":"test-model"}', path="/v1/completions")
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "prompt"
    ok = _post(gw, b'{"model":"test-model","prompt":"hello","max_tokens":2}', path="/v1/completions")
    assert ok.status_code == 200


def test_unknown_route_and_method(gw):
    assert httpx.get(gw.url + "/v1/nothing").json()["error"]["code"] == "not_found"
    resp = httpx.get(gw.url + "/v1/chat/completions")
    assert resp.status_code == 405
    assert resp.json()["error"]["code"] == "method_not_allowed"


def test_unknown_traffic_class(gw):
    resp = httpx.post(
        gw.url + "/v1/chat/completions",
        content=GOOD,
        headers={"content-type": "application/json", "x-omnigate-class": "gold"},
    )
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_traffic_class"


def test_client_request_id_is_echoed_and_bad_ones_replaced(gw):
    assert (
        httpx.get(gw.url + "/healthz", headers={"x-request-id": "abc-123"}).headers["x-request-id"]
        == "abc-123"
    )
    replaced = httpx.get(gw.url + "/healthz", headers={"x-request-id": "bad id\twith spaces"})
    assert replaced.headers["x-request-id"] != "bad id\twith spaces"
    assert len(replaced.headers["x-request-id"]) == 32


@pytest.mark.parametrize(("token", "status"), [(None, 401), ("wrong", 403), (ADMIN, 200)])
def test_admin_routes_need_the_admin_token(gw, token, status):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    assert httpx.get(gw.url + "/admin/policy", headers=headers).status_code == status
