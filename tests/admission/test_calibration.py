"""Refusal calibrated by the predictor's own error (shedding.WaitCalibration): admission refuses a request
predicted late only when it would be late even had it waited as little, against its prediction, as the
quickest recent admitted requests did."""

from __future__ import annotations

import pytest

from gateway.admission.fairness import VirtualTokenCounters
from gateway.admission.queue import SLOQueue
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.settings import QueuePolicy
from gateway.admission.shedding import PrefillRate, QueueGuard, WaitCalibration
from gateway.request.errors import ApiError
from tests.admission.helpers import FakeClock, backends, entry, policy, settle, spawn, ticket

TIGHT = policy(queue={"classes": {"interactive": {"ttft_p99_s": 0.5}}})
NO_SHED = policy(queue={"classes": {"interactive": {"shed_by_deadline": False}}})


def _calibration(**fields: object) -> WaitCalibration:
    return WaitCalibration(QueuePolicy.model_validate({"calibration_min_samples": 4, **fields}))


def test_the_factor_is_one_until_enough_samples_then_the_low_quantile() -> None:
    c = _calibration(refusal_confidence=0.75)
    for ratio in (0.5, 0.25, 0.75):
        c.observe(1.0, ratio, now=10.0)
    assert c.factor(10.0) == 1.0  # three samples, four needed: the prediction as it is
    c.observe(2.0, 2.0, now=10.0)  # a wait as predicted: ratio 1
    assert c.factor(10.0) == 0.25  # nearest rank of the 0.25 quantile among 0.25, 0.5, 0.75, 1
    for _ in range(4):
        c.observe(0.5, 1.0, now=11.0)  # predictions that ran late: ratio 2
    assert c.factor(11.0) == 0.5  # the 0.25 quantile of eight: the second smallest


def test_a_pessimistic_record_never_makes_admission_stricter() -> None:
    c = _calibration(refusal_confidence=0.5)
    for _ in range(4):
        c.observe(1.0, 3.0, now=0.0)  # every wait three times its prediction
    assert c.factor(0.0) == 1.0


def test_no_confidence_keeps_the_prediction_and_old_samples_are_forgotten() -> None:
    c = _calibration(refusal_confidence=None)
    for _ in range(4):
        c.observe(1.0, 0.5, now=0.0)
    assert c.factor(0.0) == 1.0
    c.configure(QueuePolicy(calibration_min_samples=4, prefill_rate_max_age_s=30.0))  # confidence 0.9
    assert c.factor(29.0) == 0.5
    assert c.factor(30.0) == 1.0  # the samples aged out


def test_nothing_measured_from_a_prediction_of_zero_or_a_negative_wait() -> None:
    c = _calibration()
    for predicted, actual in ((0.0, 1.0), (1.0, -0.1), (0.0, 0.0), (-1.0, 1.0)):
        c.observe(predicted, actual, now=0.0)
    assert c.factor(0.0) == 1.0  # no sample counted: under the four needed


def _guard(**queue: object) -> QueueGuard:
    rate = PrefillRate(QueuePolicy.model_validate({"initial_prefill_tokens_per_s": 1000.0, **queue}))
    return QueueGuard(SLOQueue(VirtualTokenCounters()), rate, "interactive")


def test_admission_refuses_only_when_late_even_at_the_calibrated_wait() -> None:
    g = _guard(calibration_min_samples=4, refusal_confidence=0.9)
    g.admit(entry(ticket(priority=10, prompt=750), NO_SHED), now=1000.0, backends=1)  # 0.75 s ahead
    late = entry(ticket(priority=5, prompt=250), TIGHT)  # predicted first token 1001.0, deadline 1000.5
    with pytest.raises(ApiError):
        g.admit(late, now=1000.0, backends=1)  # nothing measured yet: refused on the prediction
    for _ in range(4):
        g.calibration.observe(1.0, 0.5, now=1000.0)  # recent waits took half their prediction
    fits = entry(ticket(priority=5, prompt=250), TIGHT)  # 1 s predicted × 0.5 = 0.5 s: in time
    g.admit(fits, now=1000.0, backends=1)
    assert fits.queued and fits.judged_by_wait
    assert fits.ticket.predicted_first_token == 1001.0  # the prediction it keeps is the raw one
    with pytest.raises(ApiError) as exc:  # 1 s ahead + its own 0.25 s, halved: 0.625 s, past 0.5 s
        g.admit(entry(ticket(priority=5, prompt=250), TIGHT), now=1000.0, backends=1)
    assert exc.value.code == "slo_unattainable"


def test_the_first_byte_of_a_request_admitted_on_a_wait_calibrates() -> None:
    g = _guard(calibration_min_samples=1, refusal_confidence=0.5)
    g.admit(entry(ticket(priority=10, prompt=250), NO_SHED), now=1000.0, backends=1)
    waited = entry(ticket(priority=5, prompt=125), TIGHT)  # predicted first token at 1000.375
    g.admit(waited, now=1000.0, backends=1)
    at_once = entry(ticket(priority=5, prompt=125), TIGHT)
    at_once.requeued = True  # admitted before: never judged again, never a sample
    g.admit(at_once, now=1000.0, backends=1)
    g.calibrate(at_once, now=1000.1)
    assert g.calibration.factor(1000.1) == 1.0  # no sample
    g.calibrate(waited, now=1000.25)  # 0.25 s against 0.375 s predicted
    assert g.calibration.factor(1000.25) == pytest.approx(2 / 3)


async def test_a_streams_first_byte_calibrates_its_pool_and_the_state_shows_the_factor() -> None:
    clock = FakeClock()
    pol = policy(
        controller={"algorithm": "fixed", "initial": 1, "min": 1, "max": 1},
        queue={"calibration_min_samples": 1, "refusal_confidence": 0.5},
    )
    s = PoolScheduler("interactive", backends(1), lambda: pol.admission, clock=clock)
    first = await s.acquire(ticket(prompt=300))  # room: started at once, judged by no wait
    clock.advance(1.0)
    first.release(None, "ok")  # the slot turned over in 1 s
    second = await s.acquire(ticket(prompt=300, arrival=clock.now))
    waited = await spawn(s, ticket(prompt=300, arrival=clock.now))  # the one slot is taken: it waits
    clock.advance(0.25)
    second.release(None, "ok")  # sooner than the turnover predicted
    await settle()
    lease = waited.result()
    first_token = lease.ticket.predicted_first_token
    assert lease.entry.judged_by_wait and first_token is not None
    predicted = first_token - lease.entry.enqueued_at
    assert predicted > 0.5  # a slot predicted at the 1 s turnover
    assert s.snapshot()["refusal_wait_factor"] == 1.0  # nothing measured yet
    clock.advance(0.0625)
    lease.started()  # its first byte, 0.3125 s after it was queued
    assert s.snapshot()["refusal_wait_factor"] == round(0.3125 / predicted, 3)
    lease.release(None, "ok")
