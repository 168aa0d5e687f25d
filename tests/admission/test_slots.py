"""Slot headroom (slots.py): band reserve, tenant share, step-down relief, turnover — exact, fake clocks."""

from __future__ import annotations

import asyncio

from gateway.admission.decision import SlotRule
from gateway.admission.dispatch import Dispatcher
from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.queue import SLOQueue
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.slots import Holdings, slot_margin, slot_miss
from gateway.backends.state import BackendState
from tests.admission.helpers import FakeClock, backends, decision, entry, policy, settle, spawn, ticket

BANDS = SlotRule(top_band=10, band_fraction=0.15)


def _run(d: Dispatcher, b: BackendState, n: int, **fields: object) -> None:
    """`n` requests dispatched to `b` and running."""
    for _ in range(n):
        d.commit(ticket(**fields), b, decision())  # type: ignore[arg-type]


def _served(d: Dispatcher, b: BackendState, taken: float, freed: float) -> None:
    """One request held a slot on `b` from `taken` to `freed`."""
    t = ticket()
    d.commit(t, b, decision(now=taken))
    d.release(t, b, freed)


def _hold(held: Holdings, b: BackendState, n: int, **fields: object) -> None:
    for _ in range(n):
        held.add(b.url, ticket(**fields))  # type: ignore[arg-type]
        b.active += 1


def test_band_reserve_is_a_rounded_up_share_of_the_limit_below_the_top_band_only() -> None:
    assert [BANDS.band_reserve(band, 64) for band in (0, 5, 9, 10, 11)] == [10, 10, 10, 0, 0]  # ⌈9.6⌉
    assert BANDS.band_reserve(0, 4) == 1  # ⌈0.6⌉: 3 of 4 slots for the lower bands
    assert BANDS.band_reserve(0, 1) == 0  # a ceiling never falls below one slot
    assert SlotRule(top_band=10).band_reserve(0, 64) == 0  # no fraction, no reserve
    assert policy().queue.priorities.top == 10
    assert policy(queue={"priorities": {"levels": {}}}).queue.priorities.top is None


def test_lower_bands_stop_at_the_reserve_the_top_band_uses_the_whole_limit() -> None:
    b, held = backends(1)[0], Holdings()
    _hold(held, b, 53, priority=0)
    low, high = ticket(priority=0), ticket(priority=10)
    assert slot_miss(low, b, 64, BANDS, held) is None and slot_margin(low, b, 64, BANDS, held) == 1
    _hold(held, b, 1, priority=0)
    assert slot_miss(low, b, 64, BANDS, held) == "band_reserve" and slot_margin(low, b, 64, BANDS, held) == 0
    _hold(held, b, 9, priority=10)
    assert slot_miss(high, b, 64, BANDS, held) is None  # 63 < 64
    _hold(held, b, 1, priority=10)
    assert slot_miss(high, b, 64, BANDS, held) == "concurrency"
    assert slot_miss(low, b, 64, BANDS, held) == "concurrency" and slot_margin(low, b, 64, BANDS, held) == -10


def test_when_the_limit_steps_below_the_running_set_the_top_band_still_gets_its_headroom() -> None:
    b, held = backends(1)[0], Holdings()
    _hold(held, b, 54, priority=0)  # admitted under limit 64; the limit now falls to 51
    high, low = ticket(priority=10), ticket(priority=0)
    # low's ceiling at 51 is 51 − ⌈7.65⌉ = 43: the 11 slots low holds beyond it do not count for the top band
    assert slot_miss(low, b, 51, BANDS, held) == "concurrency" and slot_margin(low, b, 51, BANDS, held) == -11
    assert slot_miss(high, b, 51, BANDS, held) is None
    _hold(held, b, 7, priority=10)
    assert slot_miss(high, b, 51, BANDS, held) is None  # 43 + 7 = 50 < 51
    _hold(held, b, 1, priority=10)
    assert slot_miss(high, b, 51, BANDS, held) == "concurrency"  # 43 + 8: the top band's own limit
    assert b.active == 62  # bounded: 51 + the 11 low slots from before the step, which only drain


def test_a_tenant_at_its_weighted_share_leaves_headroom_for_the_others() -> None:
    b, held = backends(1)[0], Holdings()
    rule = SlotRule(tenant_fraction=0.1, present={5: {"heavy": 1.0, "light": 1.0}})
    _hold(held, b, 5, tenant="heavy")
    _hold(held, b, 3, tenant="light")
    heavy, light = ticket(tenant="heavy"), ticket(tenant="light")
    assert slot_miss(heavy, b, 10, rule, held) is None  # holds 5 = its share, 8 < ceiling 10 − 1
    _hold(held, b, 1, tenant="light")
    assert (
        slot_miss(heavy, b, 10, rule, held) == "tenant_share" and slot_margin(heavy, b, 10, rule, held) == 0
    )
    assert slot_miss(light, b, 10, rule, held) is None  # 4 < its share of 5: the last slot is light's
    weighted = SlotRule(tenant_fraction=0.1, present={5: {"heavy": 3.0, "light": 1.0}})  # heavy's: 7.5
    assert slot_miss(heavy, b, 10, weighted, held) is None
    alone = SlotRule(tenant_fraction=0.1, present={5: {"heavy": 1.0}, 0: {"light": 1.0}})
    assert alone.tenant_share(5, "heavy") == 1.0 and slot_miss(heavy, b, 10, alone, held) is None
    assert alone.tenant_share(5, "newcomer") == 0.5  # a tenant not yet present counts itself in
    assert SlotRule(tenant_fraction=0.1).tenant_share(5, "x") == 1.0


def test_a_tenant_held_back_by_its_share_is_skipped_not_blocking_the_others() -> None:
    pool, d = backends(1), Dispatcher()
    rule = SlotRule(tenant_fraction=0.1, present={5: {"heavy": 1.0, "light": 1.0}})
    ctx = decision(rule=rule, limit=10)
    d.open_round(0.0)
    for tenant in ("heavy",) * 5 + ("light",) * 4:
        d.commit(ticket(tenant=tenant, prompt=1), pool[0], ctx)
    q = SLOQueue(VirtualTokenCounters())
    first, second = entry(ticket(tenant="heavy", prompt=1)), entry(ticket(tenant="light", prompt=1))
    q.push(first)
    q.push(second)
    assert list(q.ordered()) == [first, second]
    assert d.place(q.ordered(), pool, ctx) == (second, pool[0])
    assert d.blocked_by(first, pool, ctx) == {"http://b0": "tenant_share"}


def test_slot_wait_is_zero_with_room_for_those_ahead_else_lacking_releases_at_the_pool_rate() -> None:
    pool, d = backends(2), Dispatcher()
    ctx = decision(rule=BANDS, limit=4)
    for b in pool:
        _run(d, b, 3, priority=0)  # each at the low bands' ceiling 4 − 1
    low, high = entry(ticket(priority=0)), entry(ticket(priority=10))
    assert d.slot_wait(high, pool, ctx, 10.0, 30.0) == 0.0  # one free slot per backend
    assert d.slot_wait(high, pool, ctx, 10.0, 30.0, ahead=1) == 0.0
    assert d.slot_wait(high, pool, ctx, 10.0, 30.0, ahead=2) is None  # lacks one: no rate
    assert d.slot_wait(low, pool, ctx, 10.0, 30.0) is None  # no releases seen yet
    for b, held in zip(pool, (3.0, 1.5), strict=True):
        _served(d, b, 9.0 - held, 9.0)
    # 3 running on each: b0 holds a slot 3 s and frees one per second, b1 two: the pool three per second
    assert d.slot_wait(low, pool, ctx, 10.0, 30.0) == 1 / 3
    assert d.slot_wait(low, pool, ctx, 10.0, 30.0, ahead=5) == 2.0
    assert d.slot_wait(high, pool, ctx, 10.0, 30.0, ahead=3) == 2 / 3  # 2 free, 2 lacking
    pool[1].max_total_tokens, pool[1].used_tokens = 100, 100  # b1's KV is full: only b0 predicts
    assert d.slot_wait(low, pool, ctx, 10.0, 30.0) == 1.0


def test_a_replica_owed_slots_held_by_its_peers_waits_at_the_engines_turnover() -> None:
    (b,), d = backends(1), Dispatcher()
    _run(d, b, 2, priority=10)  # its whole share of 2
    _served(d, b, 7.0, 9.0)  # a slot is held 2 s
    waiting = entry(ticket(priority=10))
    assert d.slot_wait(waiting, [b], decision(limit=2), 10.0, 30.0) == 1.0  # its own 2 free one a second
    # 6 of the peers' running requests end into its share: the engine's 8 free four a second
    owed = decision(limit=2, inbound={b.url: 6})
    assert d.slot_wait(waiting, [b], owed, 10.0, 30.0) == 0.25


def test_dispatcher_release_undoes_commit_and_times_the_slot() -> None:
    b, d = backends(1)[0], Dispatcher()
    t = ticket(tenant="a", priority=0, prompt=10)
    d.commit(t, b, decision(now=4.0))
    assert (b.active, b.outstanding_tokens, d.seated()) == (1, 10, {(0, "a")})
    d.release(t, b, 5.0)
    assert (b.active, b.outstanding_tokens, d.seated()) == (0, 0, set())
    d.commit(t, b, decision(now=6.5))
    d.release(t, b, 7.0)
    d.commit(ticket(priority=0), b, decision(now=7.0))  # one running, the limit 1: it waits for the release
    waiting = entry(ticket(priority=0))
    # held 1 s and 0.5 s, from each commit's decision time: one slot frees every 0.75 s
    assert d.slot_wait(waiting, [b], decision(limit=1), 7.0, 30.0) == 0.75


def _ten_slots(reserve_hold_s: float | None, clock: FakeClock) -> PoolScheduler:
    """One backend at a fixed limit of 10, no window, nobody shed by deadline."""
    pol = policy(
        controller={"algorithm": "fixed", "initial": 10, "min": 10, "max": 10},
        window={"accumulate": {}},
        queue={
            "classes": {"interactive": {"shed_by_deadline": False}},
            "priorities": {"reserve_hold_s": reserve_hold_s},
        },
    )
    return PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)


async def test_scheduler_keeps_headroom_for_the_top_band_and_for_a_light_tenant_of_the_same_band() -> None:
    s = _ten_slots(None, FakeClock())  # the reserve is kept before any top-band request
    b = s.backends[0]
    heavy = [await spawn(s, ticket(tenant="heavy", priority=5, prompt=1)) for _ in range(10)]
    assert [t.done() for t in heavy] == [True] * 8 + [False] * 2  # 10 − ⌈1.5⌉ below the top band
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "band_reserve"}
    hi = await spawn(s, ticket(tenant="hi", priority=10, prompt=1))
    assert hi.done()  # a free slot was waiting: no completion needed
    light = await spawn(s, ticket(tenant="light", priority=5, prompt=1))
    assert not light.done() and b.active == 9
    heavy[0].result().release(None, "ok")
    heavy[1].result().release(None, "ok")
    await asyncio.sleep(0)
    # heavy (first by VTC's tie on name) holds 6 ≥ its share 5 of band 5: it leaves ⌈1⌉ more slot free,
    # is skipped, and light takes the slot
    assert light.done() and [t.done() for t in heavy[8:]] == [False, False] and b.active == 8
    hi.result().release(None, "ok")
    await asyncio.sleep(0)
    assert [t.done() for t in heavy[8:]] == [False, False]  # 7 active ≥ heavy's ceiling 10 − 2 − 1
    assert s.snapshot()["head"]["blocked_by"] == {"http://b0": "tenant_share"}
    light.result().release(None, "ok")  # light gone: heavy alone in its band, only the band reserve applies
    await asyncio.sleep(0)
    assert [t.done() for t in heavy[8:]] == [True, True] and b.active == 8
    for t in heavy[2:]:
        t.result().release(None, "ok")
    assert s.dispatcher.seated() == set() and b.active == 0


async def test_the_band_reserve_is_held_only_for_a_while_after_a_top_band_request() -> None:
    clock = FakeClock()
    s = _ten_slots(10.0, clock)
    low = [await spawn(s, ticket(tenant="a", priority=5, prompt=1)) for _ in range(10)]
    assert all(t.done() for t in low)  # no top band seen yet: nothing idles for it
    hi = await spawn(s, ticket(tenant="b", priority=10, prompt=1))
    # the reserve is back from this arrival on; the lower band's 2 slots beyond its new ceiling only
    # drain (step-down relief), so the top band does not wait for them: 11 active for a moment
    assert hi.done() and s.backends[0].active == 11
    more = await spawn(s, ticket(tenant="a", priority=5, prompt=1))
    for t in low[:2]:
        t.result().release(None, "ok")
    await settle()
    assert not more.done() and s.backends[0].active == 9  # 8 low + 1 top ≥ the low ceiling 10 − ⌈1.5⌉
    clock.advance(10.5)  # 10 s without a top-band request: the reserve is let go
    s.pump()
    await settle()
    assert more.done()
    assert s.backends[0].active == 10
    for t in [*low[2:], hi, more]:
        t.result().release(None, "ok")
    assert s.backends[0].active == 0


def test_a_share_of_nothing_places_nothing_whatever_the_rules() -> None:
    (b,), held = backends(1), Holdings()
    tenants = SlotRule(top_band=10, band_fraction=0.15, tenant_fraction=0.1, present={0: {"t1": 1.0}})
    for rule in (SlotRule(), BANDS, tenants):
        for t in (ticket(priority=0), ticket(priority=10)):
            assert slot_miss(t, b, 0, rule, held) == "concurrency"
            assert slot_margin(t, b, 0, rule, held) == 0  # it needs a release and a share to go
