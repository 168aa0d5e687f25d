"""Fixtures for end-to-end tests: real `omnigate serve` processes in front of a simulated backend.

A module shares one simulator (fast, `--time-scale 50`); each test starts its own gateways (and a private
redis-server when it needs to kill one) through `procs`, which stops them all at teardown. Tests that share
the suite's redis-server (`redis_url`, tests/conftest.py) get a key prefix of their own (`redis_prefix`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.support.processes import ManagedProcess, Processes

ADMIN_TOKEN = "e2e-admin-token-6f1c2a9b"
MODEL = "test-model"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """One simulated SGLang backend for the module; 50x time scale so a 300-token answer takes ~60 ms."""
    group = Processes(tmp_path_factory.mktemp("sim"))
    try:
        yield group.sim("--time-scale", "50", "--model", MODEL, "--seed", "1")
    finally:
        group.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    group = Processes(tmp_path)
    try:
        yield group
    finally:
        group.close()


def write_config(
    path: Path,
    backend: str,
    store: dict[str, Any],
    tenants: list[dict[str, Any]] | None = None,
    pool: dict[str, Any] | None = None,
) -> Path:
    """A gateway.yaml (and a minimal policy next to it) for one pool on `backend`, auth required; `pool`
    overrides fields of the pool entry (its kind, backends, models)."""
    policy = path.with_name(path.stem + "-policy.yaml")
    policy.write_text("version: 1\n")
    if store.get("kind") == "redis":
        # The request path's deadline on Redis (50 ms by default) is test_slow_store_e2e.py's subject, which
        # sets its own. Elsewhere this loaded 2-core box misses it now and then, and a test of something
        # else would meet fail-open (and a 503 for a key not yet cached) instead.
        store = {"deadline_s": 1.0, **store}
    config = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "policy_path": str(policy),
        "watch_policy": False,
        "admin": {"token": ADMIN_TOKEN},
        "auth": {"required": True},
        "store": store,
        "pools": [
            {
                "name": "interactive",
                "models": [MODEL],
                "backends": [backend],
                "health_interval_s": 0.5,
                **(pool or {}),
            }
        ],
        "tenants": tenants or [],
    }
    path.write_text(yaml.safe_dump(config))
    return path


class Admin:
    """The admin API of one gateway over HTTP; every call asserts the status it expects."""

    def __init__(self, url: str, token: str = ADMIN_TOKEN) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=10.0, trust_env=False
        )

    def call(self, method: str, path: str, expect: int = 200, **kwargs: Any) -> Any:
        resp = self.http.request(method, path, **kwargs)
        assert resp.status_code == expect, f"{method} {path}: {resp.status_code} {resp.text}"
        return resp.json()

    def create_tenant(self, tenant_id: str, **fields: Any) -> dict[str, Any]:
        data: dict[str, Any] = self.call("POST", "/admin/tenants", 201, json={"id": tenant_id, **fields})
        return data

    def create_key(self, tenant_id: str, name: str = "") -> tuple[str, str]:
        """(key id, plaintext)."""
        data = self.call("POST", f"/admin/tenants/{tenant_id}/keys", 201, json={"name": name})
        return str(data["id"]), str(data["key"])

    def revoke_key(self, tenant_id: str, key_id: str) -> None:
        self.call("DELETE", f"/admin/tenants/{tenant_id}/keys/{key_id}")

    def patch_quotas(self, tenant_id: str, **quotas: Any) -> None:
        self.call("PATCH", f"/admin/tenants/{tenant_id}/quotas", json=quotas)

    def usage(self, tenant_id: str, days: int = 2) -> dict[str, Any]:
        data: dict[str, Any] = self.call("GET", f"/admin/tenants/{tenant_id}/usage", params={"days": days})
        return data

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def chat_body(max_tokens: int = 20) -> dict[str, Any]:
    """A chat request the simulator answers with exactly 11 prompt and `max_tokens` output tokens."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,  # SGLang's flag: generate max_tokens, no early stop
    }


def chat(
    url: str, key: str | None, max_tokens: int = 20, headers: dict[str, str] | None = None
) -> httpx.Response:
    """One non-streaming chat completion through the gateway with `key` (None: no Authorization)."""
    sent = dict(headers or {})
    if key is not None:
        sent["authorization"] = f"Bearer {key}"
    return httpx.post(
        url + "/v1/chat/completions", json=chat_body(max_tokens), headers=sent, timeout=30.0, trust_env=False
    )


def ledger_total(usage: dict[str, Any]) -> dict[str, int]:
    """Tokens and requests over every day of a usage report's history (robust to crossing UTC midnight)."""
    out = {"input_tokens": 0, "output_tokens": 0, "requests": 0}
    for day in usage["history"]:
        for field in out:
            out[field] += int(day[field])
    return out
