"""The engine's top rank across replicas: two replicas' coordinators on the suite's real redis-server tell
each other the top rank they dispatched, so a flood on one is shielded for a high-priority stream served
on the other, and the replica serving the top rank meters its rounds at the whole budget."""

from __future__ import annotations

import pytest

from gateway.admission.scheduler import PoolScheduler
from gateway.coordination.coordinator import Coordinator
from gateway.settings.config import CoordinationConfig
from tests.admission.helpers import FakeClock, backends, policy, spawn, ticket

pytestmark = pytest.mark.e2e

POLICY = policy(
    controller={"algorithm": "fixed", "initial": 8, "min": 1, "max": 8}, window={"accumulate": {}}
)


def replica(redis_url: str, prefix: str, name: str, clock: FakeClock) -> tuple[PoolScheduler, Coordinator]:
    sched = PoolScheduler("interactive", backends(1), lambda: POLICY.admission, clock=clock)
    coord = Coordinator(redis_url, prefix, CoordinationConfig(), {"interactive": sched}, name, clock=clock)
    return sched, coord


async def test_replicas_hear_the_top_rank_their_peers_dispatched(redis_url: str, redis_prefix: str) -> None:
    clock = FakeClock()
    a, coord_a = replica(redis_url, redis_prefix, "a", clock)
    b, coord_b = replica(redis_url, redis_prefix, "b", clock)
    try:
        for coord in (coord_a, coord_b) * 3:  # until each holds half the engine as headroom
            await coord.refresh()
        (await spawn(a, ticket(priority=10, prompt=100))).result().release()
        (await spawn(b, ticket(priority=0, prompt=100))).result().release()
        for coord in (coord_a, coord_b, coord_a):
            await coord.refresh()
        shield = POLICY.admission.budgets.shield
        assert b.dispatcher.shield.peer_top == (10.0, clock() + coord_b.config.lease_ttl_s)
        assert a.dispatcher.shield.peer_top[0] == 0.0
        assert a.dispatcher.shield.above_peers(shield, clock())
        assert not b.dispatcher.shield.above_peers(shield, clock())
        whole = POLICY.admission.budgets.prefill_tokens_per_round
        assert a.decision(POLICY.admission).budgets.prefill_tokens_per_round == whole
        assert b.decision(POLICY.admission).budgets.prefill_tokens_per_round < whole
    finally:
        await coord_a.leave()
        await coord_b.leave()
