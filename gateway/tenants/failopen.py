"""Fail-open limits: what one replica may admit on its own while the shared store is down.

A replica gets its share of each tenant's quota — 1/N of it, N the live replicas it last saw in the
registry of live replicas (gateway/coordination/registry.py) — and starts from the tenant's last known state,
not from full buckets:
- per-minute limit L: a local bucket of capacity L/N that starts at (last known level)/N, so all N
  replicas together start where the shared bucket was and refill at its rate;
- concurrency: max_concurrent/N (at least 1);
- day/month budget B with U used when last seen: the local ledger starts at U and may grow by (B − U)/N
  (tokens, and audio seconds for the audio budgets).
A tenant never seen by this replica (no known state) starts from full buckets and an empty ledger: its
share of a full quota.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.tenants.models import Quotas
from gateway.tenants.quota import BUCKET_LIMITS, Bucket, LedgerRow, QuotaBook, day_of, month_of


@dataclass(frozen=True, slots=True)
class Known:
    """A tenant's shared state as the last admission saw it."""

    levels: dict[str, float]  # per-minute bucket levels after that admission
    used_day: int
    used_month: int
    at: float
    audio_day_ms: int = 0  # audio spoken today / this month, for the audio budgets
    audio_month_ms: int = 0


def share(quotas: Quotas, replicas: int, known: Known | None) -> Quotas:
    """This replica's part of `quotas` when `replicas` replicas admit on their own."""
    n = max(1, replicas)
    if n == 1 and known is None:
        return quotas
    update: dict[str, int] = {}
    for name in (*BUCKET_LIMITS, "max_concurrent"):
        limit = getattr(quotas, name)
        if limit is not None:
            update[name] = max(1, limit // n)
    k = known or Known({}, 0, 0, 0.0)
    for name, used in (
        ("daily_tokens", k.used_day),
        ("monthly_tokens", k.used_month),
        ("daily_audio_seconds", k.audio_day_ms // 1000),
        ("monthly_audio_seconds", k.audio_month_ms // 1000),
    ):
        budget = getattr(quotas, name)
        if budget is not None:
            update[name] = max(1, used + max(0, budget - used) // n)
    return quotas.model_copy(update=update)


def seed(book: QuotaBook, tenant_id: str, replicas: int, known: Known | None) -> None:
    """Start a tenant's local buckets and ledger from its last known state (see the module docstring)."""
    if known is None:
        return
    n = max(1, replicas)
    # stamped when seen: the buckets refill from then, as the shared ones did
    book.buckets[tenant_id] = {name: Bucket(level / n, known.at) for name, level in known.levels.items()}
    book.days[(tenant_id, day_of(known.at))] = LedgerRow(known.used_day, 0, 0, known.audio_day_ms)
    book.months[(tenant_id, month_of(known.at))] = LedgerRow(known.used_month, 0, 0, known.audio_month_ms)
