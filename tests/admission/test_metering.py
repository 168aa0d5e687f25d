"""Adaptive prefill metering (`budgets.prefill_rate_fraction`): the round's budget follows the measured
prefill rate, and what a round released beyond its budget is carried into the next rounds."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.admission.dispatch import Dispatcher
from gateway.admission.limits import Sample
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.settings import PoolBudgets
from gateway.request.errors import ApiError
from tests.admission.helpers import FakeClock, backends, decision, miss, policy, settle, ticket

METERED = PoolBudgets(prefill_tokens_per_round=1000, round_s=0.1, prefill_rate_fraction=1.0)


def test_carry_spends_the_following_rounds_until_paid_off() -> None:
    d = Dispatcher()
    b = backends(1)[0]
    d.open_round(0.0, budgets=METERED)
    d.commit(ticket(prompt=3500), b, decision())  # alone into the empty round
    d.open_round(0.1, budgets=METERED)
    assert d.rounds.prefill == {b.url: {0: 2500}}
    assert miss(d, ticket(prompt=1), b, decision(METERED)) == "round_prefill"
    d.open_round(0.3, budgets=METERED)  # two more rounds paid 2000 of it
    assert d.rounds.prefill == {b.url: {0: 500}}
    assert miss(d, ticket(prompt=500), b, decision(METERED)) is None
    assert miss(d, ticket(prompt=501), b, decision(METERED)) == "round_prefill"
    d.open_round(0.4, budgets=METERED)
    assert d.rounds.prefill == {}


def test_fixed_budget_carries_nothing() -> None:
    d = Dispatcher()
    b = backends(1)[0]
    fixed = PoolBudgets(prefill_tokens_per_round=1000, round_s=0.1)
    d.open_round(0.0, budgets=fixed)
    d.commit(ticket(prompt=3500), b, decision())
    d.open_round(0.1, budgets=fixed)
    assert d.rounds.prefill == {}


def _sched(fraction: float, clock: FakeClock) -> PoolScheduler:
    pol = policy(
        queue={"initial_prefill_tokens_per_s": 10000, "prefill_rate_min_samples": 4},
        budgets={"prefill_tokens_per_round": 8192, "round_s": 0.1, "prefill_rate_fraction": fraction},
        window={"accumulate": {}},
        controller={"algorithm": "fixed", "initial": 8, "min": 8, "max": 8},
    )
    return PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)


def test_budget_follows_the_measured_rate_capped_by_the_configured_one() -> None:
    clock = FakeClock()
    s = _sched(0.5, clock)
    assert s.snapshot()["prefill_tokens_per_round"] == 500  # 0.5 × prior 10000 tokens/s × 0.1 s
    for _ in range(4):
        s.observe_prefill(4000, 1.0)
    assert s.snapshot()["prefill_tokens_per_round"] == 200  # 0.5 × measured 4000 × 0.1
    assert _sched(10.0, clock).snapshot()["prefill_tokens_per_round"] == 8192


async def test_big_prompts_go_at_the_metered_pace() -> None:
    clock = FakeClock()
    s = _sched(1.0, clock)  # 1000 tokens per 0.1 s round
    first = await s.acquire(ticket(arrival=clock.now, prompt=1500))
    second = asyncio.create_task(s.acquire(ticket(arrival=clock.now, prompt=1500)))
    await settle()
    assert first.dispatched_at == 1000.0 and not second.done()
    clock.now = 1000.1
    s.pump()  # a new round, but 500 tokens of the first prompt are still carried
    await asyncio.sleep(0)
    assert not second.done() and s.snapshot()["backends"][0]["round_prefill_tokens"] == 500
    clock.now = 1000.2
    s.pump()
    assert (await second).dispatched_at == 1000.2


def test_the_target_limits_duty_scales_the_metered_budget() -> None:
    clock = FakeClock()
    pol = policy(
        budgets={"prefill_tokens_per_round": 8192, "round_s": 0.1, "prefill_rate_fraction": 0.5},
        controller={"algorithm": "target", "initial": 8, "min": 1, "max": 8, "window": 4},
    )
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)
    assert s.snapshot()["prefill_tokens_per_round"] == 500  # 0.5 × prior 10000 tokens/s × 0.1 s
    for i in range(4):  # decode steps at 0.45 of the objective: duty 1 − 0.45 / 0.9
        s.limits["http://b0"].update(Sample(float(i), in_flight=8, tpot_ratio=0.9, prefill_share=0.5))
    snap = s.snapshot()
    assert snap["backends"][0]["prefill_duty"] == 0.5 and snap["prefill_tokens_per_round"] == 250


async def test_the_queue_predicts_first_tokens_at_the_metered_pace() -> None:
    clock = FakeClock()
    pol = policy(
        budgets={"prefill_tokens_per_round": 8192, "round_s": 0.1, "prefill_rate_fraction": 1.0},
        controller={"algorithm": "target", "initial": 1, "min": 1, "max": 1, "window": 4},
    )
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)
    running = await s.acquire(ticket(arrival=clock.now, prompt=100))  # the one slot
    head = asyncio.create_task(s.acquire(ticket(arrival=clock.now, prompt=12000)))
    behind = asyncio.create_task(s.acquire(ticket(arrival=clock.now, prompt=100)))
    await settle()
    assert len(s.queue) == 2  # behind 12000 tokens at 10000 tokens/s: first token in 1.2 s < 2 s
    for i in range(4):  # duty 0.5: the rounds send prompts at half the rate, the same wait is 2.4 s
        s.limits["http://b0"].update(Sample(float(i), in_flight=1, tpot_ratio=0.9, prefill_share=0.5))
    with pytest.raises(ApiError) as exc, anyio.fail_after(1):
        await s.acquire(ticket(arrival=clock.now, prompt=100))
    assert (exc.value.status, exc.value.code) == (429, "slo_unattainable")
    for task in (head, behind):
        task.cancel()
    running.release(None, "ok")
