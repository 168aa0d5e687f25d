"""Store kept entirely in process memory: unit tests, demos, and deployments that need no persistence."""

from __future__ import annotations

from gateway.tenants.models import KeyRecord, Quotas, TenantSpec
from gateway.tenants.quota import Charge, Denial, LedgerRow, QuotaBook
from gateway.tenants.store import Store


class MemoryStore(Store):
    kind = "memory"

    def __init__(self) -> None:
        self.tenants: dict[str, TenantSpec] = {}
        self.keys: dict[str, KeyRecord] = {}
        self.book = QuotaBook()

    async def list_tenants(self) -> list[TenantSpec]:
        return sorted(self.tenants.values(), key=lambda t: t.id)

    async def get_tenant(self, tenant_id: str) -> TenantSpec | None:
        return self.tenants.get(tenant_id)

    async def create_tenant(self, spec: TenantSpec) -> bool:
        if spec.id in self.tenants:
            return False
        self.tenants[spec.id] = spec
        return True

    async def update_tenant(self, spec: TenantSpec) -> bool:
        if spec.id not in self.tenants:
            return False
        self.tenants[spec.id] = spec
        return True

    async def delete_tenant(self, tenant_id: str) -> bool:
        if self.tenants.pop(tenant_id, None) is None:
            return False
        for key_hash in [h for h, r in self.keys.items() if r.tenant_id == tenant_id]:
            del self.keys[key_hash]
        self.book.forget(tenant_id)
        return True

    async def add_key(self, record: KeyRecord) -> None:
        self.keys[record.key_hash] = record

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        return self.keys.get(key_hash)

    async def list_keys(self, tenant_id: str) -> list[KeyRecord]:
        return sorted((r for r in self.keys.values() if r.tenant_id == tenant_id), key=lambda r: r.created_at)

    def _find_key(self, tenant_id: str, key_id: str) -> KeyRecord | None:
        return next((r for r in self.keys.values() if r.tenant_id == tenant_id and r.id == key_id), None)

    async def revoke_key(self, tenant_id: str, key_id: str, now: float) -> KeyRecord | None:
        record = self._find_key(tenant_id, key_id)
        if record is None:
            return None
        if not record.revoked:
            record = record.model_copy(update={"revoked_at": now})
            self.keys[record.key_hash] = record
        return record

    async def reserve(
        self, tenant_id: str, quotas: Quotas, charge: Charge, now: float, reservation_id: str
    ) -> Denial | None:
        return self.book.try_reserve(tenant_id, quotas, charge, now)

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
        self.book.settle(tenant_id, quotas, reserved, actual, reserved_at, now)

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
        self.book.record(tenant_id, ts, usage.input_tokens, usage.output_tokens, requests, usage.audio_ms)

    async def levels(self, tenant_id: str, quotas: Quotas, now: float) -> dict[str, float]:
        return self.book.levels(tenant_id, quotas, now)

    async def active_count(self, tenant_id: str, now: float) -> int:
        return self.book.active.get(tenant_id, 0)

    async def ledger(
        self, tenant_id: str, days: list[str], month: str
    ) -> tuple[dict[str, LedgerRow], LedgerRow]:
        rows = {d: self.book.days[(tenant_id, d)] for d in days if (tenant_id, d) in self.book.days}
        return rows, self.book.months.get((tenant_id, month), LedgerRow())
