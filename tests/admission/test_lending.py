"""Offline work borrowing interactive backends (`PoolScheduler.borrow_from`): off by default, only below the
lending pool's load threshold, never while the lending pool's own requests wait — and given back (the
newest loan revoked) as soon as they do. Only whole requests borrow: a loan must be revocable."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.admission.scheduler import PoolScheduler
from gateway.backends.state import BackendState
from gateway.livepolicy.policy import Policy
from gateway.request.ticket import Ticket
from tests.admission.helpers import FakeClock, policy, spawn, ticket


def _policy(lend: bool) -> Policy:
    return policy(
        controller={"algorithm": "fixed", "initial": 4, "min": 1, "max": 4},
        queue={"priorities": {"reserve_fraction": 0}},  # no headroom: tested in test_slots.py
        fairness={"reserve_fraction": 0},
        window={"accumulate": {}},
        budgets={"pools": {"interactive": {"lend": {"enabled": lend, "max_load": 0.5}}}},
    )


def _offline(*, stream: bool = False) -> Ticket:
    return ticket(cls="offline", tenant="batch", prompt=100, stream=stream)


async def test_offline_borrows_an_interactive_backend_only_when_allowed_and_never_ahead_of_its_owner() -> (
    None
):
    current: dict[str, Any] = {"p": _policy(lend=False)}
    clock = FakeClock()
    i0 = BackendState(url="http://i0", pool="interactive")
    o0 = BackendState(url="http://o0", pool="offline")
    inter = PoolScheduler("interactive", [i0], lambda: current["p"].admission, clock=clock)
    off = PoolScheduler("offline", [o0], lambda: current["p"].admission, clock=clock)
    off.borrow_from(inter)

    own = [await spawn(off, _offline()) for _ in range(4)]
    assert all(t.done() and t.result().backend is o0 for t in own)
    fifth = await spawn(off, _offline())
    assert not fifth.done() and i0.active == 0  # lending is off by default

    current["p"] = _policy(lend=True)
    off.pump()
    await asyncio.sleep(0)
    loan = fifth.result()
    assert loan.backend is i0 and loan.loan and (inter.lent, off.borrowed) == (1, 1)
    assert inter.dispatcher.rounds.prefill == {
        "http://i0": {0: 100}
    }  # the loan spends the lender's round budget
    assert (
        inter.snapshot()["round"]["dispatched_by_priority"] == {}
    )  # but is not interactive arrival pressure
    sixth = await spawn(off, _offline())  # i0 at 1/4 < 0.5
    seventh = await spawn(off, _offline())  # i0 at 2/4: not below 0.5
    assert sixth.result().backend is i0 and not seventh.done() and i0.active == 2

    chat = [await spawn(inter, ticket(prompt=100)) for _ in range(4)]
    assert [t.done() for t in chat] == [True, True, False, False]  # loans hold 2 of 4 slots
    assert off.snapshot()["borrowed_in_flight"] == 2 and inter.snapshot()["lent_in_flight"] == 2
    # the waiting chats want their slots back: the newest loan is revoked, one at a time
    assert (loan.revoked, sixth.result().revoked) == (False, True)
    revoked: list[str] = []
    sixth.result().arm(lambda: revoked.append("sixth"))  # a revocation before the pipeline arms still acts
    assert revoked == ["sixth"]

    sixth.result().release(None, "revoked")  # the pipeline gave up the call: the slot goes to a chat
    await asyncio.sleep(0)
    assert chat[2].done() and not chat[3].done() and loan.revoked  # and the next loan is asked back
    loan.release(None, "ok")  # the freed slot goes to the waiting chat, not to the waiting offline request
    await asyncio.sleep(0)
    assert chat[3].done() and not seventh.done() and (inter.lent, off.borrowed) == (0, 0)

    for t in chat:
        t.result().release(None, "ok")  # i0 idle, nothing interactive waits
    off.pump()
    await asyncio.sleep(0)
    assert seventh.result().backend is i0
    for t in [*own, seventh]:
        t.result().release(None, "ok")
    assert (i0.active, i0.outstanding_tokens, i0.reserved_kv_tokens, i0.bucket_active) == (0, 0, 0, {})
    assert (o0.active, inter.lent, off.borrowed, len(off.queue)) == (0, 0, 0, 0)


async def test_streams_never_borrow_and_an_armed_loan_is_cancelled_only_until_disarmed() -> None:
    clock = FakeClock()
    i0 = BackendState(url="http://i0", pool="interactive")
    o0 = BackendState(url="http://o0", pool="offline")
    pol = _policy(lend=True)
    inter = PoolScheduler("interactive", [i0], lambda: pol.admission, clock=clock)
    off = PoolScheduler("offline", [o0], lambda: pol.admission, clock=clock)
    off.borrow_from(inter)
    own = [await spawn(off, _offline()) for _ in range(4)]
    stream = await spawn(off, _offline(stream=True))
    whole = await spawn(off, _offline())
    # the stream is first in line but cannot be taken back once started: the whole request behind it
    # borrows, the stream waits for the offline pool's own backend
    assert not stream.done() and whole.result().backend is i0 and i0.active == 1

    calls: list[str] = []
    lease = whole.result()
    lease.arm(lambda: calls.append("cancel"))
    lease.disarm()  # its answer is on the way to the client: too late to take it back
    chat = [await spawn(inter, ticket(prompt=100)) for _ in range(4)]
    assert [t.done() for t in chat] == [True, True, True, False] and lease.revoked and calls == []
    lease.release(None, "ok")
    await asyncio.sleep(0)
    assert chat[3].done()
    own[0].result().release(None, "ok")
    await asyncio.sleep(0)
    assert stream.result().backend is o0
    for t in [*own[1:], stream, *chat]:
        t.result().release(None, "ok")
    assert (i0.active, o0.active, inter.lent, off.borrowed) == (0, 0, 0, 0)


async def test_a_loan_teaches_the_lenders_limit_and_prefill_rate_not_the_borrowers() -> None:
    """A loan ran on the lender's engine: its drop lowers that backend's limit (the lender's), and its
    prefill is a sample of the lender's rate; the borrower's own limits and rate do not move."""
    clock = FakeClock()
    i0 = BackendState(url="http://i0", pool="interactive")
    o0 = BackendState(url="http://o0", pool="offline")
    pol = policy(
        controller={"algorithm": "aimd", "initial": 4, "min": 1, "max": 8, "backoff": 0.5},
        queue={"priorities": {"reserve_fraction": 0}, "prefill_rate_min_samples": 1},
        fairness={"reserve_fraction": 0},
        window={"accumulate": {}},
        budgets={"pools": {"interactive": {"lend": {"enabled": True, "max_load": 1.0}}}},
    )
    inter = PoolScheduler("interactive", [i0], lambda: pol.admission, clock=clock)
    off = PoolScheduler("offline", [o0], lambda: pol.admission, clock=clock)
    off.borrow_from(inter)
    own = [await spawn(off, _offline()) for _ in range(4)]
    loans = [
        await spawn(off, ticket(cls="offline", tenant="batch", prompt=2000, stream=False)) for _ in range(2)
    ]
    assert [t.result().backend for t in loans] == [i0, i0]
    prior = off.rate.at(clock())
    loans[0].result().release(None, "ok", ttft_s=0.1)  # 2000 tokens in 0.1 s: 20 000 tokens/s
    assert inter.rate.at(clock()) == 20_000 and off.rate.at(clock()) == prior
    loans[1].result().release(None, "overloaded")
    assert (inter.limits["http://i0"].limit, off.limits["http://o0"].limit) == (2, 4)
    for t in own:
        t.result().release(None, "ok")


async def test_loans_are_neither_spaced_nor_space_the_lenders_own_prompts() -> None:
    """`shield.duty` spaces the lender's own big lower-ranked prompts only: a loan runs below the
    lender's `max_load` and is given back when the lender's requests wait."""
    clock = FakeClock()
    i0 = BackendState(url="http://i0", pool="interactive")
    o0 = BackendState(url="http://o0", pool="offline")
    pol = policy(
        controller={"algorithm": "fixed", "initial": 8, "min": 8, "max": 8},
        queue={"priorities": {"reserve_fraction": 0}},
        fairness={"reserve_fraction": 0},
        window={"accumulate": {}},
        budgets={
            "prefill_tokens_per_round": 10**6,
            "pools": {"interactive": {"lend": {"enabled": True, "max_load": 1.0}}},
        },
    )
    inter = PoolScheduler("interactive", [i0], lambda: pol.admission, clock=clock)
    off = PoolScheduler("offline", [o0], lambda: pol.admission, clock=clock)
    off.borrow_from(inter)
    own = [await spawn(off, _offline()) for _ in range(8)]
    high = await inter.acquire(ticket(priority=10, prompt=100))
    high.started()  # the shield is up in the interactive pool: band 10 was there
    loans = []
    for _ in range(2):
        loans.append(await spawn(off, ticket(cls="offline", tenant="batch", prompt=2000, stream=False)))
        assert loans[-1].result().loan and loans[-1].result().backend is i0
        clock.advance(0.2)  # its predicted prefill (2000 tokens at 10 000 tokens/s): no longer waiting
    first = await inter.acquire(ticket(priority=5, prompt=2000))  # the loans left no spacing
    first.started()
    second = await spawn(inter, ticket(priority=5, prompt=2000))
    assert not second.done() and inter.snapshot()["head"]["blocked_by"] == {"http://i0": "shield_duty"}
    assert inter.dispatcher.shield.spacing == {"http://i0": {id(first.ticket): clock() + 2.0}}
    for t in [*own, *loans, second]:
        t.cancel() if not t.done() else t.result().release(None, "ok")
    for lease in (high, first):
        lease.release(None, "ok")
    await asyncio.sleep(0)
    assert (i0.active, o0.active, inter.lent, off.borrowed, len(inter.queue)) == (0, 0, 0, 0, 0)


def test_a_pool_override_names_only_what_differs_the_rest_is_the_top_level_budgets() -> None:
    pol = policy(
        budgets={
            "prefill_rate_fraction": 1.0,
            "bucket_caps": {"multi_image": 4},
            "pools": {
                "interactive": {"lend": {"enabled": True}},
                "offline": {"bucket_caps": {"single_image": 2}, "kv_watermark": 0.7},
            },
        }
    )
    inter, off, other = (pol.budgets.for_pool(p) for p in ("interactive", "offline", "batch"))
    assert (inter.lend.enabled, inter.prefill_rate_fraction, inter.bucket_caps) == (
        True,
        1.0,
        {"multi_image": 4},
    )
    assert (off.lend.enabled, off.prefill_rate_fraction, off.kv_watermark) == (False, 1.0, 0.7)
    assert off.bucket_caps == {"single_image": 2}  # a map named in the override is the pool's whole map
    assert other is pol.budgets
    assert type(pol).model_validate(pol.model_dump()).budgets == pol.budgets  # a dump reloads as itself
