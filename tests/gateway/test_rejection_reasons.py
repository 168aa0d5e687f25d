"""Which rejection reason ops see in omnigate_rejections_total for each code the stages raise."""

from __future__ import annotations

import pytest

from gateway.replica import rejection_reason


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        (429, "daily_token_budget_exceeded", "budget"),
        (429, "monthly_token_budget_exceeded", "budget"),
        (429, "tokens_per_minute_exceeded", "quota"),
        (429, "slo_unattainable", "slo_unattainable"),
        (503, "queue_timeout", "queue_full"),
        (503, "no_healthy_backend", "backend_error"),
        (400, "invalid_image", "bad_input"),
    ],
)
def test_rejection_reasons_follow_the_codes_the_stages_raise(status, code, reason):
    assert rejection_reason(status, code) == reason
