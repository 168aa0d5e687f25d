"""Tenant standing (standing.py), engine priorities and prefill metered per engine priority —
exact, on fake clocks."""

from __future__ import annotations

import asyncio
import math

import pytest

from gateway.admission.decision import Decision, SlotRule
from gateway.admission.dispatch import Dispatcher
from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.queue import SLOQueue
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.settings import PoolBudgets
from gateway.admission.standing import RecentService
from gateway.request.ticket import Usage
from tests.admission.helpers import FakeClock, backends, decision, entry, miss, policy, settle, ticket

METERED = PoolBudgets(prefill_tokens_per_round=1000, round_s=0.1, prefill_rate_fraction=1.0)
TWO = {5: {"light": 1.0, "heavy": 1.0}}  # both tenants waiting or running at band 5, equal weights


def _under(r: RecentService, tenant: str, present: dict[str, float]) -> bool:
    """Is `tenant` below the weighted average recent service of `present` (at 0 s, 60 s window)?"""
    return r.below(tenant, r.totals(present, 0.0, 60.0), 0.0, 60.0)


def _dispatcher(engine_priorities: bool = True) -> tuple[Dispatcher, RecentService]:
    """A dispatcher and the tenants' recent service it judges standing by (the scheduler's to charge)."""
    recent = RecentService()
    return Dispatcher(engine_priorities=engine_priorities, recent=recent), recent


def _ctx(
    *, slots: int = 8, present: dict[int, dict[str, float]] | None = None, budgets: PoolBudgets | None = None
) -> Decision:
    rule = SlotRule(tenant_fraction=0.1, present=TWO if present is None else present)
    return decision(budgets, rule=rule, pool_slots=slots)


def test_recent_service_decays_and_dates_corrections_at_the_dispatch() -> None:
    r = RecentService()
    r.charge("a", 1000.0, now=0.0, window_s=10.0)
    assert r.value("a", 10.0, 10.0) == pytest.approx(1000 / math.e)
    # at 10 s the request ends having cost 500 more than estimated: dated at its dispatch, it decays as
    # the estimate did (an undated correction would add the whole 500 now)
    r.charge("a", 500.0, now=10.0, window_s=10.0, at=0.0)
    assert r.value("a", 10.0, 10.0) == pytest.approx(1500 / math.e)
    r.forget(100.0, 10.0)  # 1500 · e^-10 ≈ 0.07: kept
    assert r.value("a", 100.0, 10.0) == pytest.approx(1500 * math.exp(-10))
    kept = r.version
    r.forget(400.0, 10.0)  # e^-40 of it is below the floor: forgotten (a change), and reads as nothing
    assert r.version == kept + 1 and r.value("a", 400.0, 10.0) == 0.0


def test_under_share_compares_with_the_weighted_average_of_the_present_tenants() -> None:
    r = RecentService()
    r.charge("light", 100.0, now=0.0, window_s=60.0)
    r.charge("heavy", 300.0, now=0.0, window_s=60.0)
    equal = {"light": 1.0, "heavy": 1.0}
    assert _under(r, "light", equal) and not _under(r, "heavy", equal)
    # heavy weighs 3: its 300 is normalised service it is entitled to — both stand equal, nobody is under
    r2 = RecentService()
    r2.charge("light", 100.0, now=0.0, window_s=60.0)
    r2.charge("heavy", 100.0, now=0.0, window_s=60.0)  # charges arrive already divided by the weight
    assert not _under(r2, "light", equal) and not _under(r2, "heavy", equal)
    assert not _under(r, "light", {"light": 1.0})  # alone: nobody to be under


def test_under_share_needs_fewer_slots_and_less_recent_service_than_the_share() -> None:
    (d, recent), ctx = _dispatcher(), _ctx(slots=8)  # each tenant's share: 4 slots
    b = backends(1)[0]
    recent.charge("heavy", 5000.0, now=0.0, window_s=60.0)
    recent.charge("light", 1000.0, now=0.0, window_s=60.0)
    assert d.under_share(5, "light", ctx) and not d.under_share(5, "heavy", ctx)
    running = [ticket(tenant="light") for _ in range(4)]
    for t in running:
        d.commit(t, b, ctx)
    assert not d.under_share(5, "light", ctx)  # at its slot share, however little it was served
    d.release(running[0], b, 0.0)
    assert d.under_share(5, "light", ctx)
    ctx = decision(rule=SlotRule(tenant_fraction=0.0, present=TWO), pool_slots=8)
    assert not d.under_share(5, "light", ctx)  # no tenant headroom configured: no standing either


def test_a_tenant_under_its_share_ranks_half_a_band_above_its_band() -> None:
    (d, recent), ctx = _dispatcher(), _ctx()
    recent.charge("heavy", 5000.0, now=0.0, window_s=60.0)
    assert d.ask(ticket(tenant="light", priority=5), ctx).rank == 5.5
    assert d.ask(ticket(tenant="heavy", priority=5), ctx).rank == 5


def test_engine_priority_is_twice_the_band_plus_one_under_share_and_zero_when_engines_ignore_it() -> None:
    (d, recent), ctx = _dispatcher(), _ctx()
    recent.charge("heavy", 5000.0, now=0.0, window_s=60.0)
    assert d.ask(ticket(tenant="light", priority=5), ctx).engine_priority == 11
    assert d.ask(ticket(tenant="heavy", priority=5), ctx).engine_priority == 10
    assert d.ask(ticket(tenant="heavy", priority=0), ctx).engine_priority == 0
    ignoring, its_recent = _dispatcher(engine_priorities=False)
    its_recent.charge("heavy", 5000.0, now=0.0, window_s=60.0)
    light = ticket(tenant="light", priority=5)
    assert ignoring.ask(light, ctx).rank == 5.5 and ignoring.ask(light, ctx).engine_priority == 0


def test_prefill_is_metered_per_engine_priority_and_carried_from_the_top_down() -> None:
    (d, recent), ctx = _dispatcher(), _ctx(budgets=METERED)
    b = backends(1)[0]
    recent.charge("heavy", 5000.0, now=0.0, window_s=60.0)
    d.open_round(0.0, budgets=METERED)
    assert d.commit(ticket(tenant="heavy", prompt=2500), b, ctx) == 10  # alone into the empty round
    # the heavy tenant's 2500 tokens run after a light request in the engine: they do not meter it
    assert miss(d, ticket(tenant="heavy", prompt=1), b, ctx) == "round_prefill"
    assert miss(d, ticket(tenant="light", prompt=1000), b, ctx) is None
    assert d.commit(ticket(tenant="light", prompt=600), b, ctx) == 11
    assert miss(d, ticket(tenant="light", prompt=401), b, ctx) == "round_prefill"
    assert d.rounds.released(b.url) == 3100 and d.rounds.released(b.url, 11) == 600
    d.open_round(0.1, budgets=METERED)  # one round paid 1000: the 600 at 11 first, then 400 of the 2500
    assert d.rounds.prefill == {b.url: {10: 2100}}
    d.open_round(0.3, budgets=METERED)
    assert d.rounds.prefill == {b.url: {10: 100}}


def test_queue_serves_a_tenant_under_its_share_before_a_lower_counter() -> None:
    counters = VirtualTokenCounters()
    under = {"light"}
    q = SLOQueue(counters, standing=lambda band, tenant: tenant in under)
    heavy = [entry(ticket(tenant="heavy", prompt=100)) for _ in range(3)]
    light = entry(ticket(tenant="light", prompt=50))
    for e in heavy:
        q.push(e)
    counters.charge("light", 10_000)  # light's counter is far above heavy's
    q.push(light)
    assert [e.tenant for e in q.ordered()] == ["light", "heavy", "heavy", "heavy"]
    assert q.prefill_ahead(light) == 0 and q.prefill_ahead(heavy[0]) == 50
    under.clear()  # at its share again: VTC decides, and light's counter is the higher
    assert [e.tenant for e in q.ordered()] == ["heavy", "heavy", "heavy", "light"]
    assert q.prefill_ahead(light) == 300


async def test_a_light_tenant_overtakes_a_heavy_backlog_and_gets_the_higher_engine_priority() -> None:
    clock = FakeClock()
    pol = policy(
        window={"accumulate": {}},
        budgets={"prefill_tokens_per_round": 10**6},
        controller={"algorithm": "fixed", "initial": 4, "min": 4, "max": 4},
        queue={"classes": {"interactive": {"shed_by_deadline": False}}},
    )
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock, engine_priorities=True)
    heavy = [asyncio.create_task(s.acquire(ticket(tenant="heavy", prompt=100, output=100))) for _ in range(8)]
    await settle()
    running = [t.result() for t in heavy if t.done()]
    # the whole limit (no top-band request seen: no band reserve); alone, heavy is under nobody's share
    assert [lease.engine_priority for lease in running] == [10, 10, 10, 10]
    clock.advance(1.0)
    light = asyncio.create_task(s.acquire(ticket(tenant="light", prompt=100, output=100)))
    await settle()
    assert not light.done()  # every slot is taken
    running[0].release(Usage(100, 100), "ok")
    await settle()
    assert light.done() and light.result().engine_priority == 11  # ahead of heavy's 5 waiting
    assert sum(not t.done() for t in heavy) == 4
    for t in heavy:
        t.cancel()
    await settle()


def test_under_share_sees_a_charge_made_at_the_same_instant_and_a_new_rule() -> None:
    """The present tenants' totals are kept between questions (one sum per band, not per tenant): a
    dispatch's charge at the same clock reading and a rebuilt rule must both invalidate them."""
    (d, recent), ctx = _dispatcher(), _ctx(slots=8)
    recent.charge("heavy", 5000.0, now=0.0, window_s=60.0)
    assert d.under_share(5, "light", ctx) and not d.under_share(5, "heavy", ctx)
    recent.charge("light", 9000.0, now=0.0, window_s=60.0)  # same `now`: only the charge changed
    assert not d.under_share(5, "light", ctx) and d.under_share(5, "heavy", ctx)
    ctx = _ctx(present={5: {"light": 1.0, "heavy": 1.0, "idle": 1.0}})
    # a third tenant present with no service lowers the average to (9000 + 5000 + 0) / 3: heavy is no
    # longer under it (the old totals, 7000, would still say it is), the idle one is
    assert not d.under_share(5, "heavy", ctx) and d.under_share(5, "idle", ctx)
    assert d.under_share(
        5, "newcomer", ctx
    )  # absent from the rule: counted with its own weight and no service
