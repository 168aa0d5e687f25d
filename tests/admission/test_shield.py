"""The prefill shield: lower-ranked prompts do not pile up in an engine while higher-ranked ones come.

An engine batches every waiting prompt its budget allows with a new top-priority one; the shield keeps
what could ride along (dispatched, prefill not started) within `shield.tokens`. Exact, on a fake clock.
"""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from gateway.admission.scheduler import Lease, PoolScheduler
from gateway.livepolicy.policy import Policy
from gateway.request.errors import ApiError
from tests.admission.helpers import FakeClock, backends, policy, settle, spawn, ticket

FIXED_8 = {"algorithm": "fixed", "initial": 8, "min": 8, "max": 8}


def _sched(
    clock: FakeClock, queue: dict[str, object] | None = None, n: int = 1, **budgets: object
) -> PoolScheduler:
    pol: Policy = policy(window={"accumulate": {}}, controller=FIXED_8, budgets=budgets, queue=queue or {})
    return PoolScheduler("interactive", backends(n), lambda: pol.admission, clock=clock)


def _done(tasks: list[asyncio.Task[Lease]]) -> list[bool]:
    return [t.done() for t in tasks]


def _pending(s: PoolScheduler) -> int:
    return int(s.snapshot()["backends"][0]["pending_prefill_tokens"])


async def test_lower_band_prompts_wait_for_the_first_byte_while_a_higher_band_is_about() -> None:
    clock = FakeClock()
    s = _sched(clock)
    high = await s.acquire(ticket(priority=10, prompt=100))
    lows = [await spawn(s, ticket(priority=5, prompt=300)) for _ in range(3)]
    assert _done(lows) == [True, False, False]  # 300 not started + 300 > 512
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "prefill_shield"}
    high.started()  # the higher band's own prompt never counts against the shield
    await settle()
    assert _done(lows) == [True, False, False]
    lows[0].result().started()
    await settle()
    assert _done(lows) == [True, True, False] and _pending(s) == 300
    lows[1].result().release(None, "ok")  # ended (or failed) before its first byte: no longer waiting
    await settle()
    assert _done(lows) == [True, True, True]
    for lease in (high, *(t.result() for t in lows)):
        lease.release(None, "ok")
    assert _pending(s) == 0 and s.dispatcher.shield.pending == {"http://b0": {}}


async def test_small_prompts_share_the_shield_and_a_big_one_goes_alone() -> None:
    clock = FakeClock()
    s = _sched(clock)
    high = await s.acquire(ticket(priority=10, prompt=100))
    small = [await spawn(s, ticket(priority=5, prompt=200)) for _ in range(3)]
    assert _done(small) == [True, True, False] and _pending(s) == 100 + 400  # 400 + 200 > 512
    for t in small[:2]:
        t.result().started()
    await settle()
    big = await spawn(s, ticket(priority=5, prompt=4000))
    assert _done(small) == [True, True, True] and not big.done()  # behind the third small one
    small[2].result().started()
    await settle()
    assert not big.done()  # the band-10 prompt still waits for its batch: the big one would join it
    high.started()
    await settle()
    assert big.done()  # nothing waits in the engine: it goes alone


async def test_no_shield_without_a_higher_rank_within_hold_s() -> None:
    clock = FakeClock()
    s = _sched(clock, shield={"hold_s": 1.0})
    lows = [await spawn(s, ticket(priority=5, prompt=300)) for _ in range(3)]
    assert _done(lows) == [True, True, True]  # nobody above band 5 was here: nothing to shield
    await s.acquire(ticket(priority=10, prompt=100))
    later = [await spawn(s, ticket(priority=5, prompt=300)) for _ in range(2)]
    assert _done(later) == [False, False]  # 900 of band 5 not started
    clock.now = 1001.0  # hold_s after the band-10 dispatch: still up
    s.pump()
    await settle()
    assert _done(later) == [False, False]
    clock.now = 1001.001
    s.pump()
    await settle()
    assert _done(later) == [True, True]


async def test_off_with_tokens_null() -> None:
    s = _sched(FakeClock(), shield={"tokens": None})
    await s.acquire(ticket(priority=10, prompt=100))
    lows = [await spawn(s, ticket(priority=5, prompt=2000)) for _ in range(3)]
    assert _done(lows) == [True, True, True]


async def test_a_whole_request_counts_for_its_predicted_prefill_then_falls() -> None:
    clock = FakeClock()
    # neither the round's end nor the deadline re-check wakes the pump before the prediction
    s = _sched(clock, {"recheck_interval_s": 1.0}, round_s=1.0)
    (await s.acquire(ticket(priority=10, prompt=100))).started()
    first = await s.acquire(ticket(priority=5, prompt=2000, stream=False))
    second = await spawn(s, ticket(priority=5, prompt=100, stream=False))
    assert not second.done()
    assert s.next_wake == 1000.2  # 2000 tokens at the prior 10 000 tokens/s: no first byte to wait for
    clock.now = 1000.2
    s.pump()  # what run() does at _next_wake
    await settle()
    waiting = s.dispatcher.shield.pending["http://b0"][id(first.ticket)]
    assert second.done() and (waiting.tokens, waiting.due) == (2000, 1000.2)


async def test_a_tenant_under_its_share_raises_the_shield_in_its_own_band() -> None:
    clock = FakeClock()
    s = _sched(clock)
    heavy = [await spawn(s, ticket(tenant="heavy", prompt=300)) for _ in range(2)]
    assert _done(heavy) == [True, True]  # heavy alone is at its share: rank 5, no shield
    light = await s.acquire(ticket(tenant="light", prompt=50))
    assert s.dispatcher.shield.rank_seen == {5.0: 1000.0, 5.5: 1000.0}  # light went under its share
    third = await spawn(s, ticket(tenant="heavy", prompt=100))
    assert not third.done() and s.snapshot()["head"]["blocked_by"] == {"http://b0": "prefill_shield"}
    light.started()
    heavy[0].result().started()
    await settle()
    assert third.done()  # heavy[1]'s 300 still waits in the engine, and 300 + 100 ≤ 512


async def test_big_lower_ranked_prompts_are_spaced_by_duty_and_small_ones_pass() -> None:
    clock = FakeClock()
    # neither the round's end nor the deadline re-check wakes the pump before the spaced turn
    s = _sched(clock, {"recheck_interval_s": 10.0}, round_s=10.0, prefill_tokens_per_round=10**6)
    (await s.acquire(ticket(priority=10, prompt=100))).started()
    first = await s.acquire(ticket(priority=5, prompt=2000))  # alone: nothing waits in the engine
    first.started()
    second = await spawn(s, ticket(priority=5, prompt=2000))
    assert not second.done() and s.snapshot()["head"]["blocked_by"] == {"http://b0": "shield_duty"}
    small = await spawn(s, ticket(priority=5, prompt=300))
    assert small.done() and not second.done()  # within `tokens`: not spaced, and it passes
    small.result().started()
    assert s.next_wake == 1002.0  # 2000 tokens at the prior 10 000 tokens/s, over duty 0.1
    clock.now = 1002.0 - 1e-6
    s.pump()
    await settle()
    assert not second.done()
    clock.now = 1002.0
    s.pump()  # what run() does at _next_wake
    await settle()
    assert second.done() and s.dispatcher.shield.spacing["http://b0"] == {id(second.result().ticket): 1004.0}


async def test_between_rounds_the_state_names_the_spacing_a_new_round_would_keep() -> None:
    """/admin/state judges a head between rounds as a round opened now would: the round's prefill budget
    unspent, but the shield and the spacing as they are (they outlast a round)."""
    clock = FakeClock()
    s = _sched(clock, {"recheck_interval_s": 10.0}, round_s=0.5, prefill_tokens_per_round=10**6)
    (await s.acquire(ticket(priority=10, prompt=100))).started()
    (await s.acquire(ticket(priority=5, prompt=2000))).started()
    second = await spawn(s, ticket(priority=5, prompt=2000))
    clock.now = 1000.75  # the round ended at 1000.5 and no pass has run since; the turn comes at 1002
    assert s.snapshot()["round"]["open"] is False
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "shield_duty"} and not second.done()
    second.cancel()
    await settle()


@pytest.mark.parametrize("case", ["duty null", "no higher rank", "the top rank"])
async def test_what_duty_does_not_space(case: str) -> None:
    s = _sched(
        FakeClock(), prefill_tokens_per_round=10**6, shield={"duty": None if case == "duty null" else 0.1}
    )
    if case != "no higher rank":
        (await s.acquire(ticket(priority=10, prompt=100))).started()
    band = 10 if case == "the top rank" else 5
    for _ in range(3):  # each alone in the engine once the one before started
        (await s.acquire(ticket(priority=band, prompt=2000))).started()
    assert s.dispatcher.shield.spacing == {}


@pytest.mark.parametrize(
    "shield",
    [
        {"tokens": 0},
        {"tokens": -512},
        {"hold_s": 0},
        {"tokens": "many"},
        {"token": 512},
        {"duty": 0},
        {"duty": 1.5},
    ],
)
def test_an_invalid_shield_is_refused_with_the_field_named(shield: dict[str, object]) -> None:
    with pytest.raises(ValidationError) as info:
        policy(budgets={"shield": shield})
    assert info.value.errors()[0]["loc"][:2] == ("budgets", "shield")


def test_a_pool_override_of_the_shield_keeps_the_rest_of_the_budgets() -> None:
    pol = policy(budgets={"kv_watermark": 0.7, "pools": {"offline": {"shield": {"tokens": None}}}})
    offline, interactive = pol.budgets.for_pool("offline"), pol.budgets.for_pool("interactive")
    assert (offline.shield.tokens, offline.shield.hold_s, offline.kv_watermark) == (None, 10.0, 0.7)
    assert (interactive.shield.tokens, interactive.kv_watermark) == (512, 0.7)


async def test_a_protected_request_goes_where_no_prompt_waits_for_its_prefill() -> None:
    s = _sched(FakeClock(), n=2)
    big = await s.acquire(ticket(priority=5, prompt=3000, output=1000))
    big.started()  # b0: much outstanding, nothing waiting for its prefill
    small = await s.acquire(ticket(priority=5, prompt=200))  # least outstanding: b1; not started
    assert (big.backend.url, small.backend.url) == ("http://b0", "http://b1")
    high = await s.acquire(ticket(priority=10, prompt=100))
    assert high.backend.url == "http://b0"  # b1 has the fewest outstanding tokens, but a prompt waiting
    same_band = await s.acquire(ticket(priority=10, prompt=100))
    assert same_band.backend.url == "http://b0"  # 100 waiting there (the first one) against 200 on b1
    s = _sched(FakeClock(), n=2, shield={"tokens": None})
    (await s.acquire(ticket(priority=5, prompt=3000, output=1000))).started()
    await s.acquire(ticket(priority=5, prompt=200))
    assert (await s.acquire(ticket(priority=10, prompt=100))).backend.url == "http://b1"  # shield off


async def test_a_request_queued_again_is_neither_shed_nor_refused_nor_displaced() -> None:
    clock = FakeClock()
    queue = {"classes": {"interactive": {"ttft_p99_s": 0.1, "max_queue_depth": 1, "max_wait_s": 0.5}}}
    pol = policy(
        window={"accumulate": {}},
        controller={"algorithm": "fixed", "initial": 1, "min": 1, "max": 1},
        budgets={"shield": {"tokens": None}},
        queue=queue,
    )
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)
    holder = await s.acquire(ticket(priority=5, prompt=100))
    clock.now = 1002.0  # long past the deadline of a request that arrived at 1000
    late = ticket(priority=0, prompt=100)
    requeued = await spawn(s, late, requeued=True)
    again = await spawn(s, ticket(priority=0, prompt=100, arrival=1002.0), requeued=True)
    assert not requeued.done() and not again.done()  # past its deadline, beyond the depth: admitted before
    higher = await spawn(s, ticket(priority=10, prompt=100, arrival=1002.0))
    error = higher.exception()
    assert isinstance(error, ApiError) and error.code == "queue_full"  # not displaced for it
    clock.now = 1003.0  # past max_wait_s too; the re-check sweeps
    s.pump()
    await settle()
    assert not requeued.done() and not again.done()
    holder.release(None, "ok")
    await settle()
    assert requeued.done() and requeued.result().ticket is late and not again.done()
