"""The rush: the gateway's own pacing yields to a queued request's deadline while a slot is free.

The family benchmark found requests at light load held by the shield and its spacing, with slots free,
until a sweep refused them as unattainable (decision 0112). On a fake clock: a request with a slot free is
sent past the shield once its slack falls under `rush_slack_fraction` of its budget; the slots and the
round's prefill budget still hold it; whether it rushes or not, a queued request is shed only once it is
late even if sent at once.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.queue import SLOQueue
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.settings import QueuePolicy
from gateway.admission.shedding import SLACK_HEADER, PrefillRate, QueueGuard
from gateway.livepolicy.policy import Policy
from gateway.request.errors import ApiError
from tests.admission.helpers import FakeClock, backends, entry, policy, settle, spawn, ticket

# Binary fractions so times compare exactly. The pool: one backend; the shield (512 tokens, spacing at duty
# 0.1), a round of 8192 prefill tokens per 1.0 s, no slots kept for the top band; the class:
# first token within 1.0 s; the rate 1000 tokens/s.
SHIELD = {"tokens": 512, "hold_s": 10.0, "duty": 0.1}


def _policy(slots: int = 4, round_tokens: int = 8192, round_s: float = 1.0, **queue: Any) -> Policy:
    return policy(
        controller={"algorithm": "fixed", "initial": slots, "min": slots, "max": slots},
        budgets={"prefill_tokens_per_round": round_tokens, "round_s": round_s, "shield": SHIELD},
        queue={
            "initial_prefill_tokens_per_s": 1000.0,
            "recheck_interval_s": 0.125,
            "classes": {"interactive": {"ttft_p99_s": 1.0}},
            "priorities": {"reserve_fraction": 0.0},
            **queue,
        },
    )


async def _held_by_the_shield(
    pol: Policy, big: int = 600, by: str = "prefill_shield"
) -> tuple[FakeClock, PoolScheduler, Any, Any, Any]:
    """A band-10 request (started) raises the shield; a 600-token band-5 prompt goes; a second band-5
    prompt of `big` tokens then waits behind the first one's unstarted prefill with a slot free (its
    deadline 1001.0), held `by` that first."""
    clock = FakeClock()
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)
    high = await s.acquire(ticket(arrival=clock.now, priority=10, prompt=100))
    high.started()
    low = await s.acquire(ticket(arrival=clock.now, prompt=600))
    held = await spawn(s, ticket(arrival=clock.now, prompt=big))
    assert not held.done() and s.snapshot()["head"]["blocked_by"] == {"http://b0": by}
    return clock, s, high, low, held


async def _pump_at(clock: FakeClock, s: PoolScheduler, now: float) -> None:
    clock.now = now
    s.pump()
    await settle()


async def test_a_request_held_by_the_shield_with_a_slot_free_goes_once_its_slack_is_short() -> None:
    clock, s, high, low, held = await _held_by_the_shield(_policy())  # rushed under 0.25 s of slack
    await _pump_at(clock, s, 1000.125)  # slack 1001 - 1000.125 - 0.6 = 0.275: not yet
    assert not held.done()
    await _pump_at(clock, s, 1000.25)  # slack 0.15: the sweep rushes it past the shield
    lease = held.result()
    assert lease.dispatched_at == 1000.25 and s.rejections == {}
    for done in (high, low, lease):
        done.release(None, "ok")


async def test_without_the_rush_the_shield_holds_it_until_it_is_late_and_shed() -> None:
    clock, s, high, low, held = await _held_by_the_shield(_policy(rush_slack_fraction=None))
    await _pump_at(clock, s, 1000.375)  # slack 1001 - 1000.375 - 0.6 = 0.025: the shield still holds
    assert not held.done()
    await _pump_at(clock, s, 1000.5)  # slack -0.1: late even if sent now
    with pytest.raises(ApiError) as shed:
        held.result()
    assert shed.value.code == "slo_unattainable"
    for done in (high, low):
        done.release(None, "ok")


async def test_a_rushed_request_still_waits_for_a_slot() -> None:
    clock, s, high, low, held = await _held_by_the_shield(
        _policy(slots=2), by="concurrency"
    )  # both slots taken
    await _pump_at(clock, s, 1000.25)
    assert not held.done()  # rushed, but no slot
    high.release(None, "ok")  # a slot frees; the next sweep is due at 1000.375
    await settle()
    assert not held.done()  # the shield still holds it outside a rush
    await _pump_at(clock, s, 1000.375)  # slack 0.025
    lease = held.result()
    assert lease.dispatched_at == 1000.375 and s.rejections == {}
    for done in (low, lease):
        done.release(None, "ok")


async def test_a_rushed_request_still_waits_for_the_rounds_prefill_budget() -> None:
    """The round's prefill budget is decode's protection: a rush does not pass it. 100 + 600 tokens of
    an 800-token round are spent; a 300-token prompt (slack 0.7 s at 1000.0) waits for the next round."""
    pol = _policy(round_tokens=800, round_s=0.625)
    clock, s, high, low, held = await _held_by_the_shield(pol, big=300, by="round_prefill")
    await _pump_at(clock, s, 1000.5)  # slack 0.2: rushed, but the round's budget is spent
    assert not held.done()
    await _pump_at(clock, s, 1000.625)  # a new round: the rush opens it and sends it, past the shield
    lease = held.result()
    assert lease.dispatched_at == 1000.625 and s.rejections == {}
    for done in (high, low, lease):
        done.release(None, "ok")


def _guard(fraction: float | None = 0.25) -> tuple[QueueGuard, dict[str, float | None]]:
    """A guard at 1000 tokens/s whose slot wait is `room["wait"]` for every entry."""
    room: dict[str, float | None] = {"wait": 0.0}
    rate = PrefillRate(QueuePolicy(initial_prefill_tokens_per_s=1000.0, rush_slack_fraction=fraction))
    queue = SLOQueue(VirtualTokenCounters())
    return QueueGuard(queue, rate, "interactive", slot_wait=lambda e, now, ahead: room["wait"]), room


TIGHT = policy(queue={"classes": {"interactive": {"ttft_p99_s": 0.375}}})
OFFLINE = policy(queue={"classes": {"offline": {"ttft_p99_s": None}}})


def test_rushed_is_slack_under_the_fraction_of_the_budget_and_not_below_zero() -> None:
    g, _ = _guard()
    e = entry(ticket(prompt=250), TIGHT)  # deadline 1000.375, own prefill 0.25 s: rushed under 0.09375 s
    assert g.slack(e, 1000.0) == 0.125
    assert [g.rushed(e, now) for now in (1000.03125, 1000.0625, 1000.125, 1000.125 + 2**-20)] == [
        False,
        True,
        True,
        False,  # late even sent at once: not worth the pacing
    ]
    assert not g.rushed(entry(ticket(prompt=250, cls="offline"), OFFLINE), 1000.0625)  # no TTFT deadline
    g_off, _ = _guard(None)
    assert not g_off.rushed(e, 1000.0625)


def _behind_a_head(g: QueueGuard) -> tuple[Any, Any]:
    """A 250-token head and a 250-token request behind it, both due at 1000.375: the queue predicts the
    second's first token at 1000.5 (late), its own prefill alone ends at 1000.25."""
    head = entry(ticket(priority=10, prompt=250), TIGHT)
    behind = entry(ticket(priority=5, prompt=250), TIGHT)
    g.queue.push(head)
    g.queue.push(behind)
    return head, behind


@pytest.mark.parametrize("rush", [0.25, None])
def test_a_queued_request_is_kept_until_late_even_if_sent_now_whatever_its_slot(rush: float | None) -> None:
    g, room = _guard(rush)
    head, behind = _behind_a_head(g)
    room["wait"] = None  # no slot predictable
    assert g.sweep(now=1000.0, backends=1) == []  # the queue predicts 1000.5 > 1000.375: kept
    assert g.sweep(now=1000.125, backends=1) == []  # sent now: 1000.375, in time
    assert [e for e, _ in g.sweep(now=1000.125 + 2**-10, backends=1)] == [head, behind]
    assert g.rejections == {("slo_unattainable", "interactive"): 2}


def test_admission_is_still_judged_by_the_queue_prediction() -> None:
    g, _ = _guard()
    g.queue.push(entry(ticket(priority=10, prompt=250), TIGHT))
    with pytest.raises(ApiError) as exc:  # would queue behind 0.25 s of prefill: first token at 1000.5
        g.admit(entry(ticket(priority=5, prompt=250), TIGHT), now=1000.0, backends=1)
    assert exc.value.code == "slo_unattainable"
    assert exc.value.response_headers() == {SLACK_HEADER: "125.0", "retry-after": "1"}


def test_a_queued_request_late_even_if_sent_now_is_shed_with_a_negative_slack() -> None:
    g, _ = _guard()
    head, behind = _behind_a_head(g)
    (_, _), (shed, err) = g.sweep(now=1000.25, backends=1)  # 1000.25 + 0.25 > 1000.375, a slot free or not
    assert shed is behind and not head.queued  # the head too: in the queue, room does not outweigh a deadline
    assert err.headers == {SLACK_HEADER: "-125.0"}
    assert "late even if sent now, first token predicted in 0.250s; the deadline is in 0.125s" in err.message
