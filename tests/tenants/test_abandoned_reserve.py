"""A reserve the request path gave up on at its deadline may still land in Redis — before or after the
request's fail-open record reaches the ledger. Against the suite's redis-server, every order counts the
request exactly once (redis_scripts.RECORD): a landed reserve is reconciled to the usage, a record that
came first stops the reserve, and a request refused after its reserve (`release`) counts nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.tenants.models import Quotas
from gateway.tenants.quota import Charge, LedgerRow, day_of, month_of
from gateway.tenants.redis_store import RedisStore

pytestmark = pytest.mark.e2e

T0 = 1_796_000_000.0  # a fixed clock: no refill between the calls
QUOTAS = Quotas(total_tpm=10_000, max_concurrent=5)
RESERVED = Charge(100, 50)
USED = Charge(80, 30)


@pytest.fixture
async def store(redis_url: str, redis_prefix: str) -> AsyncIterator[RedisStore]:
    store = RedisStore(redis_url, redis_prefix, clock=lambda: T0, deadline_s=5.0)  # not the subject here
    yield store


async def _state(store: RedisStore) -> tuple[LedgerRow, int, float]:
    rows, _ = await store.ledger("acme", [day_of(T0)], month_of(T0))
    levels = await store.levels("acme", QUOTAS, T0)
    return rows.get(day_of(T0), LedgerRow()), await store.active_count("acme", T0), levels["total_tpm"]


async def _record(store: RedisStore, rid: str, usage: Charge, requests: int = 1) -> None:
    await store.record_usage("acme", QUOTAS, RESERVED, usage, T0, T0, rid, requests=requests)


async def test_a_reserve_that_landed_is_reconciled_by_the_record(store: RedisStore) -> None:
    assert await store.reserve("acme", QUOTAS, RESERVED, T0, "r1") is None
    await _record(store, "r1", USED)
    await _record(store, "r1", USED)  # a replay: applied once
    assert await _state(store) == (LedgerRow(80, 30, 1, 0), 0, 10_000 - 110)


async def test_a_record_that_came_first_stops_the_reserve(store: RedisStore) -> None:
    await _record(store, "r2", USED)
    denial = await store.reserve("acme", QUOTAS, RESERVED, T0, "r2")
    assert denial is not None and denial.limit == "abandoned"
    assert await _state(store) == (LedgerRow(80, 30, 1, 0), 0, 10_000)  # its bucket was never charged


async def test_a_refused_request_releases_a_reserve_that_landed(store: RedisStore) -> None:
    assert await store.reserve("acme", QUOTAS, RESERVED, T0, "r3") is None
    await _record(store, "r3", Charge(), requests=0)
    assert await _state(store) == (LedgerRow(0, 0, 0, 0), 0, 10_000)
    await _record(store, "r4", Charge(), requests=0)  # one that never landed: nothing at all
    assert await store.reserve("acme", QUOTAS, RESERVED, T0, "r4") is not None
    assert await _state(store) == (LedgerRow(0, 0, 0, 0), 0, 10_000)
