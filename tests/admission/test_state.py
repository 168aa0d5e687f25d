"""/admin/state is a read: two reads in a row agree, and reading changes nothing a decision sees."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.admission.lease import Lease
from gateway.admission.scheduler import PoolScheduler
from gateway.livepolicy.policy import Policy
from tests.admission.helpers import FakeClock, backends, policy, settle, spawn, ticket

pytestmark = pytest.mark.unit

ACCUMULATE = {"accumulate": {"interactive": {"tokens": 512, "max_wait_s": 0.015625}}}
POLICY = policy(
    window=ACCUMULATE,
    budgets={"round_s": 0.125, "prefill_tokens_per_round": 1024},
    controller={"algorithm": "fixed", "initial": 4, "min": 4, "max": 4},
)
RELOADED = policy(
    window=ACCUMULATE,
    budgets={"round_s": 0.125, "prefill_tokens_per_round": 1024},
    controller={"algorithm": "fixed", "initial": 2, "min": 2, "max": 2},
)


def _state(s: PoolScheduler) -> dict[str, Any]:
    """Everything a decision reads besides the snapshot: limits (by identity), the window's hold, the
    timer, the round, the shield and the queue's clock."""
    d = s.dispatcher
    return {
        "limits": {url: id(limit) for url, limit in s.limits.items()},
        "concurrency_limit": [b.concurrency_limit for b in s.backends],
        "window_s": s.window_s,
        "next_wake": s.next_wake,
        "round": (d.rounds.started, d.rounds.prefill, d.rounds.dispatched),
        "shield_held": d.shield.held,
        "queue_clock": (s.queue.now, s.queue.lifo_after_fraction),
    }


async def _held_by_the_window(s: PoolScheduler, clock: FakeClock) -> asyncio.Task[Lease]:
    first = await spawn(s, ticket(prompt=256))
    assert not first.done()  # 256 of the 512 tokens the pool accumulates
    assert (await spawn(s, ticket(prompt=256))).done() and first.done()
    clock.now = 1000.125  # the next arrival waits for its group, at most 0.015625 s
    held = await spawn(s, ticket(prompt=256))
    assert not held.done()
    return held


async def test_two_reads_in_a_row_agree_and_change_nothing() -> None:
    clock = FakeClock()
    current = {"p": POLICY}
    s = PoolScheduler("interactive", backends(1), lambda: current["p"].admission, clock=clock)
    held = await _held_by_the_window(s, clock)
    current["p"] = RELOADED  # a reload the next decision applies; a read must not (it rebuilt limits)
    clock.now = 1000.13
    before = _state(s)
    first, second = s.snapshot(), s.snapshot()
    assert first == second and _state(s) == before
    assert first["head"]["blocked_by"] == {"*": "window"} and first["window_s"] == 0.015625
    assert [b["limit"] for b in first["backends"]] == [4]  # as the last decision left it
    s.pump()  # the next decision applies the reload
    assert s.snapshot()["backends"][0]["limit"] == 2
    held.cancel()
    await settle()


async def _run(read: bool) -> list[tuple[str, float | None, int]]:
    """The same arrivals, releases and reload on a fresh scheduler, read after every step or never: the
    leases' (backend, dispatch time, engine priority) in order."""
    clock = FakeClock()
    current: dict[str, Policy] = {"p": POLICY}
    s = PoolScheduler("interactive", backends(2), lambda: current["p"].admission, clock=clock)
    tasks: list[asyncio.Task[Lease]] = []
    for step in range(40):
        tasks.append(await spawn(s, ticket(prompt=64 * (1 + step % 5), tenant=f"t{step % 3}")))
        if read:
            s.snapshot()
        if step == 20:
            current["p"] = RELOADED
        clock.advance(0.01)
        if step % 4 == 3:
            for task in [t for t in tasks if t.done() and not t.result().released][:2]:
                task.result().release(None, "ok")
                if read:
                    s.snapshot()
        s.pump()
        await settle()
    leases = [t.result() for t in tasks if t.done()]
    for t in tasks:
        t.cancel()
    await settle()
    return [(lease.backend.url, lease.dispatched_at, lease.engine_priority) for lease in leases]


async def test_reading_after_every_step_changes_no_decision() -> None:
    read, unread = await _run(read=True), await _run(read=False)
    assert read == unread and len(read) > 20
