"""Honest early rejection: exact predicted start times, displacement, depth and max-wait shedding."""

from __future__ import annotations

import pytest

from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.queue import SLOQueue
from gateway.admission.settings import QueuePolicy
from gateway.admission.shedding import PrefillRate, QueueGuard
from gateway.request.errors import ApiError
from tests.admission.helpers import entry, policy, ticket

# Numbers are binary fractions so predicted times compare exactly: rate 1000 tokens/s per backend.
TIGHT = policy(queue={"classes": {"interactive": {"ttft_p99_s": 0.5, "max_queue_depth": 2}}})
NO_SHED = policy(queue={"classes": {"interactive": {"shed_by_deadline": False}}})


def _guard(initial_rate: float = 1000.0) -> QueueGuard:
    rate = PrefillRate(QueuePolicy(initial_prefill_tokens_per_s=initial_rate))
    return QueueGuard(SLOQueue(VirtualTokenCounters()), rate, "interactive")


def test_prediction_is_tokens_ahead_over_pool_rate_plus_own_prefill() -> None:
    g = _guard()
    g.admit(entry(ticket(priority=10, prompt=500), NO_SHED), now=1000.0, backends=2)
    mine = entry(ticket(priority=5, prompt=125), TIGHT)
    p = g.predict(mine, now=1000.0, backends=2)
    assert (p.ahead_tokens, p.start, p.first_token) == (500, 1000.25, 1000.375)


def test_a_replica_predicts_at_its_part_of_the_backends() -> None:
    """Replicas sharing the engines pass their part of the backends (gateway/coordination/): a third of
    two backends drains the queue at two thirds of one backend's pace."""
    g = _guard()
    g.admit(entry(ticket(priority=10, prompt=500), NO_SHED), now=1000.0, backends=2 / 3)
    p = g.predict(entry(ticket(priority=5, prompt=125), TIGHT), now=1000.0, backends=2 / 3)
    assert (p.start, p.first_token) == (pytest.approx(1000.75), pytest.approx(1000.875))


def test_unattainable_at_enqueue_is_429_with_retry_after_and_counted() -> None:
    g = _guard()
    g.admit(entry(ticket(priority=10, prompt=6000), NO_SHED), now=1000.0, backends=2)  # 3 s of prefill
    with pytest.raises(ApiError) as exc:
        g.admit(entry(ticket(priority=5, prompt=100), TIGHT), now=1000.0, backends=2)
    err = exc.value
    assert (err.status, err.code, err.retry_after) == (429, "slo_unattainable", 3.0)
    assert err.response_headers() == {"retry-after": "3", "x-omnigate-slack-ms": "400.0"}  # 0.5 - 0.1 s
    assert g.rejections == {("slo_unattainable", "interactive"): 1}
    assert len(g.queue) == 1


def test_request_that_just_fits_its_deadline_is_admitted() -> None:
    g = _guard()
    g.admit(entry(ticket(priority=10, prompt=250), NO_SHED), now=1000.0, backends=1)  # start 1000.25
    fits = entry(ticket(priority=5, prompt=250), TIGHT)  # first token 1000.5 == deadline
    g.admit(fits, now=1000.0, backends=1)
    assert fits.queued
    with pytest.raises(ApiError):
        g.admit(entry(ticket(priority=5, prompt=251), TIGHT), now=1000.0, backends=1)


def test_a_waiting_request_is_shed_only_once_late_even_if_sent_at_once() -> None:
    g = _guard()
    waiting = entry(ticket(priority=5, prompt=250), TIGHT)  # alone: first token at 1000.25
    g.admit(waiting, now=1000.0, backends=1)
    g.admit(entry(ticket(priority=10, prompt=125, arrival=1000.0), NO_SHED), now=1000.0, backends=1)
    assert g.sweep(now=1000.125, backends=1) == []  # predicted 1000.5 behind the higher band: kept
    assert g.sweep(now=1000.25, backends=1) == []  # predicted 1000.625, but sent now 1000.5: in time
    shed = g.sweep(now=1000.25 + 2**-10, backends=1)  # late even if sent now
    assert [(e, err.code) for e, err in shed] == [(waiting, "slo_unattainable")]
    assert not waiting.queued


def test_full_queue_displaces_newest_lowest_else_refuses() -> None:
    g = _guard()
    old_low = entry(ticket(priority=0), TIGHT)
    new_low = entry(ticket(priority=0), TIGHT)
    g.admit(old_low, now=1000.0, backends=4)
    g.admit(new_low, now=1000.0, backends=4)
    with pytest.raises(ApiError) as exc:
        g.admit(entry(ticket(priority=0), TIGHT), now=1000.0, backends=4)
    assert (exc.value.status, exc.value.code) == (503, "queue_full")
    high = entry(ticket(priority=10), TIGHT)
    assert g.admit(high, now=1000.0, backends=4) is new_low
    assert not new_low.queued and high.queued and old_low.queued
    assert g.rejections == {("queue_full", "interactive"): 1, ("displaced", "interactive"): 1}


def test_offline_is_never_shed_by_deadline_only_by_max_wait() -> None:
    pol = policy(
        queue={"classes": {"offline": {"ttft_p99_s": None, "max_wait_s": 60.0, "shed_by_deadline": False}}}
    )
    g = _guard()
    g.admit(entry(ticket(priority=10, cls="offline", prompt=10**9), pol), now=1000.0, backends=1)
    late = entry(ticket(priority=0, cls="offline", deadline=1000.001), pol)
    g.admit(late, now=1000.0, backends=1)
    assert g.sweep(now=1059.9, backends=1) == []
    shed = g.sweep(now=1060.0, backends=1)
    assert [err.code for _, err in shed] == ["queue_timeout", "queue_timeout"]
    assert shed[0][1].status == 503
    assert g.rejections == {("queue_timeout", "offline"): 2}


def test_prefill_rate_is_an_upper_quantile_of_recent_samples() -> None:
    rate = PrefillRate(
        QueuePolicy(
            initial_prefill_tokens_per_s=10000.0,
            prefill_rate_window=5,
            prefill_rate_quantile=0.8,
            prefill_rate_min_samples=3,
            prefill_rate_min_prompt_tokens=100,
            prefill_rate_floor_fraction=0.0,
        )
    )
    rate.observe(1000, 1.0, now=0.0)
    rate.observe(1000, 0.5, now=0.0)
    assert rate.tokens_per_s == 10000.0  # two samples: the prior still holds
    rate.observe(1000, 2.0, now=0.0)
    assert rate.tokens_per_s == 2000.0  # [500, 1000, 2000]: rank ceil(0.8 · 3) = 3
    rate.observe(1000, 0.0, now=0.0)  # no time: no information
    rate.observe(99, 1.0, now=0.0)  # under prefill_rate_min_prompt_tokens: no sample
    rate.observe(1000, 0.25, now=0.0)
    rate.observe(1000, 4.0, now=0.0)
    assert rate.tokens_per_s == 2000.0  # [250, 500, 1000, 2000, 4000]: rank 4
    rate.observe(100, 1.0, now=0.0)
    rate.observe(100, 1.0, now=0.0)  # the window of 5 drops 1000 and 2000
    assert rate.tokens_per_s == 500.0  # [100, 100, 250, 500, 4000]
    rate.configure(
        QueuePolicy(prefill_rate_window=2, prefill_rate_min_samples=1, prefill_rate_floor_fraction=0)
    )
    assert rate.tokens_per_s == 100.0  # a reload keeps the newest


def test_tiny_prompts_give_no_rate_sample() -> None:
    """The outage: TTFTs of tiny prompts measured while the gateway itself was CPU-queued (2.067 s for
    10 tokens) read as 4.8 tokens/s. They are fixed overhead, not prefill: the prior holds."""
    rate = PrefillRate(QueuePolicy())  # default: prompts under 512 tokens give no sample
    for _ in range(64):
        rate.observe(10, 2.067, now=0.0)
    rate.observe(511, 2.067, now=0.0)
    assert rate.at(0.0) == 10000.0
    for _ in range(4):
        rate.observe(512, 0.0625, now=0.0)
    assert rate.at(0.0) == 8192.0


def test_rate_never_falls_under_its_floor() -> None:
    rate = PrefillRate(QueuePolicy(initial_prefill_tokens_per_s=8000.0))  # floor 0.25 · 8000
    for _ in range(64):
        rate.observe(1000, 100.0, now=0.0)  # 10 tokens/s
    assert rate.at(0.0) == 2000.0
    rate.observe(4000, 0.5, now=0.0)  # above the floor, but one sample is not the 0.9 quantile of 64
    assert rate.at(0.0) == 2000.0


def test_samples_expire_so_the_rate_recovers() -> None:
    rate = PrefillRate(QueuePolicy(prefill_rate_max_age_s=30.0))
    for i in range(8):
        rate.observe(1024, 0.25, now=100.0 + i)  # 4096 tokens/s, at 100 … 107
    assert rate.at(129.0) == 4096.0
    assert rate.at(130.0) == 4096.0  # the sample of 100 is gone, seven left
    assert rate.at(133.5) == 4096.0  # samples of 100 … 103 gone: four left, still measured
    assert rate.at(134.0) == 10000.0  # three left, under prefill_rate_min_samples: the prior again
    rate.observe(1024, 0.5, now=134.0)
    assert rate.at(134.0) == 4096.0  # 2048 joins 4096 ×3: rank ceil(0.9 · 4) = 4


def test_a_request_late_already_when_queued_is_left_to_start_not_shed() -> None:
    """Only the head with a backend's room enters late (it starts at once whatever the rate says): a
    sweep sheds what the wait made late, not what the admission let in to try."""
    g = _guard()
    doomed = entry(ticket(priority=10, prompt=750, deadline=1000.5), TIGHT)  # 0.75 s of prefill alone
    g.queue.push(doomed)
    after = entry(ticket(priority=5, prompt=250), TIGHT)  # 0.25 s of its own: in time until 1000.25
    g.queue.push(after)
    assert g.sweep(now=1000.0, backends=1) == []
    assert [e for e, _ in g.sweep(now=1000.3, backends=1)] == [after] and doomed.queued


def test_prefill_waiting_on_its_full_bucket_delays_only_that_bucket() -> None:
    g = _guard()
    blocked = entry(ticket(bucket="multi_image", priority=10, prompt=6000), NO_SHED)  # 6 s, its bucket full
    g.admit(blocked, now=1000.0, backends=1)
    full = frozenset({"multi_image"})
    with pytest.raises(ApiError):  # counted as ahead it would start at 1006
        g.admit(entry(ticket(prompt=250), TIGHT), now=1000.0, backends=1)
    text = entry(ticket(prompt=250), TIGHT)
    g.admit(text, now=1000.0, backends=1, full=full)  # passed by: first token 1000.25
    assert text.queued
    with pytest.raises(ApiError):  # its own bucket: behind the 6 s
        g.admit(entry(ticket(bucket="multi_image", prompt=250), TIGHT), now=1000.0, backends=1, full=full)


def test_the_head_is_never_refused_by_prediction_while_a_backend_has_room() -> None:
    """At admission only the head is judged by its slot; once queued, no prediction sheds a request."""
    room: dict[str, float | None] = {"wait": 0.0}
    rate = PrefillRate(QueuePolicy(initial_prefill_tokens_per_s=1000.0, rush_slack_fraction=None))
    g = QueueGuard(
        SLOQueue(VirtualTokenCounters()), rate, "interactive", slot_wait=lambda e, now, ahead: room["wait"]
    )
    head = entry(ticket(priority=10, prompt=750, deadline=1000.5), TIGHT)  # 0.75 s of prefill alone
    g.admit(head, now=1000.0, backends=1)  # would start now: the prediction does not refuse it
    behind = entry(ticket(priority=5, prompt=250), TIGHT)  # behind head: 1 s > 0.5 s
    with pytest.raises(ApiError):
        g.admit(behind, now=1000.0, backends=1)
    room["wait"] = None  # no backend can take it now, none predictable: the prediction applies again
    with pytest.raises(ApiError):
        g.admit(entry(ticket(priority=10, prompt=750, deadline=1000.5), TIGHT), now=1000.0, backends=1)
    g.queue.push(behind)
    assert g.sweep(now=1000.0, backends=1) == [] and head.queued and behind.queued
    assert g.rejections == {("slo_unattainable", "interactive"): 2}


def test_a_head_waiting_for_a_slot_enters_while_the_slot_and_its_nominal_prefill_meet_the_deadline() -> None:
    room: dict[str, float | None] = {"wait": 0.25}
    rate = PrefillRate(QueuePolicy(initial_prefill_tokens_per_s=1000.0, prefill_rate_min_samples=1))
    rate.observe(1000, 4.0, now=1000.0)  # measured 250 tokens/s (queueing): the nominal 1000 is used
    g = QueueGuard(
        SLOQueue(VirtualTokenCounters()), rate, "interactive", slot_wait=lambda e, now, ahead: room["wait"]
    )
    head = entry(ticket(priority=10, prompt=500, deadline=1000.75))  # a client deadline tighter than 2 s
    g.admit(head, now=1000.0, backends=1)  # 1000 + 0.25 slot + 0.5 prefill = 1000.75: in time
    assert head.queued
    late = entry(ticket(priority=10, prompt=500, deadline=1000.75))
    with pytest.raises(ApiError) as refused:  # a wait of 0.3 s is late already at enqueue
        room["wait"] = 0.3
        g.admit(late, now=1000.0, backends=1)
    assert refused.value.code == "slo_unattainable"
    assert g.rejections == {("slo_unattainable", "interactive"): 1}


def test_past_the_head_the_slots_the_requests_ahead_take_are_predicted_too() -> None:
    per_release = {"s": 0.5}  # the pool frees a slot every 0.5 s and none is free
    rate = PrefillRate(QueuePolicy(initial_prefill_tokens_per_s=100_000.0))  # prefill is never the wait
    asked: list[int] = []

    def slot_wait(e: object, now: float, ahead: int) -> float | None:
        asked.append(ahead)
        return None if per_release["s"] is None else (ahead + 1) * per_release["s"]

    g = QueueGuard(SLOQueue(VirtualTokenCounters()), rate, "interactive", slot_wait=slot_wait)
    first, second = (entry(ticket(prompt=100, deadline=1001.2)) for _ in range(2))
    for e in (first, second):
        g.admit(e, now=1000.0, backends=1)  # 0.5 s and 1.0 s for a slot, ~0 for prefill: both in time
    third = entry(ticket(prompt=100, deadline=1001.2))
    with pytest.raises(ApiError) as refused:  # two ahead: its slot frees at 1.5 s, past its deadline
        g.admit(third, now=1000.0, backends=1)
    assert refused.value.code == "slo_unattainable" and asked == [0, 1, 2]
    per_release["s"] = None  # no turnover to predict from: past the head only the prefill prediction speaks
    g.admit(third, now=1000.0, backends=1)
    assert [e for e in g.queue.ordered()] == [first, second, third]


def test_a_deadline_refusal_is_the_servers_503_once_the_pool_has_lost_capacity() -> None:
    """Issue #18: a refusal caused by lost backends is no client's excess — 503 with Retry-After, never a
    429 — and either names the predicted slot against the deadline and the SLO."""
    rate = PrefillRate(QueuePolicy(initial_prefill_tokens_per_s=100_000.0))  # prefill is never the wait
    lost: dict[str, str | None] = {"now": None}
    g = QueueGuard(
        SLOQueue(VirtualTokenCounters()),
        rate,
        "interactive",
        slot_wait=lambda e, now, ahead: (ahead + 1) * 0.5,  # a slot every 0.5 s, none free
        capacity_lost=lambda: lost["now"],
    )
    for _ in range(2):
        g.admit(entry(ticket(prompt=100, deadline=1001.2)), now=1000.0, backends=2)
    with pytest.raises(ApiError) as whole:  # two ahead: its slot frees in 1.5 s, past its deadline
        g.admit(entry(ticket(prompt=100, deadline=1001.2)), now=1000.0, backends=2)
    err = whole.value
    assert (err.status, err.code, err.retry_after) == (429, "slo_unattainable", 1.5)
    assert err.message == (
        "Cannot meet the interactive deadline: a slot free in 1.500s, first token predicted in 1.501s; "
        "the deadline is in 1.200s (SLO 2s)."
    )
    lost["now"] = "1 of 2 backends of pool interactive unavailable"
    with pytest.raises(ApiError) as server:
        g.admit(entry(ticket(prompt=100, deadline=1001.2)), now=1000.0, backends=1)
    err = server.value
    assert (err.status, err.code, err.type) == (503, "capacity_unavailable", "service_unavailable")
    assert err.response_headers() == {"retry-after": "2", "x-omnigate-slack-ms": "1199.0"}  # 1.2 - 0.001 s
    assert err.message == (
        "Capacity lost (1 of 2 backends of pool interactive unavailable), the interactive deadline cannot "
        "be met: a slot free in 1.500s, first token predicted in 1.501s; the deadline is in 1.200s (SLO 2s)."
    )
    assert g.rejections == {
        ("slo_unattainable", "interactive"): 1,
        ("capacity_unavailable", "interactive"): 1,
    }


def test_admitted_work_queued_again_outwaits_its_max_wait_only_while_a_backend_is_available() -> None:
    g = _guard()
    again = entry(ticket(prompt=100), TIGHT)
    again.requeued = True  # its backend failed before the first byte: it was admitted already
    g.admit(again, now=1000.0, backends=1)
    assert g.sweep(now=1100.0, backends=1) == []  # past its max wait and its deadline: it keeps its place
    shed = g.sweep(now=1100.0, backends=0)  # nothing left to wait for
    assert [(e, err.status, err.code) for e, err in shed] == [(again, 503, "queue_timeout")]


def test_an_admitted_request_keeps_the_first_token_it_was_judged_by() -> None:
    """The queue's prediction for one behind others, the later slot for a head waiting on one, and none
    for a class that does not shed by deadline (bench/family.py checks them against the actual TTFT)."""
    room: dict[str, float | None] = {"wait": None}
    rate = PrefillRate(QueuePolicy(initial_prefill_tokens_per_s=1000.0))
    g = QueueGuard(
        SLOQueue(VirtualTokenCounters()), rate, "interactive", slot_wait=lambda e, now, ahead: room["wait"]
    )
    offline = entry(ticket(priority=10, prompt=250), NO_SHED)
    g.admit(offline, now=1000.0, backends=1)
    assert offline.ticket.predicted_first_token is None
    behind = entry(ticket(priority=5, prompt=125))  # 250 ahead, then its own 125, at 1000 tokens/s
    g.admit(behind, now=1000.0, backends=1)
    assert behind.ticket.predicted_first_token == 1000.375
    g.queue.remove(offline)
    g.queue.remove(behind)
    room["wait"] = 0.5  # the head waits half a second for a slot, then prefills at the nominal rate
    head = entry(ticket(priority=5, prompt=250))
    g.admit(head, now=1000.0, backends=1)
    assert head.ticket.predicted_first_token == 1000.75
