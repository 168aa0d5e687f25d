"""The one interface every tenant store implements (memory, sqlite, redis), and its failure type.

Stores hold data and quota counters; they know nothing of policy defaults, HTTP or logging. All times
are seconds since the epoch from the caller's clock, so tests drive every store with a fake clock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from gateway.tenants.failopen import Known
from gateway.tenants.models import KeyRecord, Quotas, TenantSpec
from gateway.tenants.quota import Charge, Denial, LedgerRow

StoreState = Literal["up", "slow", "down", "unusable"]


class StoreUnavailable(Exception):
    """The store cannot take the call now (Redis unreachable, a SQLite file locked); the service applies
    the configured failure mode. `sent`: the call may have reached the store (its fate is unknown), False
    when it was refused here without being sent."""

    state: StoreState = "down"

    def __init__(self, message: str, *, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class StoreSlow(StoreUnavailable):
    """The store did not answer a request-path call within its deadline, or has not answered quickly
    since it last missed one (it is probed in the background)."""

    state: StoreState = "slow"


class StoreUnusable(StoreUnavailable):
    """The store answers but refuses the call (Redis out of memory, read-only, loading its data)."""

    state: StoreState = "unusable"


@dataclass(frozen=True, slots=True)
class Health:
    """What a store's periodic check found: its state, the live replicas sharing it, and whether it has
    forgotten its data (a Redis restarted without persistence): then the service seeds it again."""

    state: StoreState = "up"
    replicas: int = 1
    emptied: bool = False


class Store(ABC):
    kind: str = ""

    async def start(self) -> None:  # noqa: B027 - optional hook: the memory store has nothing to open
        """Open connections and load what the store keeps in memory."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; safe to call twice."""

    async def check(self, now: float) -> Health:
        """A periodic check (every second): a store held in this process is always up."""
        return Health()

    async def mark_seeded(self) -> None:  # noqa: B027 - optional hook: only a shared store can forget
        """Record that the configured tenants are in the store, so that `check` sees when it forgets."""

    @contextmanager
    def patient(self) -> Iterator[None]:
        """Calls made inside wait for the store as long as it takes (seeding, the admin API, outbox
        replays): only the request path is held to a shared store's deadline."""
        yield

    def known(self, tenant_id: str) -> Known | None:
        """The tenant's shared quota state as this replica last saw it (where fail-open limits start);
        None for a store in this process, which never fails open."""
        return None

    # tenants and keys
    @abstractmethod
    async def list_tenants(self) -> list[TenantSpec]: ...

    @abstractmethod
    async def get_tenant(self, tenant_id: str) -> TenantSpec | None: ...

    @abstractmethod
    async def create_tenant(self, spec: TenantSpec) -> bool:
        """Store a new tenant; False (and no change) if the id exists."""

    @abstractmethod
    async def update_tenant(self, spec: TenantSpec) -> bool:
        """Replace an existing tenant; False if it does not exist."""

    @abstractmethod
    async def delete_tenant(self, tenant_id: str) -> bool:
        """Remove the tenant and all its keys (its usage ledger stays for accounting)."""

    @abstractmethod
    async def add_key(self, record: KeyRecord) -> None: ...

    @abstractmethod
    async def key_by_hash(self, key_hash: str) -> KeyRecord | None: ...

    @abstractmethod
    async def list_keys(self, tenant_id: str) -> list[KeyRecord]: ...

    @abstractmethod
    async def revoke_key(self, tenant_id: str, key_id: str, now: float) -> KeyRecord | None:
        """Mark the key revoked; None if the tenant has no such key."""

    # quota counters
    @abstractmethod
    async def reserve(
        self, tenant_id: str, quotas: Quotas, charge: Charge, now: float, reservation_id: str
    ) -> Denial | None:
        """Atomically check and take every limit (see quota.py for the arithmetic); None = admitted."""

    @abstractmethod
    async def settle(
        self,
        tenant_id: str,
        quotas: Quotas,
        reserved: Charge,
        actual: Charge,
        reserved_at: float,
        now: float,
        reservation_id: str,
        replay: bool = False,
    ) -> None:
        """Reconcile a reservation with actual usage and free its concurrency slot. May raise (the store
        cannot take it now); calling it again for the same reservation, with `replay`, applies what was
        not applied and never anything twice."""

    @abstractmethod
    async def record_usage(
        self,
        tenant_id: str,
        quotas: Quotas,
        reserved: Charge,
        usage: Charge,
        ts: float,
        now: float,
        reservation_id: str,
        requests: int = 1,
    ) -> None:
        """Add one request admitted elsewhere (under local limits while this store was down) to the
        day/month ledger of `ts`, once per reservation id; `requests` 0 for one refused locally (it counts
        nothing). A store whose reserve of `reserved` for that id may have landed after the caller gave up
        on it (a deadline) settles that reservation to `usage` instead: the ledger counts it once."""

    @abstractmethod
    async def levels(self, tenant_id: str, quotas: Quotas, now: float) -> dict[str, float]:
        """Remaining capacity of each configured per-minute limit."""

    @abstractmethod
    async def active_count(self, tenant_id: str, now: float) -> int: ...

    @abstractmethod
    async def ledger(
        self, tenant_id: str, days: list[str], month: str
    ) -> tuple[dict[str, LedgerRow], LedgerRow]:
        """Ledger rows for the given UTC days (missing days omitted) and the total of one month."""
