"""Fixtures: a fake clock, a TenantService per store (Redis: on the suite's private redis-server)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.tenants.memory_store import MemoryStore
from gateway.tenants.redis_store import RedisStore
from gateway.tenants.service import TenantService
from gateway.tenants.sqlite_store import SQLiteStore
from gateway.tenants.store import Store
from tests.support.processes import ManagedProcess, Processes

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


def make_store(kind: str, tmp_path: Path, redis: tuple[str, str], clock: FakeClock) -> Store:
    """`redis`: (URL, key prefix), used when `kind` is redis."""
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SQLiteStore(tmp_path / "tenants.sqlite3")
    return RedisStore(*redis, clock=clock, retry_interval=0.0)


@pytest.fixture(params=["memory", "sqlite", pytest.param("redis", marks=pytest.mark.e2e)])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def service(
    store_kind: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> AsyncIterator[TenantService]:
    redis = ("", "")
    if store_kind == "redis":
        redis = (request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix"))
    svc = TenantService(make_store(store_kind, tmp_path, redis, clock), clock=clock)
    await svc.start()
    yield svc
    await svc.close()


def _own_redis(tmp_path: Path, appendonly: str) -> Iterator[ManagedProcess]:
    group = Processes(tmp_path)
    try:
        yield group.redis(tmp_path / "data", "--appendonly", appendonly)
    finally:
        group.close()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[ManagedProcess]:
    """A redis-server of our own (append-only file, so a restart keeps its data) that the test kills."""
    yield from _own_redis(tmp_path, "yes")


@pytest.fixture
def volatile_redis(tmp_path: Path) -> Iterator[ManagedProcess]:
    """A redis-server of our own without persistence at all: a restart comes back empty."""
    yield from _own_redis(tmp_path, "no")
