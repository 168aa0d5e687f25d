"""The anyio shell: dispatch on events, window timers, cancellation, displacement, fairness, chaos."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from gateway.admission.decision import Decision
from gateway.admission.scheduler import Lease, PoolScheduler
from gateway.backends.state import BackendState
from gateway.livepolicy.policy import Policy
from gateway.request.errors import ApiError
from gateway.request.ticket import Ticket, Usage
from tests.admission.helpers import FakeClock, backends, policy, settle, spawn, ticket

FIXED_1 = {"algorithm": "fixed", "initial": 1, "min": 1, "max": 1}


def _sched(
    pol: Policy, pool: list[BackendState] | None = None, clock: FakeClock | None = None
) -> PoolScheduler:
    return PoolScheduler(
        "interactive", pool or backends(1), lambda: pol.admission, clock=clock or FakeClock()
    )


def _assert_idle(s: PoolScheduler) -> None:
    for b in s.backends:
        assert (b.active, b.outstanding_tokens, b.reserved_kv_tokens, b.bucket_active) == (0, 0, 0, {})
        assert s.dispatcher.shield.pending.get(b.url, {}) == {}
    assert len(s.queue) == 0 and s.in_flight == 0 and s.waiting == 0


async def test_light_load_dispatches_at_once_and_release_is_idempotent() -> None:
    clock = FakeClock()
    s = _sched(policy(), clock=clock)
    t = ticket(prompt=300, output=100)
    lease = await s.acquire(t)
    assert lease.backend.url == "http://b0" and lease.dispatched_at == 1000.0
    assert (t.backend, t.dispatched_at) == (None, None)  # the pipeline's to set, as it opens the attempt
    snap = s.snapshot()
    assert snap["backends"][0] | {"limit": None} == {
        "url": "http://b0",
        "available": True,
        "limit": None,
        "limit_value": 32.0,
        "prefill_duty": 1.0,
        "active": 1,
        "outstanding_tokens": 400,
        "reserved_kv_tokens": 400,
        "kv_occupied_tokens": 400,
        "max_total_tokens": None,
        "round_prefill_tokens": 300,
        "pending_prefill_tokens": 300,  # a stream until its first byte
        "prefix_index": {  # a ticket without a prompt's chunk chain is not indexed
            "chunks": 0,
            "tokens": 0,
            "capacity_tokens": 1 << 18,
            "requests": 0,
            "hits": 0,
            "hit_rate": None,
            "predicted_token_share": None,
            "engine_token_share": None,
        },
        "buckets": {"text": 1},
    }
    lease.started()
    assert s.snapshot()["backends"][0]["pending_prefill_tokens"] == 0
    lease.release(Usage(300, 50), "ok", ttft_s=0.05, tpot_s=0.02)
    lease.release(Usage(300, 50), "ok", ttft_s=0.05, tpot_s=0.02)
    _assert_idle(s)
    assert s.counters.counter("t1") == 400.0  # estimate 300 + 2·100, reconciled to 300 + 2·50
    assert s.rate.tokens_per_s == 10000.0  # one sample (6000 tok/s) is under prefill_rate_min_samples


async def test_small_requests_at_a_high_rate_to_a_backend_with_room_are_never_held() -> None:
    """The overhead benchmark's case: ~1000 requests/s of 50-token prompts, each served in 5 ms, default
    policy. Many dispatches per round are no load: every request goes the instant it arrives."""
    clock = FakeClock()
    s = _sched(policy(), backends(1), clock)
    running: list[tuple[float, Lease]] = []
    waited = []
    for i in range(2048):  # 2 s of arrivals, one per 1/1024 s
        clock.now = 1000.0 + i / 1024
        for end, lease in running:
            if end <= clock.now:
                lease.release(Usage(50, 10), "ok", ttft_s=0.001, tpot_s=0.0004)
        running = [(end, lease) for end, lease in running if not lease.released]
        task = await spawn(s, ticket(prompt=50, output=10, arrival=clock.now))
        assert task.done(), i
        lease = task.result()
        assert lease.dispatched_at is not None
        waited.append(lease.dispatched_at - lease.ticket.arrival)
        running.append((clock.now + 0.005, lease))
    assert waited == [0.0] * 2048 and s.rejections == {}
    assert s.snapshot()["window_s"] == 0.0
    for _, lease in running:
        lease.release(None, "ok")
    _assert_idle(s)


async def test_a_burst_of_big_prefills_goes_one_round_budget_per_round() -> None:
    clock = FakeClock()
    pol = policy(
        controller={"algorithm": "fixed", "initial": 64, "min": 64, "max": 64},
        budgets={"round_s": 0.125},
        queue={"lifo_after_fraction": None},  # earliest deadline first: the burst before the late one
    )
    s = _sched(pol, backends(1), clock)  # default budget: 8192 prefill tokens per round
    burst = [await spawn(s, ticket(prompt=3000)) for _ in range(8)]
    late = None
    for step in range(1, 97):
        clock.now = 1000.0 + step / 128
        if step == 24:  # 1000.1875, its round's budget spent: it queues behind the burst (EDF)
            late = await spawn(s, ticket(prompt=3000))
        s.pump()
        await settle()
    assert late is not None
    rounds: dict[float, int] = {}
    for t in [*burst, late]:
        at = t.result().dispatched_at
        assert at is not None
        rounds[at] = rounds.get(at, 0) + 1
    # the first round opened on arrival, released 2 × 3000 and spent its budget; every later round
    # opens at the end of the last and releases what fits
    assert rounds == {1000.0: 2, 1000.125: 2, 1000.25: 2, 1000.375: 2, 1000.5: 1}
    assert late.result().dispatched_at == 1000.5  # the burst's own requests stayed first
    for t in [*burst, late]:
        t.result().release(None, "ok")
    _assert_idle(s)


async def test_observe_prefill_measures_the_engine_not_its_queue() -> None:
    s = _sched(policy(queue={"prefill_rate_window": 20}))
    for _ in range(3):
        s.observe_prefill(1000, 0.25)  # queued behind other prefills: 4000 tokens/s
    assert s.rate.tokens_per_s == 10000.0  # under prefill_rate_min_samples (4): the prior holds
    for _ in range(14):
        s.observe_prefill(1000, 0.25)
    assert s.rate.tokens_per_s == 4000.0  # every request queued: the least-queued tenth is all we know
    for _ in range(3):
        s.observe_prefill(1000, 0.0625)  # met an idle engine: 16000 tokens/s
    assert s.rate.tokens_per_s == 16000.0  # rank ceil(0.9 · 20) = 18 of 20
    assert s.snapshot()["prefill_tokens_per_s"] == 16000.0


async def test_snapshot_tells_why_the_head_of_the_queue_waits() -> None:
    clock = FakeClock()
    pol = policy(
        controller=FIXED_1,
        # no spacing of big lower-band prompts: `low` (700, below band 10) would wait for a spaced turn
        budgets={"prefill_tokens_per_round": 1024, "shield": {"duty": None}},
    )
    s = _sched(pol, clock=clock)
    running = await s.acquire(ticket(prompt=300))
    clock.now = 1000.25
    low = await spawn(s, ticket(priority=0, tenant="lo", prompt=700))  # the one slot is taken
    clock.now = 1000.5
    high = await spawn(s, ticket(priority=10, tenant="hi", prompt=50))
    snap = s.snapshot()  # a round opened at 1000.5 for the arrival; nothing fits a slot
    assert snap["queue_by_priority"] == {"0": 1, "10": 1} and snap["queued_prefill_tokens"] == 750
    assert snap["oldest_wait_by_priority"] == {"0": 0.25, "10": 0.0} and snap["oldest_wait_s"] == 0.25
    assert snap["head"] | {"id": None} == {
        "id": None,
        "tenant": "hi",
        "priority": 10,
        "wait_s": 0.0,
        "prompt_tokens": 50,
        "blocked_by": {"http://b0": "concurrency"},
    }
    assert snap["round"] == {"open": True, "age_s": 0.0, "dispatched_by_priority": {}}
    clock.now = 1000.75  # round over: a round opened now would judge the head the same
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "concurrency"}
    running.release(None, "ok")  # high goes in a round opened now
    assert (await high).dispatched_at == 1000.75
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "concurrency"}
    high.result().release(None, "ok")
    (await low).release(None, "ok")
    assert s.snapshot()["rejections"] == {}
    _assert_idle(s)
    assert s.snapshot()["head"] is None


async def test_cancelled_waiter_leaves_the_queue_cleanly() -> None:
    s = _sched(policy(controller=FIXED_1))
    first = await s.acquire(ticket())
    waiting = await spawn(s, ticket())
    assert len(s.queue) == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(s.queue) == 0 and s.waiting == 0
    first.release(Usage(100, 0), "ok")
    _assert_idle(s)


async def test_waiter_cancelled_after_dispatch_gives_its_lease_back() -> None:
    s = _sched(policy(controller=FIXED_1))
    first = await s.acquire(ticket())
    waiting = await spawn(s, ticket(tenant="late"))
    first.release(Usage(100, 0), "ok")  # dispatches the waiter synchronously ...
    assert s.backends[0].active == 1
    waiting.cancel()  # ... but it is cancelled before it resumes and never sees its lease
    with pytest.raises(asyncio.CancelledError):
        await waiting
    _assert_idle(s)
    assert s.counters.counter("late") == 0.0  # refunded: Usage(0, 0)


async def test_displaced_waiter_gets_503_and_arrival_takes_its_place() -> None:
    pol = policy(controller=FIXED_1, queue={"classes": {"interactive": {"max_queue_depth": 1}}})
    s = _sched(pol)
    running = await s.acquire(ticket(priority=5))
    low = await spawn(s, ticket(priority=0))
    high = await spawn(s, ticket(priority=10))
    with pytest.raises(ApiError) as exc:
        await low
    assert (exc.value.status, exc.value.code) == (503, "displaced")
    running.release(None, "ok")
    (await high).release(None, "ok")
    assert s.rejections == {("displaced", "interactive"): 1}
    _assert_idle(s)


async def test_bad_class_and_exhausted_retries_are_clear_errors() -> None:
    s = _sched(policy())
    with pytest.raises(ApiError) as exc:
        await s.acquire(ticket(cls="gold"))
    assert (exc.value.status, exc.value.code, exc.value.param) == (
        400,
        "invalid_traffic_class",
        "x-omnigate-class",
    )
    with pytest.raises(ApiError) as exc:
        await s.acquire(ticket(), exclude={"http://b0"})
    assert (exc.value.status, exc.value.code) == (503, "no_backend")


async def test_overload_answers_shrink_the_limit_and_policy_reload_applies() -> None:
    pol = policy(controller={"algorithm": "aimd", "initial": 8, "min": 2, "max": 8, "backoff": 0.5})
    current = {"p": pol}
    s = PoolScheduler("interactive", backends(1), lambda: current["p"].admission, clock=FakeClock())
    (await s.acquire(ticket())).release(None, "overloaded")
    assert s.limits["http://b0"].limit == 4 and s.backends[0].concurrency_limit == 4
    current["p"] = policy(controller={"algorithm": "fixed", "initial": 3, "min": 1, "max": 8})
    s.pump()
    assert s.backends[0].concurrency_limit == 3


async def test_two_backlogged_tenants_weights_1_to_3_share_tokens_1_to_3() -> None:
    pol = policy(
        controller=FIXED_1,
        window={"accumulate": {}},
        budgets={"prefill_tokens_per_round": 10**9},
        queue={"classes": {"interactive": {"shed_by_deadline": False}}},
        fairness={"weights": {"light": 1.0, "heavy": 3.0}},
    )
    s = _sched(pol)
    # different shapes on purpose: light sends 200-token prompts, heavy 100 + 100 output (estimated 50)
    tasks = {
        "light": [await spawn(s, ticket(tenant="light", prompt=200)) for _ in range(150)],
        "heavy": [await spawn(s, ticket(tenant="heavy", prompt=100, output=50)) for _ in range(150)],
    }
    service = {"light": 0, "heavy": 0}
    for _ in range(160):  # both tenants stay backlogged throughout
        lease = next(t.result() for ts in tasks.values() for t in ts if t.done() and not t.result().released)
        usage = Usage(lease.ticket.cost.prompt_tokens, 100 if lease.ticket.tenant == "heavy" else 0)
        service[lease.ticket.tenant] += usage.prompt_tokens + 2 * usage.completion_tokens
        lease.release(usage, "ok")
        await settle()
    ratio = service["heavy"] / service["light"]
    assert abs(ratio - 3.0) / 3.0 <= 0.10, service
    for ts in tasks.values():
        for t in ts:
            t.cancel()
    await asyncio.gather(*(t for ts in tasks.values() for t in ts), return_exceptions=True)
    for ts in tasks.values():
        for t in ts:
            if not t.cancelled():
                t.result().release(None, "ok")
    _assert_idle(s)


async def test_text_behind_a_multi_image_waiting_on_its_bucket_cap_is_admitted_and_served() -> None:
    """Its prompt would miss the deadline if the waiting multi-image's prefill went first; it does not:
    the dispatcher passes a request at its bucket's cap, and so does the queue's prediction."""
    pol = policy(
        controller={"algorithm": "fixed", "initial": 4, "min": 4, "max": 4},
        budgets={"bucket_caps": {"multi_image": 1}, "prefill_rate_fraction": None},
        queue={"initial_prefill_tokens_per_s": 1000.0},
        window={"accumulate": {}},
    )
    s = _sched(pol)
    running = await s.acquire(ticket(bucket="multi_image", prompt=100, output=10))
    waiting = await spawn(s, ticket(bucket="multi_image", prompt=1500))  # first token at 1001.5 ≤ 1002
    assert not waiting.done() and len(s.queue) == 1
    text = await s.acquire(ticket(prompt=600))  # after the 1500 tokens its first token would be 1002.1
    assert text.backend.url == "http://b0" and s.snapshot()["rejections"] == {}
    text.release(None, "ok")
    running.release(None, "ok")
    (await waiting).release(None, "ok")
    _assert_idle(s)


async def test_chaos_never_exceeds_budgets_and_returns_every_counter_to_zero() -> None:
    rng = random.Random(7)
    first_bytes = random.Random(8)  # its own sequence: the clients' draws stay as they were
    clock = FakeClock()
    pol = policy(
        controller={"algorithm": "fixed", "initial": 3, "min": 1, "max": 3},
        budgets={
            "prefill_tokens_per_round": 1000,
            "round_s": 0.05,
            "bucket_caps": {"multi_image": 1},
            "shield": {"tokens": 300, "duty": 0.3},
        },
        queue={"classes": {"interactive": {"ttft_p99_s": 1.0, "max_queue_depth": 20, "max_wait_s": 1.0}}},
    )
    pool = backends(2)
    s = _sched(pol, pool, clock)
    rounds: dict[tuple[float | None, str], list[int]] = {}
    spaced: list[int] = []  # big lower-ranked prompts spacing the backend after each dispatch
    violations: list[str] = []
    outcomes: dict[str, int] = {}

    def check() -> None:
        for b in pool:
            if b.active > 3 or b.bucket_active.get("multi_image", 0) > 1:
                violations.append(f"{b.url}: active {b.active}, buckets {b.bucket_active}")

    async def client() -> None:
        t = ticket(
            tenant=rng.choice("abc"),
            priority=rng.choice([0, 5, 10]),
            prompt=rng.randint(10, 1500),
            output=rng.randint(0, 200),
            bucket=rng.choice(["text", "text", "multi_image"]),
            arrival=clock.now,
        )
        exclude = {"http://b1"} if rng.random() < 0.1 else set()
        try:
            lease = await s.acquire(t, exclude=exclude)
        except ApiError as e:
            outcomes[str(e.code)] = outcomes.get(str(e.code), 0) + 1
            return
        check()
        outcome = "cancelled"
        try:
            for _ in range(rng.randint(0, 6)):
                await asyncio.sleep(0)
                if first_bytes.random() < 0.3:
                    lease.started()  # the first byte (a second call changes nothing)
            outcome = rng.choice(["ok", "ok", "overloaded", "error"])
        finally:
            usage = Usage(t.cost.prompt_tokens, rng.randint(0, 300))
            lease.release(usage, outcome, ttft_s=0.1, tpot_s=0.03)
            if rng.random() < 0.3:
                lease.release(None, "ok")  # a second release must change nothing
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

    commit = s.dispatcher.commit

    def recording_commit(t: Ticket, b: BackendState, ctx: Decision, **kw: Any) -> int:  # per round, backend
        rounds.setdefault((s.dispatcher.rounds.started, b.url), []).append(t.cost.prompt_tokens)
        prio = commit(t, b, ctx, **kw)
        spaced.append(len(s.dispatcher.shield.spacing.get(b.url, {})))
        return prio

    s.dispatcher.commit = recording_commit  # type: ignore[method-assign,assignment]
    runner = asyncio.create_task(s.run())
    tasks: list[asyncio.Task[None]] = []
    for _ in range(300):
        tasks.extend(asyncio.create_task(client()) for _ in range(rng.randint(0, 3)))
        for task in rng.sample(tasks, k=min(len(tasks), 2)):
            if rng.random() < 0.2:
                task.cancel()
        clock.advance(0.01)
        s.pump()
        check()
        await asyncio.sleep(0)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)

    assert violations == []
    for (_, url), prompts in rounds.items():
        assert sum(prompts) <= 1000 or len(prompts) == 1, (url, prompts)
    assert outcomes.get("ok", 0) > 50 and outcomes.get("cancelled", 0) > 0, outcomes
    assert max(spaced) > 0  # big lower-ranked prompts were spaced (shield.duty) along the way
    refused = {"ok", "overloaded", "error", "cancelled"}
    assert sum(n for code, n in outcomes.items() if code not in refused) > 0
    _assert_idle(s)
