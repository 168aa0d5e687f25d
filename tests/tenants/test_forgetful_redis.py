"""Stores that forget or flap (issue 18.5), on a redis-server of our own without persistence: the config's
tenants and keys come back when Redis comes back empty, readiness tells a Redis that answers but refuses,
and fail-open limits start from the last known level with one replica's share."""

from __future__ import annotations

import pytest
import redis

from gateway.observability.metrics import REGISTRY
from gateway.tenants.redis_store import RedisStore
from gateway.tenants.service import QuotaExceeded, TenantService, parse_bootstrap
from tests.support.processes import ManagedProcess
from tests.tenants.conftest import FakeClock

pytestmark = pytest.mark.e2e

KEY = "og-config-declared-key-0123456789"


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _service(url: str, clock: FakeClock | None = None, **kwargs: object) -> TenantService:
    bootstrap = parse_bootstrap([{"id": "acme", "keys": [KEY], "quotas": {"rpm": 30}}])
    store = RedisStore(url, retry_interval=0.0, **({"clock": clock} if clock else {}))  # type: ignore[arg-type]
    return TenantService(store, bootstrap=bootstrap, **({"clock": clock} if clock else {}), **kwargs)  # type: ignore[arg-type]


async def test_config_tenants_come_back_when_redis_forgets(volatile_redis: ManagedProcess) -> None:
    url = f"redis://127.0.0.1:{volatile_redis.port}/0"
    service = _service(url)
    await service.start()
    try:
        assert (await service.authenticate(f"Bearer {KEY}")).id == "acme"
        reseeds = counter("omnigate_tenant_store_reseeds_total")
        volatile_redis.stop()
        volatile_redis.start()  # empty
        client = redis.Redis.from_url(url)
        assert client.dbsize() == 0
        service.store._keys.clear()  # type: ignore[attr-defined]  # as after the subscription's reconnect
        tenant = await service.authenticate(f"Bearer {KEY}")  # not a 401: seeded again on the spot
        assert tenant.id == "acme" and tenant.quotas.rpm == 30
        assert counter("omnigate_tenant_store_reseeds_total") == reseeds + 1
        assert client.exists("omnigate:seeded") and client.exists("omnigate:tenant:acme")
        assert (await service.check_store()).emptied is False  # and the watch finds nothing to do
        client.close()
    finally:
        await service.close()


async def test_readiness_tells_a_redis_that_answers_but_refuses(volatile_redis: ManagedProcess) -> None:
    url = f"redis://127.0.0.1:{volatile_redis.port}/0"
    service = _service(url)
    await service.start()
    client = redis.Redis.from_url(url)
    try:
        tenant = await service.authenticate(f"Bearer {KEY}")
        await service.check_store()
        assert service.readiness() == (True, {"state": "up", "failure_mode": "open", "replicas": 1})
        client.replicaof("127.0.0.1", "1")  # a read-only replica of nothing: every write is refused
        await service.check_store()
        ready, body = service.readiness()
        assert not ready and body["state"] == "unusable"
        assert counter("omnigate_tenant_store_up") == 0
        res = await service.reserve(tenant, 10, 10)  # refused writes: fail-open admits locally, no 500
        assert res.local
        await service.reconcile(res, 10, 5)
        client.replicaof("NO", "ONE")
        await service.check_store()
        assert service.readiness()[0] and counter("omnigate_tenant_store_up") == 1
        assert await service.replay_outbox() == 1  # the local admission reaches the shared ledger
        assert (await service.usage("acme", days=1))["today"]["requests"] == 1
    finally:
        client.close()
        await service.close()


async def test_fail_open_starts_from_the_last_level_with_one_replicas_share(
    volatile_redis: ManagedProcess, clock: FakeClock
) -> None:
    """Two replicas, a tenant of 30 requests/minute: 10 used before Redis goes. Each replica may then admit
    its half of what was left (10), not a full 30 of its own (the issue's 2.4x overshoot)."""
    url = f"redis://127.0.0.1:{volatile_redis.port}/0"
    replicas = [_service(url, clock), _service(url, clock)]
    for service in replicas:
        await service.start()
    try:
        tenant = await replicas[0].authenticate(f"Bearer {KEY}")
        for service in [*replicas, *replicas]:  # each beats; the second round sees both
            await service.check_store()
        assert [service.replicas for service in replicas] == [2, 2]
        for i in range(10):  # alternating, the last one on each replica sees 20 or 21 left
            res = await replicas[i % 2].reserve(tenant, 1, 1)
            await replicas[i % 2].reconcile(res, 1, 1)
        volatile_redis.stop()
        admitted = []
        for service in replicas:
            n = 0
            while True:
                try:
                    res = await service.reserve(tenant, 1, 1)
                except QuotaExceeded:
                    break
                assert res.local
                await service.reconcile(res, 1, 1)
                n += 1
            admitted.append(n)
        # replica 0 last saw 21 left (before replica 1's last request), replica 1 saw 20
        assert admitted == [10, 10]
    finally:
        for service in replicas:
            await service.close()


async def test_a_tenant_at_its_limit_stays_there_through_the_outage(
    volatile_redis: ManagedProcess, clock: FakeClock
) -> None:
    url = f"redis://127.0.0.1:{volatile_redis.port}/0"
    service = _service(url, clock)
    await service.start()
    try:
        tenant = await service.authenticate(f"Bearer {KEY}")
        for _ in range(30):
            await service.reserve(tenant, 1, 1)
        volatile_redis.kill()
        with pytest.raises(QuotaExceeded) as denied:  # not a fresh bucket: still empty
            await service.reserve(tenant, 1, 1)
        assert denied.value.limit == "rpm"
        clock.advance(6)  # the refill (30/min) brings three more, as it would have in Redis
        for _ in range(3):
            assert (await service.reserve(tenant, 1, 1)).local
        with pytest.raises(QuotaExceeded):
            await service.reserve(tenant, 1, 1)
    finally:
        await service.close()
