"""Acceptance: a low-priority flood at 3× capacity never gets a high-priority request refused.

The whole PoolScheduler (default policy, fixed concurrency) runs on a fake clock against a small engine
model that uses SGLang-style priority scheduling: per backend one prefill at a time at RATE tokens/s,
highest priority first, then OUTPUT decode steps of TPOT. Low-priority prefills therefore queue inside
the engine and report long TTFTs while high-priority ones are fast — the case where a prefill rate
averaged from prompt/TTFT collapses and high-priority requests get refused as "unattainable" although
they would start at once (the old EWMA estimate refused 45 of the 60 high requests below).
Two low-priority tenants send 3× the pool's capacity; two high-priority tenants send 3 requests/s of
4000-token (multi-image sized) prompts: alone, 60 % of the prefill rate and a fifth of the slots.
Deterministic: fixed arrival rates, fixed clock steps.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from gateway.admission.scheduler import Lease, PoolScheduler
from gateway.request.errors import ApiError
from gateway.request.ticket import Ticket, Usage
from tests.admission.helpers import FakeClock, backends, policy, settle, ticket

RATE = 10_000.0  # engine prefill tokens/s per backend
TPOT = 0.02
OUTPUT = 50
LIMIT = 16
CAPACITY = min(2 * LIMIT / (1000 / RATE + OUTPUT * TPOT), 2 * RATE / 1000)  # of 1000-token requests/s
STEP = 0.005
SECONDS = 20.0  # of arrivals, then DRAIN seconds without arrivals so every request ends one way or another
DRAIN = 3.0


@dataclass(eq=False)
class _Run:
    lease: Lease
    dispatched: float
    left: float  # prompt tokens still to prefill
    first_token: float = 0.0


class _Engine:
    """Per backend one prefill at a time, highest priority first (SGLang priority scheduling; FIFO within
    a priority), RATE tokens/s; then OUTPUT decode steps of TPOT. Advanced in clock steps."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.prefilling: dict[str, list[_Run]] = {}
        self.decoding: list[_Run] = []
        self.ttft: dict[int, list[float]] = {}  # priority → arrival-to-first-token times

    def start(self, lease: Lease) -> None:
        run = _Run(lease, self.clock.now, lease.ticket.cost.prompt_tokens)
        self.prefilling.setdefault(lease.backend.url, []).append(run)

    def step(self, seconds: float) -> None:
        now = self.clock.now
        for waiting in self.prefilling.values():
            waiting.sort(key=lambda r: -r.lease.ticket.priority)
            budget = RATE * seconds
            while waiting and budget > 0:
                run = waiting[0]
                done = min(budget, run.left)
                run.left -= done
                budget -= done
                if run.left == 0:
                    waiting.pop(0)
                    run.first_token = now
                    self.decoding.append(run)
                    ticket = run.lease.ticket
                    self.ttft.setdefault(ticket.priority, []).append(now - ticket.arrival)
        for run in [r for r in self.decoding if r.first_token + OUTPUT * TPOT <= now]:
            self.decoding.remove(run)
            usage = Usage(run.lease.ticket.cost.prompt_tokens, OUTPUT)
            run.lease.release(usage, "ok", ttft_s=run.first_token - run.dispatched, tpot_s=TPOT)


async def test_low_priority_flood_at_3x_capacity_never_refuses_high_priority_within_capacity() -> None:
    clock = FakeClock()
    pol = policy(controller={"algorithm": "fixed", "initial": LIMIT, "min": LIMIT, "max": LIMIT})
    s = PoolScheduler("interactive", backends(2), lambda: pol.admission, clock=clock)
    engine = _Engine(clock)
    outcomes: Counter[tuple[int, str]] = Counter()

    async def client(t: Ticket) -> None:
        try:
            lease = await s.acquire(t)
        except ApiError as e:
            outcomes[(t.priority, str(e.code))] += 1
            return
        engine.start(lease)
        outcomes[(t.priority, "ok")] += 1

    flows = [  # (priority, tenants, prompt tokens, requests/s)
        (0, ("low-a", "low-b"), 1000, 3 * CAPACITY),
        (10, ("high-a", "high-b"), 4000, 3.0),
    ]
    due = [0.0 for _ in flows]
    sent = [0 for _ in flows]
    tasks: list[asyncio.Task[None]] = []
    for step in range(int((SECONDS + DRAIN) / STEP)):
        clock.advance(STEP)
        engine.step(STEP)
        for i, (priority, tenants, prompt, rate) in enumerate(flows):
            due[i] += rate * STEP if step < SECONDS / STEP else 0.0
            while due[i] >= 1.0:
                due[i] -= 1.0
                tenant = tenants[sent[i] % len(tenants)]
                sent[i] += 1
                t = ticket(tenant=tenant, priority=priority, prompt=prompt, output=OUTPUT, arrival=clock.now)
                tasks.append(asyncio.create_task(client(t)))
        s.pump()
        await settle()
    assert all(task.done() for task in tasks)

    assert sent[1] == 60
    high = {code: n for (p, code), n in outcomes.items() if p == 10}
    assert high == {"ok": 60}, high  # no slo_unattainable, no queue_full, nothing left waiting
    assert max(engine.ttft[10]) <= 2.0  # and each really met its TTFT SLO in the model
    low_refused = sum(n for (p, code), n in outcomes.items() if p == 0 and code != "ok")
    assert low_refused > sent[0] / 2  # the flood really was 3× capacity: most of it was turned away
    assert ("slo_unattainable", "interactive") in s.rejections
