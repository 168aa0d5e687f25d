"""Shared builders for admission tests: a fake clock, tickets, policies and backends."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from gateway.admission.blocks import Block
from gateway.admission.decision import Decision, SlotRule
from gateway.admission.dispatch import Dispatcher
from gateway.admission.fairness import token_charge
from gateway.admission.lease import Lease
from gateway.admission.queue import Entry, effective_deadline
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.settings import PoolBudgets
from gateway.backends.state import BackendState
from gateway.livepolicy.policy import Policy
from gateway.request.ticket import Cost, Ticket


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


_ids = iter(range(1, 10**9))


def ticket(
    *,
    tenant: str = "t1",
    priority: int = 5,
    prompt: int = 100,
    output: int = 0,
    bucket: str = "text",
    cls: str = "interactive",
    arrival: float = 1000.0,
    deadline: float = float("inf"),
    stream: bool = True,
) -> Ticket:
    return Ticket(
        id=f"req-{next(_ids)}",
        model="m",
        stream=stream,
        arrival=arrival,
        tenant=tenant,
        pool=cls,
        traffic_class=cls,
        priority=priority,
        bucket=bucket,
        cost=Cost(text_tokens=prompt, expected_output_tokens=output),
        deadline=deadline,
    )


def policy(**sections: Any) -> Policy:
    """A Policy from plain dicts per section, e.g. policy(window={"accumulate": {}})."""
    return Policy.model_validate(sections)


def miss(d: Dispatcher, t: Ticket, b: BackendState, ctx: Decision, *, metered: bool = True) -> Block | None:
    """The first shared budget `t` misses on `b`, as placement asks it."""
    return d.shared_budget_miss(d.ask(t, ctx), b, ctx, metered=metered)


def decision(
    budgets: PoolBudgets | None = None,
    *,
    limit: int = 8,
    limits: Mapping[str, int] | None = None,
    now: float = 0.0,
    rule: SlotRule | None = None,
    pool_slots: int = 0,
    prefill_rate: float = math.inf,
    inbound: Mapping[str, int] | None = None,
) -> Decision:
    """A dispatcher's decision context: `limits` per backend URL, else `limit` for every backend."""
    return Decision(
        now=now,
        budgets=budgets or PoolBudgets(),
        limits=limits if limits is not None else defaultdict(lambda: limit),
        rule=rule or SlotRule(),
        pool_slots=pool_slots,
        prefill_rate=prefill_rate,
        inbound=inbound or {},
    )


def entry(t: Ticket, pol: Policy | None = None, *, weight: float = 1.0, now: float | None = None) -> Entry:
    """An Entry as PoolScheduler.acquire builds it (VTC charge from the policy's fairness weights)."""
    pol = pol or Policy()
    slo = pol.queue.classes[t.traffic_class]
    fair = pol.fairness
    charge = token_charge(
        t.cost.prompt_tokens, t.cost.expected_output_tokens, weight, fair.input_weight, fair.output_weight
    )
    return Entry(t, slo, effective_deadline(t, slo), weight, t.arrival if now is None else now, charge)


def backends(n: int = 1, pool: str = "interactive", **fields: Any) -> list[BackendState]:
    return [BackendState(url=f"http://b{i}", pool=pool, **fields) for i in range(n)]


async def settle() -> None:
    """Let woken acquire() calls resume."""
    for _ in range(3):
        await asyncio.sleep(0)


async def spawn(s: PoolScheduler, t: Ticket, **kw: Any) -> asyncio.Task[Lease]:
    """Start `s.acquire(t)` and let it run as far as it can."""
    task = asyncio.create_task(s.acquire(t, **kw))
    await settle()
    return task
