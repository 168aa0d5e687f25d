"""The outbox against a real redis-server: a Redis that refuses writes (out of memory) or is gone loses no
charge; usage admitted under local limits while it was down reaches its day/month ledger after it is back;
a replay is applied once."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from gateway.tenants.models import TenantCreate
from gateway.tenants.outbox import Outbox
from gateway.tenants.redis_store import RedisStore
from gateway.tenants.service import TenantService
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.e2e


async def _today(service: TenantService) -> tuple[int, int, int, float]:
    report = (await service.usage("acme", days=1))["today"]
    return report["input_tokens"], report["output_tokens"], report["requests"], report["audio_seconds"]


async def test_a_redis_that_refuses_or_leaves_loses_no_charge(
    private_redis: ManagedProcess, tmp_path: Path
) -> None:
    url = f"redis://127.0.0.1:{private_redis.port}/0"
    outbox = Outbox(tmp_path / "outbox.sqlite3")
    service = TenantService(RedisStore(url, retry_interval=0.0), failure="open", outbox=outbox)
    await service.start()
    admin = redis.Redis.from_url(url)
    try:
        await service.create_tenant(TenantCreate.model_validate({"id": "acme", "quotas": {"rpm": 100}}))
        tenant = service.resolve(await service.get_tenant("acme"))

        # 1. Redis answers, but refuses writes (a ResponseError, not an outage)
        refused = await service.reserve(tenant, 100, 50, audio_seconds=2.0)
        admin.config_set("maxmemory", "1")
        admin.config_set("maxmemory-policy", "noeviction")
        await service.reconcile(refused, 80, 10, audio_seconds=1.5)
        assert list(service.outbox.pending) == [refused.id]
        admin.config_set("maxmemory", "0")

        # 2. Redis gone: one reservation made before settles during the outage; one is admitted locally
        before = await service.reserve(tenant, 100, 50, audio_seconds=3.0)
        private_redis.stop()
        await service.reconcile(before, 60, 5, audio_seconds=2.25)
        local = await service.reserve(tenant, 40, 20, audio_seconds=1.0)
        assert local.local
        await service.reconcile(local, 30, 7, audio_seconds=0.75)
        assert len(service.outbox.pending) == 3
        assert await service.replay_outbox() == 0  # still down: kept

        private_redis.start()
        owed = list(outbox.pending.values())
        assert await service.replay_outbox() == 3
        assert not service.outbox.pending
        assert await _today(service) == (80 + 60 + 30, 10 + 5 + 7, 3, 1.5 + 2.25 + 0.75)
        assert (await service.usage("acme"))["concurrent"]["active"] == 0

        # a replay repeated (a process that died before crossing them off) charges nothing twice
        for entry in owed:
            await outbox.put(entry)
        assert await service.replay_outbox() == 3
        await service.reconcile(refused, 80, 10, audio_seconds=1.5)  # and a reservation is reconciled once
        assert await _today(service) == (80 + 60 + 30, 10 + 5 + 7, 3, 1.5 + 2.25 + 0.75)
    finally:
        admin.close()
        await service.close()
