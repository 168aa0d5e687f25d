"""Queue discipline: strict bands, VTC between tenants, EDF (adaptive LIFO) within a tenant; prefill-ahead
accounting."""

from __future__ import annotations

from gateway.admission.fairness import VirtualTokenCounters, token_charge
from gateway.admission.queue import SLOQueue
from tests.admission.helpers import entry, policy, ticket


def _queue() -> SLOQueue:
    return SLOQueue(VirtualTokenCounters())


def test_bands_then_counters_then_deadlines() -> None:
    q = _queue()
    low = entry(ticket(tenant="a", priority=0))
    a_late = entry(ticket(tenant="a", priority=5, deadline=1003.0))
    a_early = entry(ticket(tenant="a", priority=5, deadline=1001.0))
    b_first = entry(ticket(tenant="b", priority=5, deadline=1009.0))
    high = entry(ticket(tenant="b", priority=10))
    for e in (low, a_late, a_early, b_first, high):
        q.push(e)
    q.counters.charge("a", 50.0)  # a has had more service than b → b's band-5 work goes first
    assert list(q.ordered()) == [high, b_first, a_early, a_late, low]
    assert q.depth_by_band() == {0: 1, 5: 3, 10: 1}
    assert len(q) == 5


def test_deadline_ties_keep_arrival_order_and_remove_is_exact() -> None:
    q = _queue()
    first, second, third = (entry(ticket(deadline=1005.0)) for _ in range(3))
    for e in (first, second, third):
        q.push(e)
    assert q.remove(second) is True
    assert q.remove(second) is False
    assert list(q.ordered()) == [first, third]
    assert q.prefill_tokens() == 200


def test_class_deadline_is_arrival_plus_ttft_unless_client_is_tighter() -> None:
    assert entry(ticket(arrival=1000.0)).deadline == 1002.0  # default interactive TTFT P99 2 s
    assert entry(ticket(arrival=1000.0, deadline=1000.5)).deadline == 1000.5
    assert entry(ticket(arrival=1000.0, cls="offline")).deadline == 4600.0  # completion deadline 3600 s


def test_prefill_ahead_counts_higher_bands_own_earlier_deadlines_and_vtc_earlier_tenants() -> None:
    q = _queue()
    q.push(entry(ticket(priority=10, prompt=1000, tenant="x")))
    q.push(entry(ticket(priority=5, prompt=300, tenant="a", deadline=1001.0)))
    q.push(entry(ticket(priority=5, prompt=700, tenant="b", deadline=1000.5)))
    q.push(entry(ticket(priority=0, prompt=5000, tenant="a")))  # lower band: never ahead
    mine = entry(ticket(priority=5, prompt=50, tenant="a", deadline=1001.5))
    q.push(mine)
    # band 10: x. Band 5 by VTC (charge = prompt): a·300 (tie a < b), b·700 (0 < 300), then mine (300 < 700)
    assert q.prefill_ahead(mine) == 1000 + 300 + 700


def test_prediction_counts_only_the_vtc_share_of_a_heavy_tenant_backlog() -> None:
    q = _queue()
    q.counters.charge("heavy", 150.0)
    heavy = [entry(ticket(tenant="heavy", prompt=100)) for _ in range(4)]
    for e in heavy:
        q.push(e)
    for _ in range(5):
        q.push(entry(ticket(tenant="flood", priority=0, prompt=10_000)))  # lower band: never ahead
    light = entry(ticket(tenant="light", prompt=100))
    # light is lifted to 150: heavy's first (150 → 250) goes first on the name tie, then light (150 < 250)
    assert q.prefill_ahead(light) == 100
    q.push(light)
    assert [(e.tenant, q.prefill_ahead(e)) for e in q.projected()][:3] == [
        ("heavy", 0),
        ("light", 100),
        ("heavy", 200),
    ]
    assert q.prefill_ahead(heavy[3]) == 400


def test_a_request_of_a_full_bucket_is_ahead_only_of_its_own_bucket() -> None:
    """The dispatcher passes a request whose bucket is at its cap everywhere; the projection does too."""
    q = _queue()
    first = entry(ticket(bucket="multi_image", prompt=3000, deadline=1001.0))
    text = entry(ticket(bucket="text", prompt=100, deadline=1001.2))
    second = entry(ticket(bucket="multi_image", prompt=2000, deadline=1001.4))
    for e in (first, text, second):
        q.push(e)
    late = entry(ticket(bucket="single_image", prompt=50, deadline=1001.6))
    full = frozenset({"multi_image"})
    assert q.ahead_of(late) == (3, 5100)
    assert q.ahead_of(late, full) == (1, 100)
    assert q.ahead_of(second, full) == (2, 3100)  # its own bucket's earlier request still goes first
    assert q.ahead_of(text, full) == (0, 0)


def test_zero_token_entries_do_not_break_band_accounting() -> None:
    q = _queue()
    empty, full = entry(ticket(prompt=0)), entry(ticket(prompt=100))
    q.push(empty)
    q.push(full)
    assert q.remove(full) and q.remove(empty)
    assert (len(q), q.prefill_tokens(), q.depth_by_band()) == (0, 0, {})


def test_vtc_lifts_a_returning_tenant_to_the_backlogged_minimum() -> None:
    q = _queue()
    q.counters.charge("busy", 500.0)
    q.counters.charge("other", 800.0)
    q.push(entry(ticket(tenant="busy")))
    q.push(entry(ticket(tenant="other")))
    idle = entry(ticket(tenant="idle"))
    q.push(idle)  # idle's counter 0 would bank credit; it is lifted to min(500, 800)
    assert q.counters.counter("idle") == 500.0
    assert q.counters.counter("other") == 800.0  # already above the floor: unchanged


def test_vtc_lifts_to_last_served_when_nobody_is_backlogged() -> None:
    c = VirtualTokenCounters()
    c.charge("a", 300.0)
    c.served("a")
    c.on_backlogged("b", [])
    assert c.counter("b") == 300.0


def test_token_charge_weights_input_output_and_tenant_weight() -> None:
    assert token_charge(100, 50, weight=2.0, wp=1.0, wq=2.0) == 100.0


def test_displacement_victim_is_newest_of_lowest_band_same_class() -> None:
    q = _queue()
    old_low = entry(ticket(priority=0))
    new_low = entry(ticket(priority=0))
    mid = entry(ticket(priority=5))
    offline_low = entry(ticket(priority=-1, cls="offline"))
    for e in (old_low, new_low, mid, offline_low):
        q.push(e)
    assert q.newest_of_lowest_band("interactive", below=10) is new_low
    assert q.newest_of_lowest_band("interactive", below=0) is None
    assert q.class_depth("interactive") == 3


def test_adaptive_lifo_serves_a_tenant_backlogged_without_a_break_newest_first() -> None:
    q = _queue()
    q.lifo_after_fraction = 0.25  # of the 2 s TTFT budget: a standing queue after 0.5 s
    olds = [entry(ticket(tenant="a", arrival=1000.0 + i / 10)) for i in range(3)]
    other = entry(ticket(tenant="b", arrival=1000.0))
    for e in (*olds, other):
        q.push(e)
    q.now = 1000.5  # a's queue has stood exactly 0.5 s: not past the threshold
    assert [e for e in q.ordered()] == [*olds, other]
    q.now = 1000.6
    assert [e for e in q.ordered()] == [*olds[::-1], other]  # b has one request: no order to change
    # the projection replays VTC: a's newest, then b (its counter now lower), then a's older two
    assert q.prefill_ahead(olds[2]) == 0 and q.prefill_ahead(other) == 100 and q.prefill_ahead(olds[0]) == 300
    q.remove(olds[0])  # the oldest went: a's queue still has not emptied since 1000.0
    assert [e for e in q.ordered()] == [olds[2], olds[1], other]
    for e in (olds[1], olds[2]):
        q.remove(e)  # a's queue drains: the clock of its standing queue restarts
    late = [entry(ticket(tenant="a", arrival=1000.6 + i / 10)) for i in range(2)]
    for e in late:
        q.push(e)
    assert [e for e in q.ordered()] == [*late, other]
    q.lifo_after_fraction = None
    q.now = 1010.0
    assert [e for e in q.ordered()] == [*late, other]


def test_adaptive_lifo_leaves_classes_that_do_not_shed_by_deadline_in_edf_order() -> None:
    q = _queue()
    q.lifo_after_fraction = 0.25
    offline = [entry(ticket(tenant="a", cls="offline", arrival=1000.0 + i)) for i in range(3)]
    for e in offline:
        q.push(e)
    q.now = 1000.0 + 3600  # far past a quarter of the completion deadline
    assert [e for e in q.ordered()] == offline


def test_a_request_never_shed_does_not_turn_a_congested_tenant_back_to_edf() -> None:
    """A class that is never shed by deadline (here one with the interactive budget) among a tenant's
    interactive requests: the most urgent of them, yet the others stay newest first, and it goes last."""
    interactive = {"ttft_p99_s": 2.0, "pool": "interactive"}
    pol = policy(
        queue={"classes": {"interactive": interactive, "kept": {**interactive, "shed_by_deadline": False}}}
    )
    q = _queue()
    q.lifo_after_fraction = 0.25
    kept = entry(ticket(tenant="a", cls="kept", arrival=1000.0), pol)
    shed = [entry(ticket(tenant="a", arrival=1000.1 + i / 10), pol) for i in range(2)]
    for e in (kept, *shed):
        q.push(e)
    q.now = 1000.6
    assert [e for e in q.ordered()] == [shed[1], shed[0], kept]
