"""Quota arithmetic of QuotaBook on a fake clock: exact numbers from the formulas in quota.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.tenants.failopen import Known, seed, share
from gateway.tenants.models import Quotas
from gateway.tenants.quota import Charge, Denial, QuotaBook, day_of, seconds_to_next_month
from tests.tenants.conftest import T0


def ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def test_bucket_refills_at_limit_per_minute_and_caps_at_burst() -> None:
    book, q = QuotaBook(), Quotas(total_tpm=600)  # 10 tokens/s
    assert book.try_reserve("t", q, Charge(400, 200), T0) is None
    assert book.try_reserve("t", q, Charge(100, 0), T0) == Denial("total_tpm", 10.0)
    assert book.try_reserve("t", q, Charge(100, 0), T0 + 10) is None
    assert book.levels("t", q, T0 + 10) == {"total_tpm": 0.0}
    assert book.levels("t", q, T0 + 3600) == {"total_tpm": 600.0}  # burst = one minute's limit


def test_request_larger_than_the_limit_passes_only_on_a_full_bucket_then_leaves_debt() -> None:
    book, q = QuotaBook(), Quotas(total_tpm=600)
    assert book.try_reserve("t", q, Charge(10, 0), T0) is None
    assert book.try_reserve("t", q, Charge(900, 0), T0) == Denial("total_tpm", 1.0)
    assert book.try_reserve("t", q, Charge(900, 0), T0 + 1) is None
    assert book.levels("t", q, T0 + 1) == {"total_tpm": -300.0}
    assert book.try_reserve("t", q, Charge(0, 0), T0 + 1) == Denial("total_tpm", 30.0)


def test_reconcile_returns_unused_tokens_clamped_at_capacity_and_charges_excess() -> None:
    book, q = QuotaBook(), Quotas(input_tpm=1000, output_tpm=1000, total_tpm=1200)
    assert book.try_reserve("t", q, Charge(300, 500), T0) is None
    book.settle("t", q, Charge(300, 500), Charge(300, 100), T0, T0)
    assert book.levels("t", q, T0) == {"input_tpm": 700.0, "output_tpm": 900.0, "total_tpm": 800.0}
    assert book.try_reserve("t", q, Charge(100, 100), T0) is None
    book.settle("t", q, Charge(100, 100), Charge(100, 900), T0, T0)  # the stream ran long: charged after
    assert book.levels("t", q, T0) == {"input_tpm": 600.0, "output_tpm": 0.0, "total_tpm": -200.0}
    assert book.try_reserve("t", q, Charge(1, 0), T0 + 60) is None
    book.settle("t", q, Charge(1, 0), Charge(0, 0), T0 + 60, T0 + 60)
    assert book.levels("t", q, T0 + 60)["input_tpm"] == 1000.0  # refund above capacity is dropped


def test_the_longest_wait_among_denying_limits_is_reported() -> None:
    book, q = QuotaBook(), Quotas(input_tpm=60, output_tpm=600, rpm=2)
    assert book.try_reserve("t", q, Charge(60, 600), T0) is None
    # input needs 60 s to refill 60 tokens, output 60 s for 600, rpm 30 s for one request.
    assert book.try_reserve("t", q, Charge(30, 0), T0) == Denial("input_tpm", 30.0)
    assert book.try_reserve("t", q, Charge(0, 600), T0) == Denial("output_tpm", 60.0)
    assert book.try_reserve("t", q, Charge(0, 0), T0 + 1) is None
    assert book.try_reserve("t", q, Charge(0, 0), T0 + 1) == Denial("rpm", pytest.approx(29.0))
    assert Denial("rpm", 1).code == "requests_per_minute_exceeded"


def test_denied_reservation_changes_nothing() -> None:
    book, q = QuotaBook(), Quotas(input_tpm=100, output_tpm=100)
    assert book.try_reserve("t", q, Charge(50, 100), T0) is None
    assert book.try_reserve("t", q, Charge(50, 1), T0) is not None
    assert book.levels("t", q, T0) == {"input_tpm": 50.0, "output_tpm": 0.0}
    assert book.active["t"] == 1
    assert book.days[("t", "2025-03-10")].requests == 1


def test_concurrency_slots_are_freed_by_settle() -> None:
    book, q = QuotaBook(), Quotas(max_concurrent=2)
    assert book.try_reserve("t", q, Charge(1, 1), T0) is None
    assert book.try_reserve("t", q, Charge(1, 1), T0) is None
    assert book.try_reserve("t", q, Charge(1, 1), T0) == Denial("max_concurrent", 1.0)
    book.settle("t", q, Charge(1, 1), Charge(1, 1), T0, T0)
    assert book.try_reserve("t", q, Charge(1, 1), T0) is None


def test_daily_budget_rolls_over_at_utc_midnight() -> None:
    book, q = QuotaBook(), Quotas(daily_tokens=1000)
    late = ts(2025, 3, 10, 23, 59, 30)
    assert book.try_reserve("t", q, Charge(600, 400), late) is None
    assert book.try_reserve("t", q, Charge(1, 0), late) == Denial("daily_tokens", 30.0)
    assert book.try_reserve("t", q, Charge(1, 0), late + 30) is None
    assert book.days[("t", "2025-03-10")].total == 1000
    assert book.days[("t", "2025-03-11")].total == 1


def test_monthly_budget_rolls_over_at_the_first_of_the_month() -> None:
    book, q = QuotaBook(), Quotas(monthly_tokens=500, daily_tokens=10_000)
    assert book.try_reserve("t", q, Charge(500, 0), ts(2025, 1, 3)) is None
    assert book.try_reserve("t", q, Charge(1, 0), ts(2025, 1, 31, 23, 59, 50)) == Denial(
        "monthly_tokens", 10.0
    )
    assert book.try_reserve("t", q, Charge(1, 0), ts(2025, 2, 1)) is None
    assert seconds_to_next_month(ts(2024, 12, 31, 23, 0)) == 3600.0


def test_reconcile_adjusts_the_ledger_of_the_reservation_day() -> None:
    book, q = QuotaBook(), Quotas(daily_tokens=1000)
    late = ts(2025, 3, 10, 23, 59, 59)
    assert book.try_reserve("t", q, Charge(100, 500), late) is None
    book.settle("t", q, Charge(100, 500), Charge(100, 20), late, late + 5)  # finished after midnight
    assert book.days[("t", "2025-03-10")].total == 120
    assert ("t", "2025-03-11") not in book.days
    assert book.months[("t", "2025-03")].total == 120


@pytest.mark.parametrize(
    ("budget", "used", "ask", "admitted"), [(100, 0, 100, True), (100, 1, 100, False), (100, 0, 250, True)]
)
def test_a_request_larger_than_the_budget_needs_an_untouched_budget(
    budget: int, used: int, ask: int, admitted: bool
) -> None:
    book, q = QuotaBook(), Quotas(daily_tokens=budget)
    book.record("t", T0, used, 0, 0)
    assert (book.try_reserve("t", q, Charge(ask, 0), T0) is None) is admitted


def test_fail_open_gives_each_replica_its_share_of_the_audio_left() -> None:
    quotas = Quotas(audio_spm=60, daily_audio_seconds=100, monthly_audio_seconds=1000)
    known = Known({}, 0, 0, T0, audio_day_ms=40_000, audio_month_ms=400_500)
    mine = share(quotas, 3, known)
    assert (mine.audio_spm, mine.daily_audio_seconds, mine.monthly_audio_seconds) == (20, 40 + 20, 400 + 200)
    book = QuotaBook()
    seed(book, "acme", 3, known)
    assert book.days[("acme", day_of(T0))].audio_ms == 40_000
