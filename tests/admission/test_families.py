"""The families' contracts (families.py), as the dispatcher keeps them: once every dispatch is released the
lasting budgets refuse exactly what they refused before; a budget that frees itself in time keeps what it
counted until then; a second first byte, or one for a request never dispatched, changes nothing."""

from __future__ import annotations

from gateway.admission.dispatch import Dispatcher
from gateway.admission.settings import PoolBudgets
from gateway.backends.state import BackendState
from tests.admission.helpers import backends, decision, entry, miss, ticket

BUDGETS = PoolBudgets(prefill_tokens_per_round=1000, kv_watermark=0.5, bucket_caps={"multi_image": 2})


def _pool() -> list[BackendState]:
    pool = backends(2)
    for b in pool:
        b.max_total_tokens, b.used_tokens = 10000, 0
    return pool


def test_releasing_every_dispatch_gives_back_all_the_lasting_budgets_held() -> None:
    pool, d = _pool(), Dispatcher()
    ctx = decision(BUDGETS, limit=3)
    d.open_round(0.0)
    probe = entry(ticket(prompt=400))
    assert d.blocked_by(probe, pool, ctx, metered=False) == {}
    running = [
        (ticket(prompt=300, output=200, bucket="multi_image" if i % 3 == 0 else "text"), b)
        for i, b in enumerate(pool * 3)
    ]
    for t, b in running:
        d.commit(t, b, ctx)
    assert d.blocked_by(probe, pool, ctx, metered=False) == {b.url: "concurrency" for b in pool}
    assert [(b.active, b.outstanding_tokens, b.bucket_active) for b in pool] == [
        (3, 1500, {"multi_image": 1, "text": 2})
    ] * 2
    assert d.seated() == {(5, "t1")}
    for t, b in running:
        d.release(t, b, 1.0)
    assert d.blocked_by(probe, pool, ctx, metered=False) == {}
    assert [(b.active, b.outstanding_tokens, b.reserved_kv_tokens, b.bucket_active) for b in pool] == [
        (0, 0, 0, {})
    ] * 2
    assert d.seated() == set()


def test_the_rounds_prefill_stays_spent_after_the_release_until_the_next_round() -> None:
    (b,), d = backends(1), Dispatcher()
    ctx = decision(BUDGETS)
    d.open_round(0.0)
    spent = ticket(prompt=800)
    d.commit(spent, b, ctx)
    d.release(spent, b, 0.1)
    assert miss(d, ticket(prompt=300), b, ctx) == "round_prefill"  # 800 + 300 > 1000, released or not
    assert miss(d, ticket(prompt=300), b, ctx, metered=False) is None  # not lasting: left out of reclaims
    d.open_round(0.5)
    assert miss(d, ticket(prompt=300), b, ctx) is None


def test_a_second_first_byte_or_one_never_dispatched_changes_nothing() -> None:
    (b,), d = backends(1), Dispatcher()
    ctx = decision(BUDGETS)
    d.open_round(0.0)
    first, second = ticket(priority=10, prompt=100), ticket(priority=10, prompt=100)
    d.commit(first, b, ctx)
    d.commit(second, b, ctx)
    low = ticket(priority=0, prompt=600)  # above the shield's 512 tokens with higher-ranked prompts waiting
    assert miss(d, low, b, ctx) == "prefill_shield"
    d.started(first, b.url, 0.1)
    d.started(first, b.url, 0.2)
    d.started(ticket(priority=10), b.url, 0.2)  # never dispatched
    assert d.shield.unstarted(b.url, 0.2) == 100 and miss(d, low, b, ctx) == "prefill_shield"
    d.started(second, b.url, 0.3)
    assert d.shield.unstarted(b.url, 0.3) == 0 and miss(d, low, b, ctx) is None
