"""Token fairness across replicas: two replicas' coordinators on the suite's real redis-server sum the
tenants' virtual token counters, so a tenant served on one replica waits behind a lighter one on the
other."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission.scheduler import PoolScheduler
from gateway.coordination.coordinator import Coordinator
from gateway.settings.config import CoordinationConfig
from tests.admission.helpers import FakeClock, backends, policy, settle, spawn, ticket

pytestmark = pytest.mark.e2e

ONE_SLOT = policy(
    controller={"algorithm": "fixed", "initial": 1, "min": 1, "max": 1}, window={"accumulate": {}}
)


def replica(redis_url: str, prefix: str, name: str) -> tuple[PoolScheduler, Coordinator]:
    sched = PoolScheduler("interactive", backends(1), lambda: ONE_SLOT.admission, clock=FakeClock())
    return sched, Coordinator(redis_url, prefix, CoordinationConfig(), {"interactive": sched}, name)


async def test_a_tenant_served_on_one_replica_waits_behind_a_lighter_one_on_the_other(
    redis_url: str, redis_prefix: str
) -> None:
    a, coord_a = replica(redis_url, redis_prefix, "a")
    b, coord_b = replica(redis_url, redis_prefix, "b")
    try:
        heavy = await spawn(a, ticket(tenant="heavy", prompt=5000, output=100))  # served on replica a
        heavy.result().release()
        await coord_a.refresh()
        await coord_b.refresh()
        served = a.counters.counter("heavy")
        assert served > 0 and b.counters.counter("heavy") == served  # b knows what a served

        # b's queue alone decides now (its share of the one slot aside): a slot held, then light, heavy
        # and light again wait. Counting b's service only, heavy would go second (lifted to light's
        # counter); with what a served it goes last.
        b.shares = None
        holder = await spawn(b, ticket(tenant="other", prompt=10))
        light_1 = await spawn(b, ticket(tenant="light", prompt=100))
        heavy_1 = await spawn(b, ticket(tenant="heavy", prompt=100))
        light_2 = await spawn(b, ticket(tenant="light", prompt=100))
        holder.result().release()
        await settle()
        assert light_1.done() and not heavy_1.done()
        light_1.result().release()
        await settle()
        assert light_2.done() and not heavy_1.done()  # b alone would have let heavy go here
        light_2.result().release()
        await settle()
        assert heavy_1.done()
        heavy_1.result().release()
        await asyncio.sleep(0)
    finally:
        await coord_a.leave()
        await coord_b.leave()
