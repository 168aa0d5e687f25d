"""Dispatcher budgets: concurrency, prefill per round, KV watermark, bucket caps, head-of-line, choice."""

from __future__ import annotations

from gateway.admission.budgets import backend_load, kv_occupied, vacate
from gateway.admission.dispatch import Dispatcher
from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.queue import Entry, SLOQueue
from gateway.admission.settings import PoolBudgets
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket
from tests.admission.helpers import backends, decision, entry, miss, ticket

BUDGETS = PoolBudgets(prefill_tokens_per_round=1000, kv_watermark=0.5, bucket_caps={"multi_image": 1})
CTX = decision(BUDGETS)


def _fits(d: Dispatcher, t: Ticket, b: BackendState) -> bool:
    return miss(d, t, b, CTX) is None


def _run(entries: list[Entry], pool: list[BackendState], limit: int = 8) -> list[tuple[Entry, str]]:
    """Dispatch greedily in one round, as the scheduler does; return (entry, backend url) in order."""
    q = SLOQueue(VirtualTokenCounters())
    for e in entries:
        q.push(e)
    d = Dispatcher()
    d.open_round(0.0)
    out = []
    ctx = decision(BUDGETS, limit=limit)
    while (placed := d.place(q.ordered(), pool, ctx)) is not None:
        e, b = placed
        q.remove(e)
        d.commit(e.ticket, b, ctx)
        out.append((e, b.url))
    return out


def test_concurrency_limit_caps_active() -> None:
    pool = backends(1)
    es = [entry(ticket(prompt=10)) for _ in range(5)]
    assert [e for e, _ in _run(es, pool, limit=3)] == es[:3]
    assert pool[0].active == 3


def test_prefill_budget_per_round_and_big_request_alone() -> None:
    pool = backends(1)
    es = [entry(ticket(prompt=p)) for p in (600, 400, 1)]
    assert [e for e, _ in _run(es, pool)] == es[:2]  # 600 + 400 = budget; the next token waits
    big = [entry(ticket(prompt=5000)), entry(ticket(prompt=1))]
    pool = backends(1)
    assert [e for e, _ in _run(big, pool)] == big[:1]  # alone in an empty round, then the round is full


def test_new_round_resets_prefill_budget_and_round_timing() -> None:
    d = Dispatcher()
    b = backends(1)[0]
    d.open_round(10.0)
    d.commit(ticket(prompt=1000), b, CTX)
    assert d.rounds.is_open(10.4, PoolBudgets(round_s=0.5)) and not d.rounds.is_open(
        10.5, PoolBudgets(round_s=0.5)
    )
    assert d.rounds.ends(PoolBudgets(round_s=0.5)) == 10.5
    assert not _fits(d, ticket(prompt=1), b)
    d.open_round(10.5)
    assert _fits(d, ticket(prompt=1000), b)


def test_kv_watermark_uses_max_of_scraped_and_reserved() -> None:
    b = BackendState(url="http://b0", pool="p", max_total_tokens=1000, used_tokens=300, active=1)
    d = Dispatcher()
    b.reserved_kv_tokens = 100  # scrape says 300 → occupancy 300; 300 + 200 ≤ 0.5 · 1000
    assert kv_occupied(b) == 300
    assert _fits(d, ticket(prompt=150, output=50), b)
    assert not _fits(d, ticket(prompt=150, output=51), b)
    b.reserved_kv_tokens = 450  # our reservations exceed the (lagging) scrape → occupancy 450
    assert kv_occupied(b) == 450
    assert _fits(d, ticket(prompt=50), b)
    assert not _fits(d, ticket(prompt=51), b)
    b.used_tokens, b.token_usage = None, 0.49  # only the usage ratio was scraped
    b.reserved_kv_tokens = 0
    assert kv_occupied(b) == 490


def test_kv_check_off_before_first_scrape_and_for_an_idle_backend() -> None:
    d = Dispatcher()
    unscraped = BackendState(url="http://b0", pool="p", active=3)
    idle = BackendState(url="http://b1", pool="p", max_total_tokens=100, used_tokens=90)
    assert _fits(d, ticket(prompt=900), unscraped)
    assert _fits(d, ticket(prompt=900), idle)


def test_bucket_at_cap_is_skipped_not_blocking() -> None:
    pool = backends(1)
    mm1, mm2 = (entry(ticket(prompt=10, bucket="multi_image", priority=10)) for _ in range(2))
    text = entry(ticket(prompt=10, priority=0))
    assert _run([mm1, mm2, text], pool) == [(mm1, "http://b0"), (text, "http://b0")]
    assert pool[0].bucket_active == {"multi_image": 1, "text": 1}


def test_shared_budget_blocks_lower_requests() -> None:
    pool = backends(1)
    big = entry(ticket(prompt=900, priority=10))
    blocked = entry(ticket(prompt=200, priority=5))
    small = entry(ticket(prompt=50, priority=0))  # would fit the 100 left, but must not overtake
    assert [e for e, _ in _run([big, blocked, small], pool)] == [big]


def test_excluded_backends_are_skipped_and_least_outstanding_wins() -> None:
    pool = backends(3)
    pool[0].outstanding_tokens = 50
    pool[1].outstanding_tokens = 10
    pool[2].outstanding_tokens = 0
    pool[2].healthy = False
    pool[1].circuit = "open"
    e = entry(ticket(prompt=10))
    assert _run([e], pool) == [(e, "http://b0")]
    retry = entry(ticket(prompt=10))
    retry.exclude = frozenset({"http://b0"})
    assert _run([retry], pool) == []


def test_commit_and_release_are_exact_inverses() -> None:
    b = backends(1)[0]
    d = Dispatcher()
    t = ticket(prompt=100, output=30, bucket="single_image")
    d.commit(t, b, CTX)
    assert (b.active, b.outstanding_tokens, b.reserved_kv_tokens, b.bucket_active) == (
        1,
        130,
        130,
        {"single_image": 1},
    )
    vacate(b, t)
    assert (b.active, b.outstanding_tokens, b.reserved_kv_tokens, b.bucket_active) == (0, 0, 0, {})


def test_a_round_counts_the_pools_own_dispatches_by_band_and_every_prompt_against_its_budget() -> None:
    d = Dispatcher()
    d.open_round(10.0)
    pool = backends(1)
    for p, prompt in ((0, 1000), (5, 10), (5, 20), (10, 300)):
        d.commit(ticket(priority=p, prompt=prompt), pool[0], CTX)
    d.commit(ticket(priority=10, prompt=4000), pool[0], CTX, loan=True)  # another pool's request
    assert d.rounds.dispatched == {0: 1, 5: 2, 10: 1}
    assert d.rounds.released(pool[0].url) == 5330  # the loan spends the lender's budget too
    d.open_round(10.5)
    assert (d.rounds.dispatched, d.rounds.released(pool[0].url)) == ({}, 0)


def test_room_is_every_budget_but_the_rounds_prefill() -> None:
    pool = backends(2)
    budgets = PoolBudgets(prefill_tokens_per_round=100, kv_watermark=0.5, bucket_caps={"multi_image": 1})
    d = Dispatcher()
    d.open_round(0.0)
    d.commit(ticket(prompt=100), pool[0], CTX)
    d.commit(ticket(prompt=100), pool[1], CTX)
    limits = {"http://b0": 2, "http://b1": 2}
    e = entry(ticket(prompt=50))

    def has_room(e: Entry, limits: dict[str, int] = limits) -> bool:
        return d.slot_wait(e, pool, decision(budgets, limits=limits), 0.0, 30.0) == 0.0

    assert (
        d.place([e], pool, decision(budgets, limits=limits)) is None
    )  # the round's prefill is spent on both ...
    assert has_room(e)  # ... but that frees itself within round_s
    assert not has_room(e, {"http://b0": 1, "http://b1": 1})  # concurrency
    pool[0].max_total_tokens = pool[1].max_total_tokens = 200
    assert not has_room(e)  # KV: 100 + 50 > 0.5 · 200
    pool[1].max_total_tokens = None  # unknown before the first scrape: no KV check
    assert has_room(e)
    pool[1].circuit = "half_open"  # a half-open circuit lets requests through: room
    assert has_room(e)
    pool[1].circuit = "open"
    assert not has_room(e)
    pool[1].circuit = "closed"
    e.exclude = frozenset({"http://b1"})
    assert not has_room(e)
    mm = entry(ticket(prompt=50, bucket="multi_image"))
    pool[1].bucket_active["multi_image"] = 1
    assert not has_room(mm)  # b0 by KV, b1 by its bucket cap


def test_backend_load_is_the_fuller_of_slots_and_kv() -> None:
    b = BackendState(url="http://b0", pool="p", active=1)
    assert backend_load(b, 4, PoolBudgets(kv_watermark=0.8)) == 0.25  # KV unknown before the first scrape
    b.max_total_tokens, b.used_tokens = 1000, 600
    assert backend_load(b, 4, PoolBudgets(kv_watermark=0.8)) == 0.75
