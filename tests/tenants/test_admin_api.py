"""The admin API over real HTTP (uvicorn on loopback) with a SQLite store: CRUD, keys, usage, security."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.tenants.service import TenantService
from gateway.tenants.sqlite_store import SQLiteStore
from tests.support.servers import serve
from tests.tenants.apps import ADMIN_TOKEN, tenants_app

pytestmark = pytest.mark.e2e

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[httpx.Client]:
    service = TenantService(SQLiteStore(tmp_path / "t.sqlite3"))
    with serve(tenants_app(service)) as server, httpx.Client(base_url=server.url, timeout=10) as c:
        yield c


def create(client: httpx.Client, tenant_id: str, **body: object) -> str:
    r = client.post("/admin/tenants", json={"id": tenant_id, **body}, headers=ADMIN)
    assert r.status_code == 201, r.text
    k = client.post(f"/admin/tenants/{tenant_id}/keys", json={"name": "main"}, headers=ADMIN)
    assert k.status_code == 201
    return str(k.json()["key"])


def test_tenant_lifecycle_over_http(client: httpx.Client) -> None:
    create(client, "acme", name="Acme", quotas={"total_tpm": 60000})
    got = client.get("/admin/tenants/acme", headers=ADMIN).json()
    assert (got["name"], got["quotas"]["total_tpm"], got["effective"]["max_priority"]) == ("Acme", 60000, 5)
    r = client.patch("/admin/tenants/acme", json={"max_priority": 8, "quotas": {"rpm": 100}}, headers=ADMIN)
    assert (r.json()["max_priority"], r.json()["quotas"]["rpm"], r.json()["quotas"]["total_tpm"]) == (
        8,
        100,
        60000,
    )
    q = client.patch(
        "/admin/tenants/acme/quotas",
        json={"total_tpm": None, "daily_tokens": 5, "audio_spm": 90},
        headers=ADMIN,
    )
    assert q.json() | {} == {
        "input_tpm": None,
        "output_tpm": None,
        "total_tpm": None,
        "rpm": 100,
        "audio_spm": 90,
        "max_concurrent": None,
        "max_queued": None,
        "daily_tokens": 5,
        "monthly_tokens": None,
        "daily_audio_seconds": None,
        "monthly_audio_seconds": None,
    }
    assert [t["id"] for t in client.get("/admin/tenants", headers=ADMIN).json()["data"]] == ["acme"]
    assert client.delete("/admin/tenants/acme", headers=ADMIN).json() == {"id": "acme", "deleted": True}
    missing = client.get("/admin/tenants/acme", headers=ADMIN)
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "tenant_not_found")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"id": "bad id!"}, "id"),
        ({"id": "ok", "quotas": {"rpm": 0}}, "quotas.rpm"),
        ({"id": "ok", "weight": "heavy"}, "weight"),
        ({"id": "ok", "colour": "red"}, "colour"),
        ({"id": "ok", "over_quota": "maybe"}, "over_quota"),
    ],
)
def test_validation_errors_name_the_field(client: httpx.Client, body: dict[str, object], param: str) -> None:
    r = client.post("/admin/tenants", json=body, headers=ADMIN)
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["param"], err["type"]) == (
        400,
        "invalid_request",
        param,
        "invalid_request_error",
    )
    assert err["message"].startswith(f"{param}: ")


def test_bad_json_and_bad_query_are_400(client: httpx.Client) -> None:
    create(client, "acme")
    r = client.post("/admin/tenants", content=b"{nope", headers=ADMIN)
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")
    r = client.get("/admin/tenants/acme/usage?days=0", headers=ADMIN)
    assert (r.status_code, r.json()["error"]["param"]) == (400, "days")
    assert client.post("/admin/tenants", json={"id": "acme"}, headers=ADMIN).status_code == 409


def test_keys_listing_shows_prefixes_only_and_revocation_is_immediate(client: httpx.Client) -> None:
    key = create(client, "acme")
    assert client.get("/v1/usage", headers={"authorization": f"Bearer {key}"}).status_code == 200
    listed = client.get("/admin/tenants/acme/keys", headers=ADMIN).json()["data"]
    assert len(listed) == 1 and listed[0]["prefix"] == key[:7]
    assert key not in str(listed) and "key_hash" not in listed[0]
    revoked = client.delete(f"/admin/tenants/acme/keys/{listed[0]['id']}", headers=ADMIN).json()
    assert revoked["revoked_at"] is not None
    r = client.get("/v1/usage", headers={"authorization": f"Bearer {key}"})
    assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
    assert client.delete("/admin/tenants/acme/keys/key_nope", headers=ADMIN).status_code == 404


def test_tenant_keys_never_work_on_admin_routes(client: httpx.Client) -> None:
    key = create(client, "acme")
    for method, path in [
        ("GET", "/admin/tenants"),
        ("GET", "/admin/tenants/acme/usage"),
        ("POST", "/admin/tenants"),
    ]:
        r = client.request(method, path, headers={"authorization": f"Bearer {key}"}, json={"id": "x"})
        assert (r.status_code, r.json()["error"]["code"]) == (403, "invalid_admin_token")
        assert client.request(method, path).status_code == 401


def test_a_tenant_reads_only_its_own_usage(client: httpx.Client) -> None:
    key_a = create(client, "a")
    create(client, "b")
    r = client.get("/v1/usage?tenant=b", headers={"authorization": f"Bearer {key_a}"})
    assert r.status_code == 200 and r.json()["tenant"] == "a"
    assert client.get("/v1/usage").status_code == 401


def test_usage_reports_budgets_and_history(client: httpx.Client) -> None:
    create(client, "acme", quotas={"daily_tokens": 1000, "rpm": 10, "max_concurrent": 3})
    usage = client.get("/admin/tenants/acme/usage?days=2", headers=ADMIN).json()
    assert usage["per_minute"] == {"rpm": {"limit": 10, "remaining": 10.0, "used": 0.0}}
    assert usage["concurrent"] == {"limit": 3, "active": 0}
    assert (usage["today"]["limit"], usage["today"]["remaining"], usage["history"]) == (1000, 1000, [])


def test_openapi_document_covers_the_routes(client: httpx.Client) -> None:
    assert client.get("/admin/openapi.json").status_code == 401  # it maps the admin API: admins only
    doc = client.get("/admin/openapi.json", headers=ADMIN).json()
    assert doc["openapi"] == "3.1.0"
    assert set(doc["paths"]["/tenants/{tenant_id}"]) == {"parameters", "get", "patch", "delete"}
    assert doc["paths"]["/tenants"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TenantCreate"
    }
    assert "quotas" in doc["components"]["schemas"]["TenantCreate"]["properties"]
