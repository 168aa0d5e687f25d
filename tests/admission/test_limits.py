"""Adaptive concurrency limits: exact decisions of Fixed, AIMD and Gradient2 on given samples."""

from __future__ import annotations

import math

import pytest

from gateway.admission.limits import AIMDLimit, FixedLimit, GradientLimit, Sample, latency_ratio, make_limit
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.settings import ControllerPolicy, SLOClass
from gateway.pipeline import engine_latencies
from gateway.ticket import Usage
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
    assert lim._value == pytest.approx(18 * 0.5 + (18 * 0.5 + math.sqrt(18)) * 0.5)
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
    t.dispatched_at, t.first_token_at, t.finished_at, t.usage = 1.0, 1.5, 5.5, Usage(100, 401)
    assert engine_latencies(t) == (0.5, 0.01)
    t.usage = None  # cut before any usage: no TPOT
    assert engine_latencies(t) == (0.5, None)


def test_policy_rejects_unordered_bounds() -> None:
    with pytest.raises(ValueError, match="min <= initial <= max"):
        ControllerPolicy(min=10, initial=5, max=64)
