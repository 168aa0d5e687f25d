"""`omnigate tenants …` against a real admin API on loopback."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from gateway.tenants.cli import main
from gateway.tenants.service import TenantService
from gateway.tenants.sqlite_store import SQLiteStore
from tests.support.servers import free_port, serve
from tests.tenants.apps import ADMIN_TOKEN, tenants_app

pytestmark = pytest.mark.e2e


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    with serve(tenants_app(TenantService(SQLiteStore(tmp_path / "t.sqlite3")))) as server:
        yield server.url


def run(url: str, *argv: str, token: str = ADMIN_TOKEN) -> tuple[int, str]:
    out = io.StringIO()
    code = main([*argv, "--url", url, "--token", token], console=Console(file=out, width=200))
    return code, out.getvalue()


def test_create_update_keys_usage_delete(url: str) -> None:
    code, out = run(url, "create", "acme", "--name", "Acme", "--total-tpm", "60000", "--rpm", "100", "--json")
    assert code == 0 and orjson.loads(out)["quotas"]["total_tpm"] == 60000
    code, out = run(url, "update", "acme", "--max-priority", "8", "--rpm", "none", "--json")
    tenant = orjson.loads(out)
    assert (tenant["max_priority"], tenant["quotas"]["rpm"], tenant["quotas"]["total_tpm"]) == (
        8,
        None,
        60000,
    )
    code, out = run(url, "list")
    assert code == 0 and "acme" in out and "60000" in out
    code, out = run(url, "keys", "create", "acme", "--name", "ci")
    key = out.strip().splitlines()[-1]
    assert code == 0 and key.startswith("og-")
    code, out = run(url, "keys", "list", "acme", "--json")
    listed = orjson.loads(out)["data"]
    assert [k["prefix"] for k in listed] == [key[:7]] and key not in out
    assert run(url, "keys", "revoke", "acme", listed[0]["id"])[0] == 0
    code, out = run(url, "usage", "acme")
    assert code == 0 and "total_tpm" in out and "60000" in out
    assert run(url, "delete", "acme")[0] == 0


def test_errors_exit_non_zero_with_the_api_message(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(url, "get", "nobody")[0] == 1
    assert "tenant_not_found" in capsys.readouterr().err
    assert run(url, "list", token="wrong")[0] == 1
    assert "invalid_admin_token" in capsys.readouterr().err
    assert run(f"http://127.0.0.1:{free_port()}", "list")[0] == 2
    assert "cannot reach" in capsys.readouterr().err
