"""Fixtures: a fake clock, a real Redis with a private key prefix per test, a TenantService per store."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from gateway.tenants.memory_store import MemoryStore
from gateway.tenants.redis_store import RedisStore
from gateway.tenants.service import TenantService
from gateway.tenants.sqlite_store import SQLiteStore
from gateway.tenants.store import Store

REDIS_URL = "redis://127.0.0.1:6379/0"
T0 = datetime(2025, 3, 10, 12, 0, tzinfo=UTC).timestamp()


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def require_redis() -> None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.exceptions.ConnectionError:
        pytest.fail(
            f"These tests need a Redis server at {REDIS_URL}; start one (.ci/run does: redis-server)."
        )


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted afterwards."""
    require_redis()
    prefix = f"omnigate-test:{uuid.uuid4().hex}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def make_store(kind: str, tmp_path: Path, prefix: str, clock: FakeClock) -> Store:
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "tenants.sqlite3")
    return RedisStore(REDIS_URL, prefix, clock=clock, retry_interval=0.0)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def service(
    store_kind: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[TenantService]:
    prefix = request.getfixturevalue("redis_prefix") if store_kind == "redis" else ""
    svc = TenantService(make_store(store_kind, tmp_path, prefix, clock), clock=clock)
    await svc.start()
    yield svc
    await svc.close()
