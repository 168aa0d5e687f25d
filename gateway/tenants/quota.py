"""Quota arithmetic: token buckets, concurrency counts and day/month budgets, pure code on a given clock.

Formulas (the Redis Lua script in redis_scripts.py is a line-by-line port; keep them in step):
- A per-minute limit L is a bucket of capacity L refilled at L/60 per second (`audio_spm` counts audio
  seconds, the others tokens or requests):
  level(now) = min(L, level + (now - stamp) * L / 60).
- Admission needs level >= min(amount, L) on every limit at once, then subtracts the full amount. The
  level may go negative (debt) and blocks everyone until refilled, so a request can overshoot a limit by at
  most its own reservation, however many run concurrently. A request larger than the whole limit is still
  admitted once, when the bucket is full. `audio_spm` in debt holds back only requests that speak: a text
  answer takes no audio seconds, and a tenant's speech must not block its text.
- Retry-After for a bucket = (min(amount, L) - level) * 60 / L: the time until refill covers the need.
- Reconcile adds back reserved - actual (clamped at the capacity) or charges the excess (going into debt).
- The day/month ledger counts audio in whole milliseconds (`audio_ms`), so every store adds integers.
- Budgets: tokens used in the UTC day / month, including open reservations; admission needs
  used + min(total, budget) <= budget; Retry-After runs to the next UTC midnight / first of the month.
  The audio budgets (`daily_audio_seconds`, `monthly_audio_seconds`) do the same in audio milliseconds and,
  like `audio_spm`, hold back only requests that speak.
- Concurrency: requests admitted and not yet finished; Retry-After is a nominal poll interval.
When several limits deny, the one with the longest wait is reported: that is when all of them clear.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gateway.request.errors import ErrorCode
from gateway.tenants.models import Quotas

BUCKET_LIMITS = ("input_tpm", "output_tpm", "total_tpm", "rpm", "audio_spm")
REFUNDED_LIMITS = ("input_tpm", "output_tpm", "total_tpm", "audio_spm")  # what a reconcile corrects
SPEAKING_ONLY = frozenset({"audio_spm"})  # in debt, it holds back only the requests that speak
LIMIT_CODES = {
    "input_tpm": ErrorCode.INPUT_TPM_EXCEEDED,
    "output_tpm": ErrorCode.OUTPUT_TPM_EXCEEDED,
    "total_tpm": ErrorCode.TOTAL_TPM_EXCEEDED,
    "rpm": ErrorCode.RPM_EXCEEDED,
    "audio_spm": ErrorCode.AUDIO_SPM_EXCEEDED,
    "max_concurrent": ErrorCode.CONCURRENCY_EXCEEDED,
    "daily_tokens": ErrorCode.DAILY_BUDGET_EXCEEDED,
    "monthly_tokens": ErrorCode.MONTHLY_BUDGET_EXCEEDED,
    "daily_audio_seconds": ErrorCode.DAILY_AUDIO_BUDGET_EXCEEDED,
    "monthly_audio_seconds": ErrorCode.MONTHLY_AUDIO_BUDGET_EXCEEDED,
}
LIMIT_TEXT = {
    "input_tpm": "input tokens per minute",
    "output_tpm": "output tokens per minute",
    "total_tpm": "tokens per minute",
    "rpm": "requests per minute",
    "audio_spm": "audio seconds per minute",
    "max_concurrent": "concurrent requests",
    "daily_tokens": "daily token budget",
    "monthly_tokens": "monthly token budget",
    "daily_audio_seconds": "daily audio budget",
    "monthly_audio_seconds": "monthly audio budget",
}
CONCURRENCY_RETRY_S = 1.0


def audio_ms(seconds: float) -> int:
    """Audio seconds as the ledger counts them: whole milliseconds."""
    return round(seconds * 1000)


@dataclass(frozen=True, slots=True)
class Charge:
    input_tokens: int = 0
    output_tokens: int = 0
    audio_ms: int = 0  # audio the answer speaks: predicted when reserved, as delivered when reconciled

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def bucket_amounts(self) -> dict[str, float]:
        return {
            "input_tpm": self.input_tokens,
            "output_tpm": self.output_tokens,
            "total_tpm": self.total,
            "rpm": 1,
            "audio_spm": self.audio_ms / 1000.0,
        }


@dataclass(frozen=True, slots=True)
class Denial:
    """Which limit refused a reservation and how long until it would pass."""

    limit: str
    retry_after: float

    @property
    def code(self) -> ErrorCode:
        return LIMIT_CODES[self.limit]


@dataclass(slots=True)
class LedgerRow:
    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    audio_ms: int = 0

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, input_tokens: int, output_tokens: int, requests: int, audio_ms: int = 0) -> None:
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.requests += requests
        self.audio_ms += audio_ms


@dataclass(slots=True)
class Bucket:
    level: float
    stamp: float

    def current(self, limit: int, now: float) -> float:
        return min(float(limit), self.level + max(0.0, now - self.stamp) * limit / 60.0)


def day_of(ts: float) -> str:
    """The UTC day of `ts`, "YYYY-MM-DD" (every request asks: formatted once per day)."""
    return _utc_day(int(ts // 86400))


def month_of(ts: float) -> str:
    """The UTC month of `ts`, "YYYY-MM"."""
    return _utc_day(int(ts // 86400))[:7]


@functools.lru_cache(maxsize=64)
def _utc_day(day: int) -> str:
    return datetime.fromtimestamp(day * 86400, UTC).strftime("%Y-%m-%d")


def seconds_to_next_day(ts: float) -> float:
    return 86400.0 - ts % 86400.0


def seconds_to_next_month(ts: float) -> float:
    d = datetime.fromtimestamp(ts, UTC)
    nxt = datetime(d.year + (d.month == 12), d.month % 12 + 1, 1, tzinfo=UTC)
    return nxt.timestamp() - ts


def budget_denial(
    quotas: Quotas, charge: Charge, day: LedgerRow, month: LedgerRow, now: float
) -> Denial | None:
    """The budget part of admission, shared by every store that keeps its ledger in Python."""
    worst: Denial | None = None
    for limit, used, amount, scale, wait in (
        ("daily_tokens", day.total, charge.total, 1, seconds_to_next_day),
        ("monthly_tokens", month.total, charge.total, 1, seconds_to_next_month),
        ("daily_audio_seconds", day.audio_ms, charge.audio_ms, 1000, seconds_to_next_day),
        ("monthly_audio_seconds", month.audio_ms, charge.audio_ms, 1000, seconds_to_next_month),
    ):
        budget = getattr(quotas, limit)
        if budget is None or (scale == 1000 and not amount):  # an audio budget holds back only speech
            continue
        if used + min(amount, budget * scale) > budget * scale:
            denial = Denial(limit, wait(now))
            worst = denial if worst is None or denial.retry_after > worst.retry_after else worst
    return worst


@dataclass
class QuotaBook:
    """In-memory quota state of many tenants: the memory store, the sqlite store's counters, and the
    local limits a Redis-backed gateway falls back to when Redis is down (fail-open)."""

    buckets: dict[str, dict[str, Bucket]] = field(default_factory=dict)
    active: dict[str, int] = field(default_factory=dict)
    days: dict[tuple[str, str], LedgerRow] = field(default_factory=dict)
    months: dict[tuple[str, str], LedgerRow] = field(default_factory=dict)

    def levels(self, tenant_id: str, quotas: Quotas, now: float) -> dict[str, float]:
        """Current level of each configured per-minute limit (full when never used)."""
        own = self.buckets.get(tenant_id, {})
        out: dict[str, float] = {}
        for name in BUCKET_LIMITS:
            limit = getattr(quotas, name)
            if limit is not None:
                bucket = own.get(name)
                out[name] = bucket.current(limit, now) if bucket else float(limit)
        return out

    def try_reserve(self, tenant_id: str, quotas: Quotas, charge: Charge, now: float) -> Denial | None:
        """Check every limit, then take all of them at once, or nothing."""
        levels = self.levels(tenant_id, quotas, now)
        amounts = charge.bucket_amounts()
        worst: Denial | None = None
        for name, level in levels.items():
            limit = getattr(quotas, name)
            need = min(amounts[name], limit)
            if level < need and (need > 0 or name not in SPEAKING_ONLY):
                denial = Denial(name, (need - level) * 60.0 / limit)
                worst = denial if worst is None or denial.retry_after > worst.retry_after else worst
        if quotas.max_concurrent is not None and self.active.get(tenant_id, 0) >= quotas.max_concurrent:
            denial = Denial("max_concurrent", CONCURRENCY_RETRY_S)
            worst = denial if worst is None or denial.retry_after > worst.retry_after else worst
        day = self.days.get((tenant_id, day_of(now)))
        month = self.months.get((tenant_id, month_of(now)))
        budget = budget_denial(quotas, charge, day or LedgerRow(), month or LedgerRow(), now)
        if budget is not None and (worst is None or budget.retry_after > worst.retry_after):
            worst = budget
        if worst is not None:
            return worst
        own = self.buckets.setdefault(tenant_id, {})
        for name, level in levels.items():
            own[name] = Bucket(level - amounts[name], now)
        self.active[tenant_id] = self.active.get(tenant_id, 0) + 1
        self.record(tenant_id, now, charge.input_tokens, charge.output_tokens, 1, charge.audio_ms)
        return None

    def settle(
        self, tenant_id: str, quotas: Quotas, reserved: Charge, actual: Charge, reserved_at: float, now: float
    ) -> None:
        """Return (or charge) the difference between the reservation and actual usage; free the slot."""
        own = self.buckets.get(tenant_id, {})
        res, act = reserved.bucket_amounts(), actual.bucket_amounts()
        for name in REFUNDED_LIMITS:
            limit, bucket = getattr(quotas, name), own.get(name)
            if limit is None or bucket is None:
                continue
            own[name] = Bucket(min(float(limit), bucket.current(limit, now) + res[name] - act[name]), now)
        self.active[tenant_id] = max(0, self.active.get(tenant_id, 0) - 1)
        self.record(
            tenant_id,
            reserved_at,
            actual.input_tokens - reserved.input_tokens,
            actual.output_tokens - reserved.output_tokens,
            0,
            actual.audio_ms - reserved.audio_ms,
        )

    def record(
        self,
        tenant_id: str,
        ts: float,
        input_tokens: int,
        output_tokens: int,
        requests: int,
        audio_ms: int = 0,
    ) -> None:
        """Add to the ledger of the UTC day and month containing `ts`."""
        for book, period in ((self.days, day_of(ts)), (self.months, month_of(ts))):
            row = book.get((tenant_id, period))
            if row is None:  # not setdefault: that would build a row on every request
                row = book[(tenant_id, period)] = LedgerRow()
            row.add(input_tokens, output_tokens, requests, audio_ms)

    def forget(self, tenant_id: str) -> None:
        self.buckets.pop(tenant_id, None)
        self.active.pop(tenant_id, None)
