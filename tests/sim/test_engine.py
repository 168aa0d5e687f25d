"""Engine model on the virtual clock: exact schedules from a cost model with round numbers."""

from __future__ import annotations

import pytest

from loadtest.sim.engine import (
    EVICTED_MESSAGE,
    INIT_NEW_TOKEN_RATIO,
    QUEUE_FULL_MESSAGE,
    Engine,
    EngineConfig,
    EngineError,
    SimRequest,
)
from loadtest.sim.profile import CostModel

# prefill = 10 ms + 1 ms/token; decode = 10 ms flat: every step time below is exact arithmetic
COSTS = CostModel(
    prefill_base_s=0.010,
    prefill_per_token_s=0.001,
    prefill_attention_per_token2_s=0.0,
    encoder_per_token_s=0.0,
    decode_base_s=0.010,
    decode_per_seq_s=0.0,
    decode_per_kv_token_s=0.0,
)


def make(**kw: object) -> Engine:
    cfg: dict[str, object] = {
        "max_total_tokens": 10_000,
        "max_running_requests": 8,
        "chunked_prefill_size": 8192,
    }
    cfg.update(kw)
    return Engine(EngineConfig(**cfg), COSTS)  # type: ignore[arg-type]


def req(rid: str, prompt: int = 100, max_new: int = 10, out: int | None = None, **kw: object) -> SimRequest:
    return SimRequest(rid, prompt, max_new, out if out is not None else max_new, **kw)  # type: ignore[arg-type]


def test_prefill_runs_before_decode_and_decode_waits_for_it() -> None:
    e = make()
    a = req("a", prompt=100)
    e.submit(a)
    first = e.step()
    assert first is not None and first.kind == "prefill"
    assert first.end == pytest.approx(0.110)  # 10 ms + 100 × 1 ms
    assert a.token_times == [pytest.approx(0.110)] and a.kv == 100
    e.step()  # one decode step
    assert a.generated == 2
    b = req("b", prompt=200)
    e.submit(b)
    stall = e.step()
    assert stall is not None and stall.kind == "prefill"
    assert stall.end - stall.start == pytest.approx(0.210)
    assert stall.emitted == [b] and a.generated == 2  # a got nothing while b's prefill ran
    nxt = e.step()
    assert nxt is not None and nxt.kind == "decode" and set(nxt.emitted) == {a, b}
    # a's gap between tokens 2 and 3 is the prefill plus one decode step
    assert a.token_times[2] - a.token_times[1] == pytest.approx(0.220)


def test_long_prompt_is_chunked_and_emits_only_after_last_chunk() -> None:
    e = make(max_total_tokens=50_000, chunked_prefill_size=4000)
    a = req("a", prompt=9000)
    e.submit(a)
    kinds = []
    for _ in range(3):
        r = e.step()
        assert r is not None
        kinds.append((r.kind, r.prefill_tokens, len(r.emitted)))
    assert kinds == [("prefill", 4000, 0), ("prefill", 4000, 0), ("prefill", 1000, 1)]
    assert e.chunked is None and e.running == [a] and a.kv == 9000


def test_kv_reservation_refuses_admission_until_space_is_free() -> None:
    # a needs 100 + 500 (full clipped budget) of 1000; b then needs 600 but only 400 remain
    e = make(max_total_tokens=1000)
    a = req("a", prompt=100, max_new=500, out=3)
    b = req("b", prompt=100, max_new=500, out=3)
    e.submit(a)
    e.submit(b)
    first = e.step()
    assert first is not None and first.emitted == [a] and e.waiting == [b]
    # while a runs, its remaining budget × new_token_ratio (0.7) stays reserved: 900 − 349.3 < 600
    assert e.new_token_ratio == pytest.approx(INIT_NEW_TOKEN_RATIO)
    while a.finished_at is None:
        r = e.step()
        assert r is not None and r.kind == "decode" and b in e.waiting
    e.step()
    assert b.admitted_at == pytest.approx(a.finished_at)


def test_retraction_happens_at_the_predicted_decode_step() -> None:
    # ratio 0.007 lets b in although both will outgrow the pool: 2 × 50 prompt + 2 tokens per decode step
    e = make(max_total_tokens=200, schedule_conservativeness=0.01)
    a = req("a", prompt=50, max_new=90)
    b = req("b", prompt=50, max_new=90)
    e.submit(a)
    e.submit(b)
    steps = [e.step(), e.step()]
    assert [s.emitted for s in steps if s] == [[a], [b]]
    # before decode step j, used = 100 + 2(j − 1); it needs 2 free slots, so j = 51 cannot run
    for j in range(1, 51):
        r = e.step()
        assert r is not None and r.kind == "decode" and not r.retracted, j
    assert e.used_tokens == 200
    r = e.step()
    assert r is not None and r.retracted == [b]  # tie on output length and prompt: the later one goes
    assert b.kv == 0 and b.generated == 51 and b in e.waiting and e.total_retracted == 1
    assert e.used_tokens == a.kv == 101 and a.generated == 52
    # the ratio is re-estimated from the batch's progress: (51 decoded + 20 steps × 1) / (90 + 1)
    assert e.new_token_ratio == pytest.approx(71 / 91)
    assert e.num_retracted_waiting() == 1


def test_oom_crash_mode_fails_everything_and_refuses_until_restart() -> None:
    e = make(max_total_tokens=200, schedule_conservativeness=0.01, oom_mode="crash", restart_s=5.0)
    a, b = req("a", prompt=50, max_new=90), req("b", prompt=50, max_new=90)
    e.submit(a)
    e.submit(b)
    results = [e.step() for _ in range(53)]
    crash = results[-1]
    assert crash is not None and crash.kind == "crash" and set(crash.failed) == {a, b}
    assert a.error is not None and a.error.status == 500 and e.used_tokens == 0
    with pytest.raises(EngineError) as exc:
        e.submit(req("c"))
    assert exc.value.status == 503
    e.advance_to(crash.end + 5.0)
    e.submit(req("c"))  # accepted again after restart_s
    assert e.total_crashes == 1


def _first_admitted(**kw: object) -> list[str]:
    """Submit four requests to a one-slot engine; the order they are admitted in, one step each."""
    e = make(max_running_requests=1, **kw)
    for rid, priority, max_new in (("none", None, 4), ("low", 0, 8), ("mid", 1, 2), ("high", 5, 6)):
        e.submit(req(rid, max_new=max_new, out=1, priority=priority))
    order = []
    while e.has_work():
        r = e.step()
        assert r is not None
        order += [x.rid for x in r.emitted]
    return order


def test_priority_scheduling_orders_the_queue_as_sglang_and_is_off_by_default() -> None:
    assert _first_admitted() == ["none", "low", "mid", "high"]  # fcfs: priorities are ignored
    # larger first; a request without a priority gets -sys.maxsize - 1 (SGLang's default: last)
    assert _first_admitted(enable_priority_scheduling=True) == ["high", "mid", "low", "none"]
    flipped = {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True}
    assert _first_admitted(**flipped) == ["low", "mid", "high", "none"]  # None → sys.maxsize: last again
    # lof: longest max_new_tokens first, under priority when it is on
    assert _first_admitted(schedule_policy="lof") == ["low", "high", "none", "mid"]
    assert _first_admitted(schedule_policy="lof", enable_priority_scheduling=True) == [
        "high", "mid", "low", "none",
    ]  # fmt: skip


def test_schedule_policies_sglang_refuses_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match=r"^Unknown schedule_policy: policy='priority'$"):
        EngineConfig(max_total_tokens=100, max_running_requests=1, schedule_policy="priority")
    with pytest.raises(ValueError, match=r"must be 'fcfs' or 'lof'\. 'lpm' is not supported"):
        EngineConfig(
            max_total_tokens=100,
            max_running_requests=1,
            schedule_policy="lpm",
            enable_priority_scheduling=True,
        )
    with pytest.raises(ValueError, match="not modelled by the simulator"):
        EngineConfig(max_total_tokens=100, max_running_requests=1, schedule_policy="random")


def _two_running(pool: int, prompt: int, **kw: object) -> tuple[Engine, SimRequest, SimRequest]:
    """Two priority-0 requests prefilled together into a two-slot engine (one token each, KV = prompt)."""
    e = make(max_total_tokens=pool, max_running_requests=2, enable_priority_scheduling=True, **kw)
    a, b = req("a", prompt=prompt, max_new=200, priority=0), req("b", prompt=prompt, max_new=200, priority=0)
    e.submit(a)
    e.submit(b)
    first = e.step()
    assert first is not None and first.emitted == [a, b] and e.used_tokens == 2 * prompt
    return e, a, b


def test_preempt_to_schedule_evicts_the_newest_lowest_running_request_for_a_slot() -> None:
    e, a, b = _two_running(pool=1000, prompt=100)
    h = req("h", prompt=300, max_new=200, priority=20)
    e.submit(h)
    r = e.step()
    # no slot: a and b differ from h by 20 > 10; b entered the queue last, so it goes; one is enough,
    # since 300 + 200 − (800 − 2 × 199 × 0.7) < 0 — and h is prefilled in the same step
    assert r is not None and r.kind == "prefill" and r.preempted == [b] and r.emitted == [h]
    assert r.end - r.start == pytest.approx(0.010 + 0.300)
    assert e.running == [a, h] and e.waiting == [b] and e.total_preempted == 1
    assert (b.kv, b.preemptions, b.generated, b.retractions) == (0, 1, 1, 0)  # recomputed later
    assert e.used_tokens == 100 + 300


def test_preemption_needs_a_priority_gap_over_the_threshold() -> None:
    e, _, _ = _two_running(pool=1000, prompt=100)
    e.submit(req("h", prompt=300, max_new=200, priority=10))  # 10 − 0 is not > 10
    r = e.step()
    assert r is not None and r.kind == "decode" and not r.preempted and e.total_preempted == 0
    e2, _, _ = _two_running(pool=1000, prompt=100, priority_scheduling_preemption_threshold=9)
    e2.submit(req("h", prompt=300, max_new=200, priority=10))
    r = e2.step()
    assert r is not None and r.preempted and [x.rid for x in r.emitted] == ["h"]
    # with smaller values first, the gap is measured the other way: 20 is not preferred to 0
    e3, _, _ = _two_running(pool=1000, prompt=100, schedule_low_priority_values_first=True)
    e3.submit(req("h", prompt=300, max_new=200, priority=20))
    r = e3.step()
    assert r is not None and r.kind == "decode" and not r.preempted


def test_preemption_counts_reserved_output_budgets_not_the_kv_it_would_free() -> None:
    # need = 300 + 200 − (600 − 278.6) = 178.6: b's reservation (139.3) is not enough, b and a are
    e, a, b = _two_running(pool=1000, prompt=200)
    h = req("h", prompt=300, max_new=200, priority=20)
    e.submit(h)
    r = e.step()
    assert r is not None and r.preempted == [b, a] and r.emitted == [h] and e.waiting == [b, a]
    # need = 400 + 200 − (1100 − 600 − 278.6) = 378.6 > both reservations: SGLang refuses, though
    # freeing a and b's 600 cached tokens would make room; h waits and decode goes on
    e, a, b = _two_running(pool=1100, prompt=300)
    e.submit(req("h", prompt=400, max_new=200, priority=20))
    r = e.step()
    assert r is not None and r.kind == "decode" and not r.preempted and e.running == [a, b]


def test_full_queue_evicts_its_least_preferred_request_for_a_strictly_better_one() -> None:
    e = make(max_running_requests=1, max_queued_requests=2, enable_priority_scheduling=True)
    p1, p5 = req("p1", priority=1), req("p5", priority=5)
    assert e.submit(p1) is None and e.submit(p5) is None
    p3 = req("p3", priority=3)
    evicted = e.submit(p3)
    assert evicted is p1 and e.waiting == [p5, p3] and p1.finish_reason == "abort"
    assert p1.error is not None and (p1.error.status, p1.error.message) == (503, EVICTED_MESSAGE)
    with pytest.raises(EngineError) as exc:
        e.submit(req("p3-again", priority=3))  # only strictly better evicts
    assert (exc.value.status, exc.value.message) == (503, QUEUE_FULL_MESSAGE)
    assert e.total_aborted == 1


def test_queue_full_is_refused_with_sglang_503() -> None:
    e = make(max_queued_requests=2)
    e.submit(req("a"))
    e.submit(req("b"))
    with pytest.raises(EngineError) as exc:
        e.submit(req("c"))
    assert (exc.value.status, exc.value.message) == (503, QUEUE_FULL_MESSAGE)


def test_abort_frees_kv_wherever_the_request_is() -> None:
    e = make(max_running_requests=1)
    a, b = req("a", prompt=300), req("b", prompt=100)
    e.submit(a)
    e.submit(b)
    e.step()
    assert e.used_tokens == 300
    assert e.abort("a") is a and e.used_tokens == 0 and a.finish_reason == "abort"
    assert e.abort("b") is b and e.waiting == [] and e.total_aborted == 2
    assert e.abort("nope") is None


def test_output_stops_at_natural_length_or_max_tokens() -> None:
    e = make()
    short, capped = req("s", max_new=10, out=4), req("c", max_new=5, out=50)
    e.submit(short)
    e.submit(capped)
    while e.has_work():
        e.step()
    assert (short.generated, short.finish_reason) == (4, "stop")
    assert (capped.generated, capped.finish_reason) == (5, "length")
    assert e.used_tokens == 0


def test_future_arrivals_wait_for_their_time() -> None:
    e = make()
    e.submit(req("a", arrival=1.0))
    assert e.step() is None and e.next_event_time() == 1.0
    e.advance_to(1.0)
    r = e.step()
    assert r is not None and r.start == 1.0
