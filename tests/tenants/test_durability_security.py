"""SQLite survives kill -9 with every acknowledged change; plaintext keys never reach logs or metrics."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import anyio.to_thread
import pytest
from prometheus_client import generate_latest

from gateway.observability.metrics import REGISTRY
from gateway.request.errors import ApiError
from gateway.tenants.models import TenantCreate, TenantPatch
from gateway.tenants.quota import day_of
from gateway.tenants.service import TenantService
from gateway.tenants.sqlite_store import SQLiteStore
from tests.tenants.conftest import T0

ROOT = Path(__file__).resolve().parents[2]


def write_then_kill(db: Path, acks: int) -> tuple[str, int]:
    """Run the writer until it has acknowledged `acks` requests, SIGKILL it; its key and last ack."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.tenants.sqlite_writer", str(db)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    key = child.stdout.readline().split()[1]
    acked = 0
    while acked < acks:
        acked = int(child.stdout.readline().split()[1])
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=10)
    for line in child.stdout:  # acks printed before the kill landed
        acked = int(line.split()[1])
    return key, acked


@pytest.mark.e2e
async def test_kill_9_loses_no_acknowledged_change(tmp_path: Path) -> None:
    db = tmp_path / "t.sqlite3"
    key, acked = await anyio.to_thread.run_sync(write_then_kill, db, 200)
    service = TenantService(SQLiteStore(db))
    await service.start()
    try:
        assert (await service.authenticate(f"Bearer {key}")).id == "acme"
        today = (await service.usage("acme"))["today"]
        # Each finished request: 100 in, 50 out. At most one more was reserved (200 tokens) or also
        # reconciled (150) when the kill landed between its commit and its ack line.
        assert today["requests"] in (acked, acked + 1)
        assert today["input_tokens"] == 100 * today["requests"]
        assert today["output_tokens"] - 50 * acked in (0, 50, 100)
        assert today["date"] == day_of(service.clock())
    finally:
        await service.close()


async def test_plaintext_keys_never_reach_logs_or_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    service = TenantService(SQLiteStore(tmp_path / "t.sqlite3"))
    await service.start()
    try:
        await service.create_tenant(TenantCreate(id="acme"))
        record, key = await service.create_key("acme", "k")
        await service.authenticate(f"Bearer {key}")
        await service.update_tenant("acme", TenantPatch(name="Acme"))
        await service.revoke_key("acme", record.id)
        for header in (f"Bearer {key}", f"Bearer {key}x", f"Basic {key}"):
            with pytest.raises(ApiError) as err:
                await service.authenticate(header)
            assert key not in err.value.message
    finally:
        await service.close()
    assert "key " + record.id in caplog.text  # the key is logged by id and display prefix only
    secret = key[len(record.prefix) :]
    assert secret not in caplog.text and record.key_hash not in caplog.text
    assert secret not in generate_latest(REGISTRY).decode()


async def test_a_ledger_written_before_audio_was_counted_gains_the_column(tmp_path: Path) -> None:
    db = tmp_path / "tenants.sqlite3"
    old = sqlite3.connect(db)
    old.executescript(
        "CREATE TABLE ledger (tenant_id TEXT NOT NULL, day TEXT NOT NULL,"
        " input_tokens INTEGER NOT NULL DEFAULT 0, output_tokens INTEGER NOT NULL DEFAULT 0,"
        " requests INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (tenant_id, day)) WITHOUT ROWID;"
        "INSERT INTO ledger VALUES ('acme', '2025-03-10', 100, 50, 1);"
    )
    old.close()
    service = TenantService(SQLiteStore(db), clock=lambda: T0)
    await service.start()
    await service.create_tenant(TenantCreate(id="acme"))
    tenant = service.resolve(await service.get_tenant("acme"))
    await service.reconcile(await service.reserve(tenant, 10, 5, audio_seconds=2.0), 10, 5, audio_seconds=2.5)
    today = (await service.usage("acme", days=1))["today"]
    await service.close()
    assert (today["input_tokens"], today["requests"], today["audio_seconds"]) == (110, 2, 2.5)
