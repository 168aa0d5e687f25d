"""One registry of live replicas for quotas and engine budgets, against the suite's real redis-server: the
tenant store's heartbeat and the allocator's lease refresh count the same replicas, and neither cuts the
other's expiry short."""

from __future__ import annotations

import time

import orjson
import pytest
import redis

from gateway.coordination.registry import BEAT, REGISTRY
from gateway.coordination.scripts import ALLOCATE

pytestmark = pytest.mark.e2e


class Registry:
    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.key = prefix + REGISTRY
        self.backend = prefix + "coord:b:engine"
        self._beat = client.register_script(BEAT)
        self._allocate = client.register_script(ALLOCATE)

    def beat(self, replica: str, ttl_ms: int) -> int:
        """The tenant store's heartbeat: the live count."""
        return int(self._beat(keys=[self.key], args=[replica, ttl_ms]))

    def lease(self, replica: str, ttl_ms: int) -> int:
        """The coordinator's refresh of one backend: the live count it reads."""
        args = [replica, ttl_ms, 8, 0, 0, 1, 0, orjson.dumps([])]
        return int(self._allocate(keys=[self.backend, self.key], args=args)[2])

    def expiry_ms(self, replica: str) -> float:
        return float(self.client.zscore(self.key, replica) or 0.0)


@pytest.fixture
def registry(redis_client: redis.Redis, redis_prefix: str) -> Registry:
    return Registry(redis_client, redis_prefix)


def test_store_and_allocator_count_one_replica_once(registry: Registry) -> None:
    assert registry.beat("a", 5000) == 1
    assert registry.lease("a", 3000) == 1  # the same process through its coordinator: still one
    assert registry.lease("b", 3000) == 2
    assert registry.beat("a", 5000) == 2  # the store sees the replica that only leases


def test_a_shorter_beat_never_cuts_a_longer_one(registry: Registry) -> None:
    registry.beat("a", 60_000)
    long_expiry = registry.expiry_ms("a")
    registry.lease("a", 3000)
    assert registry.expiry_ms("a") == long_expiry


def test_a_replica_that_stops_beating_drops_out(registry: Registry) -> None:
    registry.beat("gone", 200)
    assert registry.beat("stays", 60_000) == 2
    time.sleep(0.3)
    assert registry.lease("stays", 3000) == 1
