"""The usage report shared by the admin API, the tenant-facing /v1/usage route and the CLI."""

from __future__ import annotations

from typing import Any

from gateway.tenants.models import Tenant
from gateway.tenants.quota import LedgerRow, day_of, month_of, seconds_to_next_day, seconds_to_next_month
from gateway.tenants.store import Store

MAX_HISTORY_DAYS = 400


def _row(row: LedgerRow) -> dict[str, int | float]:
    return {
        "input_tokens": row.input_tokens,
        "output_tokens": row.output_tokens,
        "total_tokens": row.total,
        "requests": row.requests,
        "audio_seconds": row.audio_ms / 1000,
    }


def _budget(row: LedgerRow, limit: int | None, audio_limit: int | None, resets_in: float) -> dict[str, Any]:
    remaining = None if limit is None else max(0, limit - row.total)
    audio_left = None if audio_limit is None else max(0.0, (audio_limit * 1000 - row.audio_ms) / 1000)
    return {
        **_row(row),
        "limit": limit,
        "remaining": remaining,
        "audio_seconds_limit": audio_limit,
        "audio_seconds_remaining": audio_left,
        "resets_in_s": round(resets_in, 3),
    }


async def usage_report(store: Store, tenant: Tenant, now: float, days: int) -> dict[str, Any]:
    """Ledger totals include open reservations (estimates until their requests finish)."""
    days = max(1, min(days, MAX_HISTORY_DAYS))
    levels = await store.levels(tenant.id, tenant.quotas, now)
    active = await store.active_count(tenant.id, now)
    day_list = [day_of(now - i * 86400) for i in range(days)]
    rows, month = await store.ledger(tenant.id, day_list, month_of(now))
    per_minute = {}
    for name, level in levels.items():
        limit = getattr(tenant.quotas, name)
        per_minute[name] = {"limit": limit, "remaining": round(level, 3), "used": round(limit - level, 3)}
    return {
        "tenant": tenant.id,
        "at": now,
        "per_minute": per_minute,
        "concurrent": {"limit": tenant.quotas.max_concurrent, "active": active},
        "today": {
            "date": day_list[0],
            **_budget(
                rows.get(day_list[0], LedgerRow()),
                tenant.quotas.daily_tokens,
                tenant.quotas.daily_audio_seconds,
                seconds_to_next_day(now),
            ),
        },
        "month": {
            "month": month_of(now),
            **_budget(
                month,
                tenant.quotas.monthly_tokens,
                tenant.quotas.monthly_audio_seconds,
                seconds_to_next_month(now),
            ),
        },
        "history": [{"date": d, **_row(rows[d])} for d in day_list if d in rows],
    }
