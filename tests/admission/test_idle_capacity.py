"""No refusal and no endless wait while capacity is idle.

The overhead benchmark found a permanent outage: after a streaming overload the prefill-rate estimate
read 4.8 tokens/s (TTFTs of tiny prompts measured while the gateway itself was CPU-queued), every request
was then refused as `slo_unattainable` on an empty queue and an idle backend, and since nothing was
dispatched the estimate could never recover. These tests replay that on a fake clock, then check every
other path where a request could wait forever or be turned away while a backend has room.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission.scheduler import PoolScheduler
from gateway.backends.state import BackendState
from gateway.livepolicy.policy import Policy
from gateway.request.errors import ApiError
from gateway.request.ticket import Ticket, Usage
from tests.admission.helpers import FakeClock, backends, policy, settle, ticket

FIXED_1 = {"algorithm": "fixed", "initial": 1, "min": 1, "max": 1}


def _sched(pol: Policy, pool: list[BackendState], clock: FakeClock) -> PoolScheduler:
    return PoolScheduler("interactive", pool, lambda: pol.admission, clock=clock)


def _t(clock: FakeClock, prompt: int = 100) -> Ticket:
    return ticket(arrival=clock.now, prompt=prompt)


async def _refused(s: PoolScheduler, prompt: int) -> ApiError:
    with pytest.raises(ApiError) as exc:
        await s.acquire(ticket(arrival=s.clock(), prompt=prompt))
    return exc.value


async def test_one_overload_is_no_permanent_outage() -> None:
    clock = FakeClock()
    s = _sched(policy(), backends(1), clock)  # the default policy
    for i in range(64):  # the overload: tiny prompts whose TTFT was the gateway's own CPU queue
        clock.now = 1000.0 + i / 64
        (await s.acquire(_t(clock, 10))).release(Usage(10, 100), "ok", ttft_s=2.067, tpot_s=0.05)
    assert s.rate.at(clock.now) == 10000.0  # the old estimate: 4.84 tokens/s
    for i in range(64):  # and real prompts that met the same queue: 10 tokens/s
        clock.now = 1001.0 + i / 64
        (await s.acquire(_t(clock, 1024))).release(Usage(1024, 100), "ok", ttft_s=102.4, tpot_s=0.05)
    assert s.rate.at(clock.now) == 2500.0  # floored at 0.25 × the prior
    clock.now = 1003.0
    tiny = await s.acquire(_t(clock, 10))  # old code: 429, "first token predicted in 2.067s"
    assert tiny.dispatched_at == 1003.0
    big = await s.acquire(_t(clock, 8000))  # predicted 3.2 s > 2 s, but it starts now
    assert big.dispatched_at == 1003.0 and s.rejections == {}
    tiny.release(Usage(10, 1), "ok", ttft_s=0.001)
    big.release(Usage(8000, 1), "ok", ttft_s=0.5)  # 16000 tokens/s: one sample among 65
    assert s.rate.at(1031.5) == 2500.0  # half the overload's samples expired, the rest still rule
    assert s.rate.at(1032.0) == 10000.0  # 30 s after the overload all have: the prior again
    assert (s.backends[0].active, s.in_flight, len(s.queue)) == (0, 0, 0)


async def test_prediction_still_refuses_what_must_queue() -> None:
    clock = FakeClock()
    s = _sched(policy(controller=FIXED_1), backends(1), clock)
    alone = await s.acquire(_t(clock, 25000))  # 2.5 s of prefill > the 2 s SLO, but on an idle backend
    assert alone.dispatched_at == 1000.0
    err = await _refused(s, 25000)  # the slot is taken: it would queue, and cannot make it
    assert (err.status, err.code) == (429, "slo_unattainable")
    small = asyncio.create_task(s.acquire(_t(clock, 100)))
    await settle()
    assert not small.done() and len(s.queue) == 1  # queues: predicted 0.01 s
    alone.release(None, "ok")
    clock.now = 1000.1  # the big prompt spent the round's prefill budget: the next round
    s.pump()
    (await small).release(None, "ok")
    assert s.rejections == {("slo_unattainable", "interactive"): 1}


async def test_head_waiting_only_for_the_next_round_is_neither_refused_nor_shed() -> None:
    clock = FakeClock()
    pol = policy(
        controller={"algorithm": "fixed", "initial": 4, "min": 4, "max": 4},
        budgets={"prefill_tokens_per_round": 1000, "round_s": 0.125},
    )
    s = _sched(pol, backends(1), clock)
    first = await s.acquire(_t(clock, 25000))  # alone into the empty round
    second = asyncio.create_task(s.acquire(_t(clock, 25000)))
    await settle()
    assert not second.done() and len(s.queue) == 1  # round budget spent; a slot is free: admitted
    err = await _refused(s, 100)  # behind 25000 queued tokens: 2.51 s
    assert err.code == "slo_unattainable"
    clock.now = 1000.0625
    s.pump()  # the sweep re-checks the head: still starts with the next round
    await settle()
    assert not second.done() and len(s.queue) == 1
    clock.now = 1000.125
    s.pump()
    assert (await second).dispatched_at == 1000.125
    first.release(None, "ok")
    second.result().release(None, "ok")
    assert s.rejections == {("slo_unattainable", "interactive"): 1}


async def test_limit_at_its_minimum_still_serves_an_idle_backend_at_once() -> None:
    clock = FakeClock()
    pol = policy(controller={"algorithm": "aimd", "initial": 2, "min": 1, "max": 2, "backoff": 0.5})
    s = _sched(pol, backends(1), clock)
    (await s.acquire(_t(clock))).release(None, "overloaded")
    assert s.limits["http://b0"].limit == 1
    clock.now = 1000.125
    lease = await s.acquire(_t(clock, 25000))  # idle backend, limit 1: goes, prediction or not
    waiting = asyncio.create_task(s.acquire(_t(clock, 100)))
    await settle()
    assert lease.dispatched_at == 1000.125 and not waiting.done()
    lease.release(None, "ok")
    clock.now = 1000.25  # next round (the big prompt spent this one's prefill budget)
    s.pump()
    (await waiting).release(None, "ok")
    assert s.rejections == {}


async def test_open_circuit_holds_work_half_open_serves_it_and_unknown_kv_never_blocks() -> None:
    clock = FakeClock()
    pool = backends(1, circuit="open", max_total_tokens=None)
    s = _sched(policy(), pool, clock)
    waiting = asyncio.create_task(s.acquire(_t(clock, 100)))
    await settle()
    assert not waiting.done()  # no backend available: it waits (bounded by max_wait_s) …
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "unavailable"}
    pool[0].circuit = "half_open"  # … until the breaker lets its one probe through and the monitor pumps
    s.pump()
    lease = await waiting
    held = asyncio.create_task(s.acquire(_t(clock, 100)))
    await settle()
    assert lease.backend is pool[0] and pool[0].active == 1 and not held.done()  # one probe only
    pool[0].circuit = "closed"  # the probe succeeded
    s.pump()
    second = await held  # KV size unknown: it goes
    assert second.backend is pool[0] and pool[0].active == 2
    lease.release(None, "ok")
    second.release(None, "ok")
    assert s.rejections == {}


async def test_work_for_a_pool_without_available_backends_times_out_instead_of_waiting_forever() -> None:
    clock = FakeClock()
    pool = backends(1, healthy=False)
    pol = policy(queue={"classes": {"interactive": {"max_wait_s": 1.0}}})
    s = _sched(pol, pool, clock)
    waiting = asyncio.create_task(s.acquire(_t(clock, 100)))
    await settle()
    assert not waiting.done() and s.next_wake == 1000.1  # run() re-checks at every sweep
    clock.now = 1001.0
    s.pump()
    with pytest.raises(ApiError) as exc:
        await waiting
    assert (exc.value.status, exc.value.code) == (503, "queue_timeout")
    assert len(s.queue) == 0 and s.rejections == {("queue_timeout", "interactive"): 1}
