"""Policy hot reload: valid changes apply live, invalid ones change nothing, requests are never dropped."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.gateway.conftest import ADMIN
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

AUTH = {"authorization": f"Bearer {ADMIN}"}
CHAT = {
    "model": "test-model",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 3,
    "stream": True,
}


def _policy(gw) -> dict:
    return httpx.get(gw.url + "/admin/policy", headers=AUTH).json()


def test_reload_applies_valid_change_and_reports_diff(start_backend, start_gateway, policy_file):
    gw = start_gateway([start_backend().url], watch_policy=False)
    policy_file.write_text("version: 1\npool_defaults:\n  retries: 0\n")
    resp = httpx.post(gw.url + "/admin/policy/reload", headers=AUTH)
    assert resp.status_code == 200
    body = resp.json()
    assert body["result"] == "applied"
    assert "~ pool_defaults.retries: 1 -> 0" in body["changes"]
    assert _policy(gw)["policy"]["pool_defaults"]["retries"] == 0
    again = httpx.post(gw.url + "/admin/policy/reload", headers=AUTH).json()
    assert again == {"result": "unchanged", "changes": [], "error": None}


def test_invalid_policy_changes_nothing(start_backend, start_gateway, policy_file):
    gw = start_gateway([start_backend().url], watch_policy=False)
    before = _policy(gw)["policy"]
    policy_file.write_text("version: 1\npool_defaults:\n  retries: -4\n  bogus: 1\n")
    resp = httpx.post(gw.url + "/admin/policy/reload", headers=AUTH)
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert "pool_defaults.retries" in error and "pool_defaults.bogus" in error
    state = _policy(gw)
    assert state["policy"] == before
    assert state["last_error"] == error
    metrics = httpx.get(gw.url + "/metrics").text
    assert 'omnigate_policy_reloads_total{result="invalid"}' in metrics
    policy_file.write_text("not: [valid")
    assert httpx.post(gw.url + "/admin/policy/reload", headers=AUTH).json()["result"] == "invalid"
    assert _policy(gw)["policy"] == before


def test_file_change_reloads_without_any_call(start_backend, start_gateway, policy_file):
    gw = start_gateway([start_backend().url])
    policy_file.write_text("version: 1\npool_defaults:\n  timeouts: {idle: 7.5}\n")
    assert wait_for(lambda: _policy(gw)["policy"]["pool_defaults"]["timeouts"]["idle"] == 7.5, timeout=10)


def test_fifty_reloads_during_traffic_drop_no_request(start_backend, start_gateway, policy_file):
    gw = start_gateway([start_backend(token_delay=0.002).url], watch_policy=False)
    statuses: list[int] = []
    bodies_ok: list[bool] = []
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(timeout=10) as client:
            for _ in range(400):
                if stop.is_set():
                    break
                r = client.post(gw.url + "/v1/chat/completions", json=CHAT)
                statuses.append(r.status_code)
                bodies_ok.append(r.content.endswith(b"data: [DONE]\n\n") and b'"error"' not in r.content)

    workers = [threading.Thread(target=traffic) for _ in range(4)]
    for w in workers:
        w.start()
    results = []
    for i in range(50):
        policy_file.write_text(f"version: 1\npool_defaults:\n  timeouts: {{idle: {10 + i}}}\n")
        results.append(httpx.post(gw.url + "/admin/policy/reload", headers=AUTH).json()["result"])
    stop.set()
    for w in workers:
        w.join()
    assert results == ["applied"] * 50
    assert statuses and set(statuses) == {200}
    assert all(bodies_ok)
