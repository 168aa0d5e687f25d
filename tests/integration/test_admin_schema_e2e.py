"""The admin API against the OpenAPI document it publishes (issue 42.3), fuzzed by schemathesis — the
tool that found it untrue — on a live gateway (a real `omnigate serve` on loopback, the admin token):
every operation, a bounded and derandomized set of examples each (positive and negative, the stateful
links between operations, undeclared methods), every check. It passes only if no response violates its
schema, no schema-valid request is refused, no schema-violating one accepted, nothing answers 500, and
every 405 names the allowed methods. The cases it found are pinned one by one below."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ADMIN_TOKEN, Admin, write_config
from tests.support.processes import ManagedProcess, Processes

pytestmark = pytest.mark.e2e

EXAMPLES_PER_OPERATION = 25


@pytest.fixture
def gateway(sim: ManagedProcess, procs: Processes, tmp_path: Path) -> ManagedProcess:
    return procs.gateway(write_config(tmp_path / "gw.yaml", sim.url, {"kind": "memory"}))


def test_schemathesis_finds_nothing(gateway: ManagedProcess, tmp_path: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        gateway.url + "/admin/openapi.json",
        "--url",
        gateway.url + "/admin",
        "--header",
        f"Authorization: Bearer {ADMIN_TOKEN}",
        "--max-examples",
        str(EXAMPLES_PER_OPERATION),
        "--generation-deterministic",
        "--checks",
        "all",
        "--workers",
        "1",
        "--no-color",
    ]
    run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    assert "13/13" in run.stdout  # every operation of the document was selected and tested


def _call(gw: ManagedProcess, method: str, path: str, body: object = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    return httpx.request(method, gw.url + path, json=body, headers=headers, timeout=10.0, trust_env=False)


def test_the_cases_it_found(gateway: ManagedProcess) -> None:
    with Admin(gateway.url) as admin:
        admin.call("POST", "/admin/tenants", json={"id": "acme"}, expect=201)
    # a null where the field may not be null: 400 naming it (was 500)
    resp = _call(gateway, "PATCH", "/admin/tenants/acme", {"name": None})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "name"
    assert resp.json()["error"]["code"] == "invalid_request"
    # a boolean is not a number (was taken as 0)
    resp = _call(gateway, "POST", "/admin/tenants", {"id": "b", "quotas": {"max_queued": False}})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "quotas.max_queued"
    # JSON Schema's integer: 3.0 is one
    resp = _call(gateway, "PATCH", "/admin/tenants/acme/quotas", {"rpm": 3.0})
    assert resp.status_code == 200
    assert resp.json()["rpm"] == 3
    # what the document says a tenant and a created key carry, they carry
    tenant = _call(gateway, "GET", "/admin/tenants/acme").json()
    assert tenant["effective"]["id"] == "acme" and tenant["effective"]["quotas"]["rpm"] == 3
    created = _call(gateway, "POST", "/admin/tenants/acme/keys", {"name": "ci"}).json()
    assert created["key"].startswith("og-") and "key_hash" not in created
    doc = _call(gateway, "GET", "/admin/openapi.json").json()["components"]["schemas"]
    assert "effective" in doc["TenantView"]["properties"]
    assert "key" in doc["KeyCreated"]["properties"]
    # a method a path lacks: 405 naming those it has (RFC 9110)
    for path, allowed in (
        ("/admin/tenants/acme", {"HEAD", "GET", "DELETE", "PATCH"}),
        ("/admin/tenants/acme/quotas", {"PATCH"}),
        ("/admin/state", {"HEAD", "GET"}),
        ("/admin/policy/reload", {"POST"}),
    ):
        resp = _call(gateway, "PUT", path, {})
        assert resp.status_code == 405, path
        assert set(resp.headers["allow"].split(", ")) == allowed, path  # Starlette keeps a set: any order
        assert resp.json()["error"]["code"] == "method_not_allowed"
