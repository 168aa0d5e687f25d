"""Adaptive concurrency limits: exact decisions of Fixed, AIMD and Gradient2 on given samples."""

from __future__ import annotations

import math
import random

import anyio
import pytest

from gateway.admission.limits import (
    AIMDLimit,
    FixedLimit,
    GradientLimit,
    Sample,
    TargetLimit,
    latency_ratio,
    make_limit,
)
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.settings import ControllerPolicy, SLOClass
from gateway.http.pipeline import engine_latencies
from gateway.request.ticket import Relayed, Usage
from tests.admission.helpers import FakeClock, backends, policy, ticket


def _policy(algorithm: str, **kw: float) -> ControllerPolicy:
    base: dict[str, float] = {"initial": 16, "min": 4, "max": 64}
    base.update(kw)
    return ControllerPolicy.model_validate({"algorithm": algorithm, **base})


def test_fixed_never_moves() -> None:
    lim = make_limit(_policy("fixed"), start=40)
    assert isinstance(lim, FixedLimit)
    lim.update(Sample(0.0, in_flight=16, latency_ratio=5.0, dropped=True))
    assert lim.limit == 16


def test_aimd_adds_when_used_and_good_backs_off_on_drop_once_per_cooldown() -> None:
    lim = AIMDLimit(_policy("aimd", backoff=0.5, increase=1.0, cooldown_s=1.0))
    lim.update(Sample(0.0, in_flight=7, latency_ratio=0.5))  # app-limited: 7 < 16 / 2
    assert lim.limit == 16
    lim.update(Sample(0.0, in_flight=8, latency_ratio=0.5))
    assert lim.limit == 17
    lim.update(Sample(1.0, in_flight=17, dropped=True))
    assert lim.limit == 8  # 17 · 0.5 = 8.5
    lim.update(Sample(1.5, in_flight=8, latency_ratio=1.2))  # SLO miss inside the cooldown: ignored
    assert lim.limit == 8
    lim.update(Sample(2.0, in_flight=8, latency_ratio=1.2))
    assert lim.limit == 4  # 4.25
    lim.update(Sample(3.0, in_flight=8, latency_ratio=1.2))
    assert lim.limit == 4  # floor at min


def test_gradient_grows_below_setpoint_and_shrinks_above() -> None:
    p = _policy("gradient", smoothing=0.5, setpoint=0.5, tolerance=2.0, long_alpha=0.5, cooldown_s=0.0)
    lim = GradientLimit(p)
    lim.update(Sample(0.0, in_flight=16, latency_ratio=0.25))
    # grad = clamp(min(2 · 0.25, 0.5) / 0.25) = 1 → new = 16 + 4; 16·0.5 + 20·0.5 = 18
    assert lim.limit == 18
    lim.update(Sample(1.0, in_flight=18, latency_ratio=1.0))
    # long = 0.625; grad = min(1.25, 0.5) / 1.0 = 0.5; new = 9 + sqrt(18); value = 9 + (9 + 4.243) / 2
    assert lim.value == pytest.approx(18 * 0.5 + (18 * 0.5 + math.sqrt(18)) * 0.5)
    assert lim.limit == 15


def test_gradient_is_app_limited_and_respects_cooldown_and_drops() -> None:
    p = _policy("gradient", smoothing=1.0, cooldown_s=5.0)
    lim = GradientLimit(p)
    lim.update(Sample(0.0, in_flight=7, latency_ratio=0.1))  # under half the limit in use: no growth
    assert lim.limit == 16
    lim.update(Sample(0.0, in_flight=16, dropped=True))  # grad 0.5: 8 + 4 = 12
    assert lim.limit == 12
    lim.update(Sample(4.9, in_flight=12, dropped=True))  # within cooldown
    assert lim.limit == 12
    lim.update(Sample(5.0, in_flight=12, dropped=True))  # 6 + 3.46
    assert lim.limit == 9


def test_gradient_stays_within_bounds() -> None:
    lim = GradientLimit(_policy("gradient", smoothing=1.0, cooldown_s=0.0))
    for i in range(100):
        lim.update(Sample(float(i), in_flight=64, latency_ratio=None))
    assert lim.limit == 64
    for i in range(100, 200):
        lim.update(Sample(float(i), in_flight=64, dropped=True))
    assert lim.limit == 4


def test_reload_carries_the_current_value_into_a_new_algorithm() -> None:
    lim = make_limit(_policy("aimd"), start=30)
    assert isinstance(lim, AIMDLimit) and lim.limit == 30
    assert make_limit(_policy("aimd", max=20), start=30).limit == 20


def test_latency_ratio_is_worst_of_tpot_and_queueing_part_of_ttft() -> None:
    slo = SLOClass(ttft_p99_s=2.0, tpot_p99_s=0.05)
    assert latency_ratio(slo, ttft_s=1.5, tpot_s=0.025, prefill_s=0.5) == 0.5
    assert latency_ratio(slo, ttft_s=3.5, tpot_s=0.025, prefill_s=0.5) == 1.5
    assert latency_ratio(SLOClass(ttft_p99_s=None, tpot_p99_s=None), 1.0, 0.1, 0.0) is None
    # offline shares its decode batch with interactive requests: its TPOT is judged by their target
    assert latency_ratio(SLOClass(ttft_p99_s=None, tpot_p99_s=None), 1.0, 0.1, 0.0, 0.05) == 2.0
    assert latency_ratio(slo, ttft_s=1.5, tpot_s=0.025, prefill_s=0.5, shared_tpot_p99_s=0.0125) == 0.5


async def test_an_offline_sample_beside_interactive_requests_counts_against_their_tpot_target() -> None:
    clock = FakeClock()
    pol = policy(controller={"algorithm": "aimd", "initial": 8, "min": 1, "max": 8, "cooldown_s": 0})
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)
    chat = await s.acquire(ticket(priority=10, prompt=1))
    batch = [await s.acquire(ticket(cls="offline", priority=0, prompt=1)) for _ in range(4)]
    batch[0].release(None, "ok", tpot_s=0.07)  # beside chat (target 0.06): an SLO miss, limit × 0.9
    assert s.limits["http://b0"].limit == 7
    chat.release(None, "ok", ttft_s=0.01, tpot_s=0.03)  # at 4 running ≥ 7 / 2: growth
    assert s.limits["http://b0"].limit == 8
    batch[1].release(None, "ok", tpot_s=0.07)  # offline alone: no target, no miss (3 < 8 / 2: no growth)
    assert s.limits["http://b0"].limit == 8


async def test_a_whole_answer_feeds_the_limit_its_per_token_time_not_its_length_as_a_first_token() -> None:
    """Non-streamed answers show no first token: taking the whole 8 s generation for one read as a 4× TTFT
    miss and halved the limit on every completion of non-streaming traffic. `engine_latencies` gives no
    TTFT and the time per output token instead, which judges the batch like a stream's TPOT."""
    clock = FakeClock()
    pol = policy(controller={"algorithm": "aimd", "initial": 8, "min": 1, "max": 8, "cooldown_s": 0})
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)
    leases = [await s.acquire(ticket(prompt=100, stream=False)) for _ in range(6)]
    for i, (lease, seconds) in enumerate(zip(leases, (8.0, 8.0, 32.0), strict=False)):
        t = lease.ticket
        t.dispatched_at, t.finished_at, t.usage = 0.0, seconds, Usage(100, 400)
        assert engine_latencies(t) == (None, seconds / 400)
        lease.release(t.usage, "ok", *engine_latencies(t))
        assert s.limits["http://b0"].limit == [8, 8, 7][i]  # 20 ms per token is fine; 80 ms misses 60
    for lease in leases[3:]:
        lease.release(None, "ok")


def test_engine_latencies_of_a_stream_are_measured_from_dispatch() -> None:
    t = ticket(prompt=100)
    t.dispatched_at, t.finished_at, t.usage = 1.0, 5.5, Usage(100, 401)
    t.relayed = Relayed(first_token_at=1.5, finished_at=5.5)
    assert engine_latencies(t) == (0.5, 0.01)
    t.usage = None  # cut before any usage: no TPOT
    assert engine_latencies(t) == (0.5, None)


def test_policy_rejects_unordered_bounds() -> None:
    with pytest.raises(ValueError, match="min <= initial <= max"):
        ControllerPolicy(min=10, initial=5, max=64)


def _target(**kw: float) -> TargetLimit:
    base: dict[str, float] = {"window": 4, "tail_window": 8, "headroom": 0.9, "gain": 0.5, "cooldown_s": 0}
    base.update(kw)
    lim = make_limit(_policy("target", **base))
    assert isinstance(lim, TargetLimit)
    return lim


def test_target_waits_for_a_window_then_steers_the_recent_p90_at_the_aim() -> None:
    lim = _target()
    for i in range(3):
        lim.update(Sample(float(i), in_flight=16, tpot_ratio=1.8))
    assert lim.value == 16 and lim.aim is None  # three samples: not a window yet
    lim.update(Sample(3.0, in_flight=16, tpot_ratio=1.8))
    # all equal: tail 1, aim 0.9, recent P90 1.8 → error 0.5 → 16 · 0.5^0.5
    assert lim.aim == pytest.approx(0.9)
    assert lim.recent_q90 == pytest.approx(1.8)
    assert lim.value == pytest.approx(16 * 0.5**0.5)
    assert lim.limit == 11


def test_target_reads_the_tail_over_the_long_window_and_the_p90_over_the_recent_one() -> None:
    lim = _target(gain=1.0, window=4, tail_window=20)
    for i in range(18):
        lim.update(Sample(float(i), in_flight=64, tpot_ratio=0.3))
    assert lim.aim == pytest.approx(0.9) and lim.limit == 64  # error 3, clamped to 2, up to the max
    lim.update(Sample(18.0, in_flight=64, tpot_ratio=0.6))
    # 19 samples: Q90 (18th) 0.3, Q99 (19th) 0.6 → tail 2, aim 0.45; recent Q90 0.6 → 64 · 0.75
    assert lim.aim == pytest.approx(0.45) and lim.value == pytest.approx(48)
    lim.update(Sample(19.0, in_flight=48, tpot_ratio=0.9))
    # 20 samples: Q99 (20th) 0.9 → tail 3, aim 0.3; recent Q90 0.9 → error 1/3, clamped to 1/2
    assert lim.aim == pytest.approx(0.3) and lim.recent_q90 == pytest.approx(0.9)
    assert lim.value == pytest.approx(24)


def test_target_reads_its_quantiles_over_exactly_the_last_samples_as_they_slide() -> None:
    """Long after the windows filled (old samples leave them, repeated values among them), the aim and the
    recent Q90 are those of the last tail_window and window samples, as sorting them would give."""
    lim = _target(window=4, tail_window=8)
    rng = random.Random(7)
    seen: list[float] = []
    for i in range(200):
        seen.append(rng.choice((0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.5)))
        lim.update(Sample(float(i), in_flight=64, tpot_ratio=seen[-1]))
        if len(seen) < 4:
            continue
        whole, recent = sorted(seen[-8:]), sorted(seen[-4:])
        q99, q90 = whole[math.ceil(0.99 * len(whole)) - 1], whole[math.ceil(0.9 * len(whole)) - 1]
        assert lim.aim == pytest.approx(0.9 / min(3.0, q99 / q90))
        assert lim.recent_q90 == recent[math.ceil(0.9 * len(recent)) - 1]


def test_target_grows_only_while_in_use_and_backs_off_on_a_drop_once_per_cooldown() -> None:
    lim = _target(cooldown_s=5.0)
    for i in range(4):
        lim.update(Sample(float(i), in_flight=7, tpot_ratio=0.45))  # 7 < 16 / 2: app-limited
    assert lim.value == 16
    lim.update(Sample(4.0, in_flight=8, tpot_ratio=0.45))  # error 2 → 16 · 2^0.5
    assert lim.value == pytest.approx(16 * 2**0.5)
    lim.update(Sample(5.0, in_flight=8, dropped=True))
    assert lim.value == pytest.approx(16 * 2**0.5 * 0.9)
    lim.update(Sample(6.0, in_flight=8, dropped=True))  # within the cooldown
    assert lim.value == pytest.approx(16 * 2**0.5 * 0.9)


def test_the_engines_own_cap_bounds_every_limit_without_winding_up() -> None:
    for algorithm in ("fixed", "aimd", "gradient", "target"):
        lim = make_limit(_policy(algorithm, initial=48, max=128, window=4, tail_window=8, cooldown_s=0))
        lim.ceiling = 32
        assert lim.limit == 32
        for i in range(50):
            lim.update(Sample(float(i), in_flight=32, latency_ratio=0.1, tpot_ratio=0.1))
        assert lim.limit == 32
        if algorithm != "fixed":
            assert lim.value <= 48  # no growth hidden above the ceiling
            lim.ceiling = None
            assert lim.limit <= 48


def test_target_holds_the_p99_at_the_objective_on_a_modelled_engine() -> None:
    """A decode batch whose per-token time grows with the batch, times a lognormal spread (σ 0.3: P90
    1.47×, P99 2.01× the median): ratio = (0.3 + limit / 100) · spread. Headroom 0.9 puts the P99 at 0.9
    where limit ≈ 14.8. Started at 40, the controller brings the P99 of the last 1000 samples under the
    objective and not far below it, on several seeds."""
    for seed in range(4):
        rng = random.Random(seed)
        lim = make_limit(_policy("target", initial=40, max=64, window=32, tail_window=256, gain=0.02))
        ratios, values = [], []
        for i in range(4000):
            ratio = (0.3 + lim.limit / 100) * math.exp(rng.gauss(0.0, 0.3))
            lim.update(Sample(float(i), in_flight=lim.limit, tpot_ratio=ratio))
            ratios.append(ratio)
            values.append(lim.value)
        last = sorted(ratios[-1000:])
        assert 0.85 <= last[989] <= 1.0
        assert 12 <= sum(values[-1000:]) / 1000 <= 18


async def test_the_scheduler_caps_each_limit_at_its_engines_max_running_requests() -> None:
    clock = FakeClock()
    pol = policy(controller={"algorithm": "fixed", "initial": 32, "min": 1, "max": 64})
    bs = backends(1)
    bs[0].max_running_requests = 2  # scraped from the engine (/server_info)
    s = PoolScheduler("interactive", bs, lambda: pol.admission, clock=clock)
    held = [await s.acquire(ticket(prompt=1)) for _ in range(2)]
    assert s.limits["http://b0"].limit == 2 and bs[0].concurrency_limit == 2
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.05):
            await s.acquire(ticket(prompt=1))  # a third would queue in the engine: it waits here
    bs[0].max_running_requests = None  # a scrape without it: the policy's bounds alone
    held.append(await s.acquire(ticket(prompt=1)))
    assert s.limits["http://b0"].limit == 32
    for lease in held:
        lease.release(None, "ok")


def test_target_steers_on_tpot_alone_a_slow_first_token_does_not_move_it() -> None:
    lim = _target()
    for i in range(6):  # engine queueing in the first token (latency ratio 3), decode at half its target
        lim.update(Sample(float(i), in_flight=64, latency_ratio=3.0, tpot_ratio=0.45))
    assert lim.value == pytest.approx(16 * 2**1.5)  # three steps of 2^0.5 up, from the fourth sample on
    no_tpot = _target()  # a class with no TPOT target anywhere in the batch: no signal
    for i in range(8):
        no_tpot.update(Sample(float(i), in_flight=16, latency_ratio=0.1))
    assert no_tpot.value == 16


def _spied_target(clock: FakeClock) -> tuple[PoolScheduler, list[Sample]]:
    """A scheduler on one backend with the target limit (window 4), and the samples its limit is fed."""
    pol = policy(controller={"algorithm": "target", "initial": 8, "min": 1, "max": 8, "window": 4})
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)
    seen: list[Sample] = []
    s.limits["http://b0"].update = seen.append  # type: ignore[method-assign]
    return s, seen


async def test_the_scheduler_feeds_the_tpot_part_beside_the_whole_ratio() -> None:
    clock = FakeClock()
    s, seen = _spied_target(clock)
    lease = await s.acquire(ticket(prompt=1))
    lease.release(None, "ok", ttft_s=4.0, tpot_s=0.03)
    assert seen[0].tpot_ratio == pytest.approx(0.5) and seen[0].latency_ratio == pytest.approx(2.0, rel=0.01)


def test_target_derives_the_prefill_duty_from_the_decode_step_under_the_aim() -> None:
    lim = _target()  # window 4, headroom 0.9
    steps = [(0.6, 0.5), (0.8, 0.5), (0.5, 0.0), (1.2, 0.75)]  # decode steps 0.3, 0.4, 0.5, 0.3
    for i, (ratio, share) in enumerate(steps[:3]):
        lim.update(Sample(float(i), in_flight=16, tpot_ratio=ratio, prefill_share=share))
    assert lim.prefill_duty == 1.0  # three steps: not a window yet
    lim.update(Sample(3.0, in_flight=16, tpot_ratio=1.2, prefill_share=0.75))
    assert lim.prefill_duty == pytest.approx(1 - 0.35 / 0.9)  # median step 0.35
    lim.update(Sample(4.0, in_flight=16, tpot_ratio=5.0))  # no share known: no step
    assert lim.prefill_duty == pytest.approx(1 - 0.35 / 0.9)
    for i in range(4):
        lim.update(Sample(5.0 + i, in_flight=16, tpot_ratio=1.0, prefill_share=0.0))
    assert lim.prefill_duty == pytest.approx(0.2)  # the step alone over the aim: the floor
    for algorithm in ("fixed", "aimd", "gradient"):
        other = make_limit(_policy(algorithm))
        other.update(Sample(0.0, in_flight=16, latency_ratio=1.0, tpot_ratio=1.0, prefill_share=0.0))
        assert other.prefill_duty == 1.0


def test_target_parts_switched_off_for_ablation_leave_the_duty_at_1_and_the_aim_at_headroom() -> None:
    """`controller.duty` / `tail_shape` false (bench/family.py --ablate): the same samples as above
    leave the duty at 1, and a tail of 2 no longer lowers the aim."""
    lim = _target(duty=False, tail_shape=False, gain=1.0, window=4, tail_window=20)
    for i in range(18):
        lim.update(Sample(float(i), in_flight=64, tpot_ratio=0.3, prefill_share=0.0))
    lim.update(Sample(18.0, in_flight=64, tpot_ratio=0.6, prefill_share=0.0))
    assert lim.prefill_duty == 1.0
    # with the tail read: aim 0.45, limit 64 · 0.75 = 48; without: aim 0.9, error 1.5, it stays at the max
    assert lim.aim == pytest.approx(0.9) and lim.limit == 64


async def test_the_scheduler_feeds_the_prefill_its_engine_ran_during_the_decode() -> None:
    clock = FakeClock()
    s, seen = _spied_target(clock)
    decoding = await s.acquire(ticket(prompt=100))
    decoding.started()  # its first byte at 1000.0
    clock.now = 1000.5
    other = await s.acquire(ticket(prompt=2000))  # sent while it decodes
    clock.now = 1001.0
    decoding.release(None, "ok", tpot_s=0.03)
    # 2000 tokens at the prior 10000 tokens/s over 1 s of decode
    assert seen[0].prefill_share == pytest.approx(0.2)
    other.release(None, "ok", tpot_s=0.03)  # never started: no share
    assert seen[1].prefill_share is None
