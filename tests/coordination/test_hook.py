"""The scheduler with a replica's shares (admission/shares.py hook): it dispatches within its share,
meters prefill at its part of the engine, predicts at its pace and shows the shared budget."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission.scheduler import PoolScheduler
from gateway.coordination.shares import Lease, Shares
from tests.admission.helpers import FakeClock, backends, policy, settle, spawn, ticket

pytestmark = pytest.mark.unit

FIXED_8 = policy(controller={"algorithm": "fixed", "initial": 8, "min": 1, "max": 8})


async def test_a_replica_dispatches_within_its_share_of_the_engine() -> None:
    clock = FakeClock()
    pool = backends(1)
    s = PoolScheduler("interactive", pool, lambda: FIXED_8.admission, clock=clock)
    shares = Shares("me", ttl_s=3.0, replicas_hint=1, clock=clock)
    shares.leased(pool[0].url, Lease(2, 8, clock() + 3.0, 3, 0, 5, False, {"me": 2, "peer": 6}))
    s.shares = shares
    tasks = [await spawn(s, ticket(prompt=100, output=10)) for _ in range(3)]
    await settle()
    assert [t.done() for t in tasks] == [True, True, False]  # 2 of the engine's 8 are this replica's
    ctx = s.decision(FIXED_8.admission)
    assert ctx.limits == {pool[0].url: 2}
    assert ctx.budgets.prefill_tokens_per_round == FIXED_8.admission.budgets.prefill_tokens_per_round // 4
    assert s.capacity() == pytest.approx(1 / 3)  # at least an even split of the 3 replicas
    (backend,) = s.snapshot()["backends"]
    assert (backend["limit"], backend["shared"]["engine_limit"], backend["shared"]["share"]) == (2, 8, 2)
    for t in tasks[:2]:
        t.result().release()
    await settle()
    assert tasks[2].done()
    tasks[2].result().release()
    await asyncio.sleep(0)


def test_a_follower_adopts_the_owners_adaptive_limit() -> None:
    clock = FakeClock()
    pool = backends(1)
    adaptive = policy(controller={"algorithm": "gradient", "initial": 32, "min": 4, "max": 64})
    s = PoolScheduler("interactive", pool, lambda: adaptive.admission, clock=clock)
    shares = Shares("me", ttl_s=3.0, replicas_hint=1, clock=clock)
    shares.leased(pool[0].url, Lease(10, 20, clock() + 3.0, 2, 0, 0, False, {"me": 10, "owner": 10}))
    s.shares = shares
    ctx = s.decision(adaptive.admission)
    assert (s.limits[pool[0].url].limit, ctx.limits[pool[0].url]) == (20, 10)  # the owner's 20, our 10
    shares.leased(pool[0].url, Lease(10, 20, clock() + 3.0, 2, 0, 0, True, {"me": 10}))
    assert shares.follows(pool[0].url) is None  # as the owner, its own controller moves the value on


async def test_the_top_bands_reserve_is_offered_to_the_allocator_while_the_replica_holds_it() -> None:
    clock = FakeClock()
    pool = backends(1)
    s = PoolScheduler("interactive", pool, lambda: FIXED_8.admission, clock=clock)
    assert s.top_reserve(8) == (0, 0)  # no top-band request seen: nothing kept for one
    task = await spawn(s, ticket(priority=10))
    task.result().release()
    assert s.top_reserve(8) == (2, 10)  # ⌈0.15 × 8⌉ for band 10
    clock.advance(301.0)
    assert s.top_reserve(8) == (0, 0)  # the reserve's hold (300 s) ran out
    await asyncio.sleep(0)


SHIELDED = policy(
    window={"accumulate": {}}, controller={"algorithm": "fixed", "initial": 8, "min": 1, "max": 8}
)


def _shared(clock: FakeClock, grant: int = 8) -> PoolScheduler:
    pool = backends(1)
    s = PoolScheduler("interactive", pool, lambda: SHIELDED.admission, clock=clock)
    shares = Shares("me", ttl_s=3.0, replicas_hint=2, clock=clock)
    shares.leased(
        pool[0].url, Lease(grant, 8, clock() + 3.0, 2, 0, 0, False, {"me": grant, "peer": 8 - grant})
    )
    s.shares = shares
    return s


async def _lows(s: PoolScheduler, prompt: int) -> list[bool]:
    tasks = [await spawn(s, ticket(priority=0, prompt=prompt)) for _ in range(3)]
    await settle()
    return [t.done() for t in tasks]


async def test_a_flood_below_a_peers_top_rank_is_shielded_as_on_one_replica() -> None:
    clock = FakeClock()
    alone = _shared(clock)
    assert await _lows(alone, 300) == [True, True, True]  # no higher rank seen: nothing to shield
    s = _shared(clock)
    s.peers_shield(10.0, clock() + 3.0)  # a peer serves band 10 on the same engine
    assert await _lows(s, 300) == [True, False, False]  # 300 not started + 300 > 512
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "prefill_shield"}
    assert s.shield_top() == 0.0  # what this replica reports: its own ranks only


async def test_a_flood_below_a_peers_top_rank_is_spaced_and_the_report_expires() -> None:
    clock = FakeClock()
    s = _shared(clock)
    s.peers_shield(10.0, clock() + 3.0)
    first = await spawn(s, ticket(priority=0, prompt=2000))
    first.result().started()  # its prefill began: the shield lets the next big one go alone...
    second = await spawn(s, ticket(priority=0, prompt=2000))
    assert not second.done()  # ...only at its spaced turn
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "shield_duty"}
    s.peers_shield(None, clock() + 3.0)  # the peer's band-10 work is over
    s.pump()
    await settle()
    assert second.done()


async def test_a_replica_above_its_peers_top_rank_meters_the_whole_round_budget() -> None:
    clock = FakeClock()
    s = _shared(clock, grant=2)
    whole = SHIELDED.admission.budgets.prefill_tokens_per_round
    (await spawn(s, ticket(priority=10, prompt=100))).result().release()
    assert s.shield_top() == 10.0
    assert s.decision(SHIELDED.admission).budgets.prefill_tokens_per_round == whole // 4  # no peer report
    s.peers_shield(0.0, clock() + 3.0)  # the peers' work ranks below ours: ours goes first
    assert s.decision(SHIELDED.admission).budgets.prefill_tokens_per_round == whole
    s.peers_shield(10.0, clock() + 3.0)  # a peer at our rank: the engine shares it
    assert s.decision(SHIELDED.admission).budgets.prefill_tokens_per_round == whole // 4
    s.peers_shield(0.0, clock() + 3.0)
    clock.advance(3.0)  # the peers' report outlived its lease
    assert s.decision(SHIELDED.admission).budgets.prefill_tokens_per_round == whole // 4
