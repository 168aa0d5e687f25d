"""Engine model on the virtual clock: exact schedules from a cost model with round numbers."""

from __future__ import annotations

import pytest

from loadtest.sim.engine import (
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


def test_priority_policy_admits_larger_priority_first_and_fcfs_keeps_order() -> None:
    for policy, expected in (("priority", "high"), ("fcfs", "low")):
        e = make(max_running_requests=1, schedule_policy=policy)
        e.submit(req("low", priority=0))
        e.submit(req("mid", priority=1))
        e.submit(req("high", priority=5))
        r = e.step()
        assert r is not None and [x.rid for x in r.emitted] == [expected]


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
