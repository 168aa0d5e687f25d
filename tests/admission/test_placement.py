"""Placement among the backends a request fits on (placement.py), and the prefill budgets that count a
prompt less the prefix its backend is expected to hold cached (dispatch.py)."""

from __future__ import annotations

import math

from gateway.admission.dispatch import Dispatcher
from gateway.admission.placement import Placement
from gateway.admission.settings import PlacementPolicy, PoolBudgets
from gateway.backends.state import BackendState
from gateway.request.ticket import PrefixKey, Ticket
from tests.admission.helpers import backends, decision, miss, ticket

CONVERSATION = PrefixKey((b"sys", b"turn1", b"turn2"), (200, 1800, 2000), session=b"conv-1")


def _prompt(key: PrefixKey = CONVERSATION, session: bytes | None = b"conv-1") -> Ticket:
    t = ticket(prompt=key.tokens)
    t.prefix = PrefixKey(key.keys, key.ends, session)
    return t


def _warm(b: BackendState, key: PrefixKey = CONVERSATION, upto: int = 2) -> None:
    b.prefix.sent(PrefixKey(key.keys[:upto], key.ends[:upto]), 0, None)


def _choose(
    pool: list[BackendState], t: Ticket, unstarted: dict[str, int] | None = None, **policy: object
) -> BackendState:
    rule, waiting = PlacementPolicy.model_validate(policy), unstarted or {}
    return Placement().choose(t, pool, rule, lambda url: waiting.get(url, 0))


def test_first_token_goes_where_the_prefix_is_cached_unless_the_queue_there_outweighs_it() -> None:
    pool = backends(3)
    pool[0].outstanding_tokens = 5000  # busier by the old rule
    _warm(pool[0])  # 1800 of the 2000 tokens cached there
    assert _choose(pool, _prompt()) is pool[0]
    assert _choose(pool, _prompt(), {"http://b0": 1700}) is pool[0]  # 1700 + 200 < 2000
    assert _choose(pool, _prompt(), {"http://b0": 1900}) is pool[1]  # 1900 + 200 > 2000: cold and idle wins
    assert _choose(pool, _prompt(), policy="least_tokens") is pool[1]


def test_nothing_cached_anywhere_is_the_least_outstanding_tokens() -> None:
    pool = backends(3)
    pool[0].outstanding_tokens, pool[1].outstanding_tokens, pool[2].outstanding_tokens = 30, 10, 20
    assert _choose(pool, _prompt()) is pool[1]
    assert _choose(pool, _prompt(), {"http://b1": 1}) is pool[2]  # a prefill waits there


def test_cache_aware_takes_the_longest_match_over_its_threshold_unless_loads_are_imbalanced() -> None:
    pool = backends(2)
    _warm(pool[1])
    pool[1].active, pool[0].active = 5, 0
    assert _choose(pool, _prompt(), policy="cache_aware") is pool[1]  # 0.9 of the prompt > 0.3
    assert _choose(pool, _prompt(), policy="cache_aware", cache_threshold=0.95) is pool[0]  # least loaded
    pool[1].active = 70  # 70 − 0 > 64 and 70 > 1.5 × 0
    assert _choose(pool, _prompt(), policy="cache_aware") is pool[0]


def test_sticky_sessions_go_back_where_they_went_while_it_fits() -> None:
    placement, pool = Placement(), backends(3)
    sticky = PlacementPolicy(sticky=True, policy="least_tokens")
    t = _prompt()
    placement.placed(t, pool[2])
    assert placement.choose(t, pool, sticky, lambda url: 0) is pool[2]
    assert placement.choose(t, pool[:2], sticky, lambda url: 0) is pool[0]  # not fitting there: the rule
    assert placement.choose(t, pool, PlacementPolicy(policy="least_tokens"), lambda url: 0) is pool[0]
    other = _prompt(session=b"conv-2")
    assert placement.choose(other, pool, sticky, lambda url: 0) is pool[0]


def test_budgets_count_the_prompt_less_the_prefix_cached_on_that_backend() -> None:
    d, pool = Dispatcher(), backends(2)
    _warm(pool[0])
    ctx = decision(PoolBudgets(prefill_tokens_per_round=1000), prefill_rate=1000.0)
    d.open_round(0.0)
    d.commit(ticket(prompt=700), pool[0], ctx)
    d.commit(ticket(prompt=700), pool[1], ctx)
    t = _prompt()
    assert miss(d, t, pool[0], ctx) is None  # 700 + its 200 uncached fit the round's 1000
    assert miss(d, t, pool[1], ctx) is not None  # 700 + 2000 do not
    d.commit(t, pool[0], ctx)
    assert t.cost.cached_tokens == 1800 and t.cost.prefill_tokens == 200
    assert d.shield.unstarted("http://b0", 0.0) == 700 + 200
    assert d.rounds.released("http://b0") == 900
    assert pool[0].prefix.stats.hits == 1 and pool[0].prefix.match(CONVERSATION) == 2000


def test_the_index_budget_follows_the_backends_kv_pool_or_the_policy() -> None:
    d, pool = Dispatcher(), backends(1, max_total_tokens=4096)
    d.open_round(0.0)
    d.commit(_prompt(), pool[0], decision(PoolBudgets(), prefill_rate=math.inf))
    assert pool[0].prefix.capacity_tokens == 4096
    d.commit(_prompt(), pool[0], decision(PoolBudgets(placement={"index_tokens": 500})))
    assert pool[0].prefix.capacity_tokens == 500 and pool[0].prefix.tokens <= 500
