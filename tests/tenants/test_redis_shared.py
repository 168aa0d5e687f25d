"""Several replicas on one Redis: quota held across processes, admin changes propagated by pub/sub."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio.to_thread
import orjson
import pytest

from gateway.request.errors import ApiError
from gateway.tenants.models import QuotasPatch, TenantCreate, TenantPatch
from gateway.tenants.redis_store import RedisStore
from gateway.tenants.service import TenantService

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60_000  # tokens per minute, shared by both processes


def replica(url: str, prefix: str) -> TenantService:
    return TenantService(RedisStore(url, prefix))


def run_replicas(args: list[str]) -> tuple[float, list[bytes]]:
    """Start two hammers, wait until both are connected, give them one epoch; (epoch, their outputs)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "tests.tenants.hammer", *args]
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        for _ in range(2)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    epoch = time.time() + 0.5  # both processes start hammering at the same (scaled) instant
    for p in procs:  # both are told before either is waited for
        assert p.stdin is not None
        p.stdin.write(f"{epoch!r}\n".encode())
        p.stdin.flush()
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    return epoch, outs


async def test_two_processes_are_held_to_one_shared_limit(redis_url: str, redis_prefix: str) -> None:
    admin = replica(redis_url, redis_prefix)
    await admin.start()
    await admin.create_tenant(TenantCreate.model_validate({"id": "acme", "quotas": {"total_tpm": LIMIT}}))
    _, key = await admin.create_key("acme")
    await admin.close()
    scale = 10.0  # one quota minute = 6 real seconds (a busy machine's lags stay small in quota time)
    span = 150.0  # scaled seconds: burst, then two full minutes at the refill rate
    epoch, outs = await anyio.to_thread.run_sync(
        run_replicas, [redis_url, redis_prefix, key, repr(scale), repr(span)]
    )
    charged = [orjson.loads(o) for o in outs]
    window = [(t, n) for c in charged for t, n in c if epoch + 60 <= t < epoch + 120]
    total = sum(n for _, n in window)
    # After the first minute's burst, the refill rate is all there is: one limit per minute, within 5 %.
    print(f"tokens charged in the second minute: {total} of {LIMIT}")
    assert abs(total - LIMIT) <= 0.05 * LIMIT, total
    assert all(any(epoch + 60 <= t < epoch + 120 for t, _ in c) for c in charged)  # both really competed


async def test_admin_change_on_one_replica_is_enforced_by_another(redis_url: str, redis_prefix: str) -> None:
    a, b = replica(redis_url, redis_prefix), replica(redis_url, redis_prefix)
    await a.start()
    await b.start()
    try:
        await a.create_tenant(TenantCreate(id="acme", max_priority=3))
        _, key = await a.create_key("acme")
        await asyncio.wait_for(b.store.subscribed.wait(), 5)  # type: ignore[attr-defined]
        assert (await b.authenticate(f"Bearer {key}")).max_priority == 3  # now cached on b
        started = time.monotonic()
        await a.update_tenant("acme", TenantPatch(max_priority=7, quotas=QuotasPatch(rpm=1)))
        while (tenant := await b.authenticate(f"Bearer {key}")).max_priority != 7:
            assert time.monotonic() - started < 5, "replica b never saw the change"
            await asyncio.sleep(0.005)
        assert tenant.quotas.rpm == 1
        await b.reserve(tenant, 1, 1)
        record = (await a.list_keys("acme"))[0]
        await a.revoke_key("acme", record.id)
        while True:
            try:
                await b.authenticate(f"Bearer {key}")
            except ApiError as e:
                assert e.code == "invalid_api_key"
                break
            assert time.monotonic() - started < 5, "replica b still accepts a revoked key"
            await asyncio.sleep(0.005)
    finally:
        await a.close()
        await b.close()
