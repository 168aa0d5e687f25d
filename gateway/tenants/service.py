"""TenantService: the one object the gateway talks to for identity, access, quotas and tenant admin.

Request path: authenticate → check_access → effective_priority → reserve → (request runs) → reconcile.
It applies policy defaults to stored tenants, turns store outages into the configured failure mode
(fail-open: local in-memory limits; fail-closed: 503) and keeps every plaintext key out of logs.
"""

from __future__ import annotations

import fnmatch
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from gateway.config import StoreConfig
from gateway.errors import ApiError, ErrorCode
from gateway.schema import describe
from gateway.tenants import metrics
from gateway.tenants.memory_store import MemoryStore
from gateway.tenants.models import KeyRecord, Tenant, TenantCreate, TenantPatch, TenantSpec, hash_key, new_key
from gateway.tenants.quota import BUCKET_LIMITS, LIMIT_TEXT, Charge, Denial, QuotaBook
from gateway.tenants.settings import TenantDefaults
from gateway.tenants.store import Store, StoreUnavailable
from gateway.tenants.usage import usage_report

log = logging.getLogger("omnigate.tenants")


class BootstrapTenant(TenantCreate):
    """A `tenants:` entry of gateway.yaml: a tenant plus plaintext keys, created at start if missing."""

    keys: list[str] = Field(default_factory=list)


class QuotaExceeded(ApiError):
    """429 naming the limit. `wait_allowed` tells the queue it may hold the request `retry_after` seconds."""

    def __init__(self, tenant: Tenant, denial: Denial) -> None:
        super().__init__(
            429,
            f"Rate limit reached for tenant {tenant.id!r}: {LIMIT_TEXT[denial.limit]} exceeded. "
            f"Retry after {denial.retry_after:.1f} s.",
            code=denial.code,
            retry_after=denial.retry_after,
        )
        self.limit = denial.limit
        self.wait_allowed = tenant.over_quota == "wait"


@dataclass(slots=True)
class Reservation:
    """Tokens and a concurrency slot held for one request until `reconcile`."""

    id: str
    tenant: Tenant
    charge: Charge
    reserved_at: float
    local: bool = False
    settled: bool = False


def build_store(config: StoreConfig, clock: Callable[[], float] = time.time) -> Store:
    """The store named by gateway.yaml's `store.kind`."""
    if config.kind == "memory":
        return MemoryStore()
    if config.kind == "sqlite":
        from gateway.tenants.sqlite_store import SQLiteStore

        return SQLiteStore(config.path)
    if not config.redis_url:
        raise ValueError("store.redis_url is required when store.kind is redis")
    from gateway.tenants.redis_store import RedisStore

    return RedisStore(config.redis_url, config.redis_prefix, clock=clock)


def parse_bootstrap(entries: Sequence[Mapping[str, Any]]) -> list[BootstrapTenant]:
    out = []
    for i, entry in enumerate(entries):
        try:
            out.append(BootstrapTenant.model_validate(dict(entry)))
        except ValidationError as e:
            raise ValueError(describe(e, f"tenants.{i}")) from None
    return out


class TenantService:
    def __init__(
        self,
        store: Store,
        *,
        defaults: TenantDefaults | None = None,
        failure: Literal["open", "closed"] = "open",
        clock: Callable[[], float] = time.time,
        bootstrap: list[BootstrapTenant] | None = None,
    ) -> None:
        self.store = store
        self.defaults = defaults or TenantDefaults()
        self._anonymous: Tenant | None = None
        self.failure = failure
        self.clock = clock
        self.bootstrap = bootstrap or []
        self.local = QuotaBook()
        self.store_up = True
        if hasattr(store, "on_outage"):
            store.on_outage = self._on_outage

    @classmethod
    def from_config(
        cls,
        store: StoreConfig,
        bootstrap: Sequence[Mapping[str, Any]] = (),
        defaults: TenantDefaults | None = None,
        clock: Callable[[], float] = time.time,
    ) -> TenantService:
        """The service on the store `store` names (with its failure mode), seeding the `bootstrap` tenants."""
        return cls(
            build_store(store, clock),
            defaults=defaults,
            failure=store.redis_failure,
            clock=clock,
            bootstrap=parse_bootstrap(bootstrap),
        )

    async def start(self) -> None:
        await self.store.start()
        try:
            await self._bootstrap()
        except StoreUnavailable:
            log.error("bootstrap tenants not applied: tenant store %s unreachable", self.store.kind)

    async def _bootstrap(self) -> None:
        for entry in self.bootstrap:
            if await self.store.get_tenant(entry.id) is None:
                await self.create_tenant(TenantCreate.model_validate(entry.model_dump(exclude={"keys"})))
            for plaintext in entry.keys:
                if await self.store.key_by_hash(hash_key(plaintext)) is None:
                    record, _ = new_key(entry.id, "bootstrap", self.clock(), plaintext)
                    await self.store.add_key(record)

    async def close(self) -> None:
        await self.store.close()

    def set_defaults(self, defaults: TenantDefaults) -> None:
        """Call on policy reload: tenants that left a field unset follow the new default."""
        self.defaults = defaults
        self._anonymous = None

    # -- failure handling -------------------------------------------------------------------------
    def _on_outage(self, down: bool) -> None:
        if down == (not self.store_up):
            return
        self.store_up = not down
        metrics.STORE_UP.set(0 if down else 1)
        if down:
            log.error("tenant store %s unreachable; failure mode: fail-%s", self.store.kind, self.failure)
        else:
            log.warning("tenant store %s reachable again", self.store.kind)

    @contextmanager
    def _store_errors(self, operation: str) -> Iterator[None]:
        try:
            yield
        except StoreUnavailable:
            metrics.STORE_ERRORS.labels(operation).inc()
            raise ApiError(
                503, "The tenant/quota store is unavailable.", code=ErrorCode.QUOTA_STORE_UNAVAILABLE
            ) from None

    # -- request path -----------------------------------------------------------------------------
    async def authenticate(self, authorization: str | None) -> Tenant:
        """`Authorization: Bearer <key>` → the key's tenant; 401 when missing, unknown or revoked."""
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            metrics.AUTH_FAILURES.labels("missing").inc()
            raise ApiError(
                401, "Missing API key: send 'Authorization: Bearer <key>'.", code=ErrorCode.MISSING_API_KEY
            )
        with self._store_errors("authenticate"):
            record = await self.store.key_by_hash(hash_key(token))
            spec = await self.store.get_tenant(record.tenant_id) if record and not record.revoked else None
        if spec is None:
            metrics.AUTH_FAILURES.labels("invalid").inc()
            raise ApiError(401, "Invalid API key.", code=ErrorCode.INVALID_API_KEY)
        return spec.resolve(self.defaults)

    def anonymous(self) -> Tenant:
        """The tenant used when `auth.required` is false: policy defaults, no quotas."""
        if self._anonymous is None:  # built once per policy: this runs on every unauthenticated request
            self._anonymous = TenantSpec(id="anonymous", name="anonymous").resolve(self.defaults)
        return self._anonymous

    @staticmethod
    def effective_priority(tenant: Tenant, requested: int | None) -> int:
        """The tenant's default when unset; never above the tenant's cap."""
        return min(tenant.default_priority if requested is None else requested, tenant.max_priority)

    @staticmethod
    def check_model(tenant: Tenant, model: str) -> None:
        if tenant.allowed_models and not any(fnmatch.fnmatchcase(model, g) for g in tenant.allowed_models):
            raise ApiError(
                403,
                f"Model {model!r} is not allowed for this key.",
                code=ErrorCode.MODEL_NOT_ALLOWED,
                param="model",
            )

    @staticmethod
    def traffic_class(tenant: Tenant, requested: str | None) -> str:
        """The requested class (tenant default when unset), 403 if the tenant may not use it."""
        cls = requested or tenant.default_class
        if tenant.allowed_classes and cls not in tenant.allowed_classes:
            raise ApiError(
                403,
                f"Traffic class {cls!r} is not allowed for this key.",
                code=ErrorCode.CLASS_NOT_ALLOWED,
                param="class",
            )
        return cls

    async def reserve(
        self, tenant: Tenant, tokens_in: int, tokens_out_expected: int, now: float | None = None
    ) -> Reservation:
        """Take the estimated cost from every limit at once, or raise QuotaExceeded (429)."""
        now = self.clock() if now is None else now
        res = Reservation(uuid.uuid4().hex, tenant, Charge(tokens_in, tokens_out_expected), now)
        try:
            denial = await self.store.reserve(tenant.id, tenant.quotas, res.charge, now, res.id)
        except StoreUnavailable:
            metrics.STORE_ERRORS.labels("reserve").inc()
            if self.failure == "closed":
                raise ApiError(
                    503, "The quota store is unavailable.", code=ErrorCode.QUOTA_STORE_UNAVAILABLE
                ) from None
            res.local = True
            denial = self.local.try_reserve(tenant.id, tenant.quotas, res.charge, now)
            if denial is None:
                metrics.FAIL_OPEN_ADMISSIONS.inc()
        if denial is not None:
            metrics.QUOTA_DENIALS.labels(denial.limit).inc()
            raise QuotaExceeded(tenant, denial)
        return res

    async def minute_levels(self, tenant: Tenant, now: float | None = None) -> dict[str, float]:
        """Read-only: the current level of each per-minute limit the tenant has (the `x-ratelimit-*`
        response headers). Empty when it has none; during a store outage, the local fail-open levels."""
        if not any(getattr(tenant.quotas, name) is not None for name in BUCKET_LIMITS):
            return {}
        now = self.clock() if now is None else now
        try:
            return await self.store.levels(tenant.id, tenant.quotas, now)
        except StoreUnavailable:
            return self.local.levels(tenant.id, tenant.quotas, now)

    async def reconcile(
        self, reservation: Reservation, actual_in: int, actual_out: int, now: float | None = None
    ) -> None:
        """Charge actual usage (an aborted stream: what was generated), return the rest, free the slot.

        Idempotent. `reconcile(r, 0, 0)` releases a reservation whose request never ran."""
        if reservation.settled:
            return
        reservation.settled = True
        now = self.clock() if now is None else now
        args = (
            reservation.tenant.id,
            reservation.tenant.quotas,
            reservation.charge,
            Charge(actual_in, actual_out),
        )
        if reservation.local:
            self.local.settle(*args, reservation.reserved_at, now)
            return
        try:
            await self.store.settle(*args, reservation.reserved_at, now, reservation.id)
        except StoreUnavailable:
            metrics.STORE_ERRORS.labels("reconcile").inc()
            log.warning("reconcile of a reservation lost: tenant store unavailable")

    # -- administration ---------------------------------------------------------------------------
    async def list_tenants(self) -> list[TenantSpec]:
        with self._store_errors("admin"):
            return await self.store.list_tenants()

    async def get_tenant(self, tenant_id: str) -> TenantSpec:
        with self._store_errors("admin"):
            spec = await self.store.get_tenant(tenant_id)
        if spec is None:
            raise ApiError(
                404, f"No tenant {tenant_id!r}.", code=ErrorCode.TENANT_NOT_FOUND, param="tenant_id"
            )
        return spec

    def resolve(self, spec: TenantSpec) -> Tenant:
        return spec.resolve(self.defaults)

    async def create_tenant(self, body: TenantCreate) -> TenantSpec:
        now = self.clock()
        data = body.model_dump(exclude_none=True)
        data.setdefault("quotas", self.defaults.quotas.model_dump())
        spec = TenantSpec.model_validate({**data, "created_at": now, "updated_at": now})
        with self._store_errors("admin"):
            created = await self.store.create_tenant(spec)
        if not created:
            raise ApiError(
                409, f"Tenant {spec.id!r} already exists.", code=ErrorCode.TENANT_EXISTS, param="id"
            )
        log.info("tenant %s created", spec.id)
        return spec

    async def update_tenant(self, tenant_id: str, patch: TenantPatch) -> TenantSpec:
        spec = (await self.get_tenant(tenant_id)).patched(patch, self.clock())
        with self._store_errors("admin"):
            if not await self.store.update_tenant(spec):
                raise ApiError(
                    404, f"No tenant {tenant_id!r}.", code=ErrorCode.TENANT_NOT_FOUND, param="tenant_id"
                )
        log.info("tenant %s updated: %s", tenant_id, sorted(patch.model_fields_set))
        return spec

    async def delete_tenant(self, tenant_id: str) -> None:
        with self._store_errors("admin"):
            deleted = await self.store.delete_tenant(tenant_id)
        if not deleted:
            raise ApiError(
                404, f"No tenant {tenant_id!r}.", code=ErrorCode.TENANT_NOT_FOUND, param="tenant_id"
            )
        log.info("tenant %s deleted", tenant_id)

    async def create_key(self, tenant_id: str, name: str = "") -> tuple[KeyRecord, str]:
        """A new key for the tenant: its record and the plaintext, which is never stored or shown again."""
        await self.get_tenant(tenant_id)
        record, plaintext = new_key(tenant_id, name, self.clock())
        with self._store_errors("admin"):
            await self.store.add_key(record)
        log.info("key %s (%s…) created for tenant %s", record.id, record.prefix, tenant_id)
        return record, plaintext

    async def list_keys(self, tenant_id: str) -> list[KeyRecord]:
        await self.get_tenant(tenant_id)
        with self._store_errors("admin"):
            return await self.store.list_keys(tenant_id)

    async def revoke_key(self, tenant_id: str, key_id: str) -> KeyRecord:
        with self._store_errors("admin"):
            record = await self.store.revoke_key(tenant_id, key_id, self.clock())
        if record is None:
            raise ApiError(
                404,
                f"Tenant {tenant_id!r} has no key {key_id!r}.",
                code=ErrorCode.KEY_NOT_FOUND,
                param="key_id",
            )
        log.info("key %s of tenant %s revoked", key_id, tenant_id)
        return record

    async def usage(self, tenant_id: str, days: int = 7) -> dict[str, Any]:
        """Remaining per-minute capacity, concurrency, today's and this month's budget, per-day history."""
        tenant = self.resolve(await self.get_tenant(tenant_id))
        with self._store_errors("usage"):
            return await usage_report(self.store, tenant, self.clock(), days)
