"""TenantService: the one object the gateway talks to for identity, access, quotas and tenant admin.

Request path: authenticate → check_access → effective_priority → reserve → (request runs) → reconcile.
It applies policy defaults to stored tenants, turns store outages into the configured failure mode
(fail-open: local in-memory limits; fail-closed: 503), never loses a charge (what the store cannot take
goes to the outbox and is replayed until applied) and keeps every plaintext key out of logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import anyio
from pydantic import Field, ValidationError

from gateway.request.errors import ApiError, ErrorCode
from gateway.settings.config import StoreConfig
from gateway.settings.schema import describe
from gateway.tenants import failopen, metrics
from gateway.tenants.memory_store import MemoryStore
from gateway.tenants.models import (
    KeyRecord,
    Quotas,
    Tenant,
    TenantCreate,
    TenantPatch,
    TenantSpec,
    hash_key,
    new_key,
)
from gateway.tenants.outbox import Entry, Outbox
from gateway.tenants.quota import BUCKET_LIMITS, LIMIT_TEXT, Charge, Denial, QuotaBook, audio_ms
from gateway.tenants.settings import TenantDefaults
from gateway.tenants.store import Health, Store, StoreState, StoreUnavailable
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
    # the store's reserve was sent and not answered (a deadline, a broken connection): it may land yet
    abandoned: bool = False


def build_store(
    config: StoreConfig, clock: Callable[[], float] = time.time, replica: str | None = None
) -> Store:
    """The store named by gateway.yaml's `store.kind`; `replica` names this process in a shared one."""
    if config.kind == "memory":
        return MemoryStore()
    if config.kind == "sqlite":
        from gateway.tenants.sqlite_store import SQLiteStore

        return SQLiteStore(config.path)
    if not config.redis_url:
        raise ValueError("store.redis_url is required when store.kind is redis")
    from gateway.tenants.redis_store import RedisStore

    return RedisStore(
        config.redis_url, config.redis_prefix, clock=clock, replica=replica, deadline_s=config.deadline_s
    )


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
        outbox: Outbox | None = None,
    ) -> None:
        self.store = store
        self.outbox = outbox or Outbox()
        self._replay_failed: set[str] = set()  # outbox entries whose failure was logged already
        self.defaults = defaults or TenantDefaults()
        self._anonymous: Tenant | None = None
        # tenant id → (the stored spec, the defaults, the Tenant they resolve to): the stores hand out the
        # same spec object until it changes, so a request resolves (a pydantic build) only after a change
        self._resolved: dict[str, tuple[TenantSpec, TenantDefaults, Tenant]] = {}
        self.failure = failure
        self.clock = clock
        self.bootstrap = bootstrap or []
        self.local = QuotaBook()
        self._local_quotas: dict[str, Quotas] = {}  # each tenant's fail-open share in this outage
        self.store_state: StoreState = "up"
        self.replicas = 1  # live replicas sharing the store, as its last check saw them
        self._bootstrap_hashes = {hash_key(k) for entry in self.bootstrap for k in entry.keys}
        self._checking = asyncio.Lock()
        if hasattr(store, "on_state"):
            store.on_state = self._on_state

    @classmethod
    def from_config(
        cls,
        store: StoreConfig,
        bootstrap: Sequence[Mapping[str, Any]] = (),
        defaults: TenantDefaults | None = None,
        clock: Callable[[], float] = time.time,
        replica: str | None = None,
    ) -> TenantService:
        """The service on the store `store` names (with its failure mode), seeding the `bootstrap` tenants."""
        return cls(
            build_store(store, clock, replica),
            defaults=defaults,
            failure=store.redis_failure,
            clock=clock,
            bootstrap=parse_bootstrap(bootstrap),
            outbox=Outbox(store.outbox_file()),
        )

    async def start(self) -> None:
        await self.outbox.open()
        await self.store.start()
        try:
            await self._bootstrap()
        except StoreUnavailable:
            log.error("bootstrap tenants not applied: tenant store %s unreachable", self.store.kind)

    @property
    def store_up(self) -> bool:
        return self.store_state == "up"

    async def _bootstrap(self) -> None:
        with self.store.patient():
            await self._seed()

    async def _seed(self) -> None:
        for entry in self.bootstrap:
            if await self.store.get_tenant(entry.id) is None:
                try:
                    await self.create_tenant(TenantCreate.model_validate(entry.model_dump(exclude={"keys"})))
                except ApiError as e:  # another replica (a worker started beside this one) seeded it first
                    if e.code != ErrorCode.TENANT_EXISTS:
                        raise
            for plaintext in entry.keys:
                if await self.store.key_by_hash(hash_key(plaintext)) is None:
                    record, _ = new_key(entry.id, "bootstrap", self.clock(), plaintext)
                    await self.store.add_key(record)
        await self.store.mark_seeded()

    async def _reseed(self) -> None:
        """The store forgot its data (a Redis restarted without persistence): seed the config's tenants
        and keys again. Tenants created through the admin API are gone with it; an operator restores them."""
        metrics.STORE_RESEEDS.inc()
        log.error(
            "tenant store %s lost its data: %d configured tenants seeded again; tenants created through "
            "the admin API must be restored",
            self.store.kind,
            len(self.bootstrap),
        )
        await self._bootstrap()

    async def check_store(self) -> Health:
        """Check the store once: its state, the live replicas, and whether it forgot its data — then the
        configured tenants and keys are seeded again at once."""
        async with self._checking:
            health = await self.store.check(self.clock())
            if health.state in ("up", "slow"):
                self.replicas = health.replicas
                if health.emptied:
                    with contextlib.suppress(StoreUnavailable):
                        await self._reseed()
        self._on_state(health.state)
        return health

    async def run_store_watch(self, interval: float = 1.0) -> None:
        """`check_store` every `interval` seconds (forever; cancel to stop)."""
        while True:
            await self.check_store()
            await anyio.sleep(interval)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        """Whether this replica can serve as far as the store goes, and what /readyz shows of it: not
        when the store answers but refuses (it looks up but is not usable), nor when it is down and the
        failure mode is closed (every request would get 503)."""
        state = self.store_state
        ready = state == "up" or (state in ("down", "slow") and self.failure == "open")
        body = {"state": state, "failure_mode": self.failure, "replicas": self.replicas}
        return ready, body

    def admin_view(self) -> dict[str, Any]:
        """`/admin/state`'s store: what /readyz shows, the kind, the request path's deadline on a shared
        store (state `slow` while it is missed) and the charges the outbox still owes it."""
        return {
            "kind": self.store.kind,
            **self.readiness()[1],
            "deadline_s": getattr(self.store, "deadline_s", None),
            "outbox_pending": len(self.outbox.pending),
        }

    async def close(self) -> None:
        await self.store.close()
        await self.outbox.close()

    def set_defaults(self, defaults: TenantDefaults) -> None:
        """Call on policy reload: tenants that left a field unset follow the new default."""
        self.defaults = defaults
        self._anonymous = None

    # -- failure handling -------------------------------------------------------------------------
    def _on_state(self, state: StoreState) -> None:
        """A store call or check found the store `state`: each change is logged once and counted."""
        if state == self.store_state:
            return
        was, self.store_state = self.store_state, state
        metrics.STORE_UP.set(1 if state == "up" else 0)
        metrics.STORE_SLOW.set(1 if state == "slow" else 0)
        if state == "up":
            log.warning("tenant store %s usable again (was %s)", self.store.kind, was)
            return
        if was == "up":  # a new outage: fail-open shares start again from the last known state
            self.local = QuotaBook()
            self._local_quotas.clear()
        what = {
            "down": "unreachable",
            "slow": "slower than its deadline (probed until it answers in time)",
            "unusable": "reachable but refusing calls",
        }[state]
        log.error("tenant store %s %s; failure mode: fail-%s", self.store.kind, what, self.failure)

    def _local(self, tenant: Tenant) -> Quotas:
        """The tenant's fail-open limits on this replica (gateway/tenants/failopen.py), seeded on first use
        in an outage."""
        quotas = self._local_quotas.get(tenant.id)
        if quotas is None:
            known = self.store.known(tenant.id)
            quotas = self._local_quotas[tenant.id] = failopen.share(tenant.quotas, self.replicas, known)
            failopen.seed(self.local, tenant.id, self.replicas, known)
        return quotas

    @contextmanager
    def _store_errors(self, operation: str) -> Iterator[None]:
        try:
            yield
        except StoreUnavailable as e:
            metrics.STORE_ERRORS.labels(operation).inc()
            raise _unavailable(e) from None

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
        key_hash = hash_key(token)
        with self._store_errors("authenticate"):
            record = await self.store.key_by_hash(key_hash)
            if record is None and key_hash in self._bootstrap_hashes:  # the store may have forgotten it
                await self.check_store()  # seeds it again if so
                record = await self.store.key_by_hash(key_hash)
            spec = await self.store.get_tenant(record.tenant_id) if record and not record.revoked else None
        if spec is None:
            metrics.AUTH_FAILURES.labels("invalid").inc()
            raise ApiError(401, "Invalid API key.", code=ErrorCode.INVALID_API_KEY)
        cached = self._resolved.get(spec.id)
        if cached is not None and cached[0] is spec and cached[1] is self.defaults:
            return cached[2]
        tenant = spec.resolve(self.defaults)
        self._resolved[spec.id] = (spec, self.defaults, tenant)
        return tenant

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
        self,
        tenant: Tenant,
        tokens_in: int,
        tokens_out_expected: int,
        now: float | None = None,
        audio_seconds: float = 0.0,
    ) -> Reservation:
        """Take the estimated cost (tokens, and the audio seconds an answer is expected to speak) from
        every limit at once, or raise QuotaExceeded (429)."""
        now = self.clock() if now is None else now
        charge = Charge(tokens_in, tokens_out_expected, audio_ms(audio_seconds))
        res = Reservation(os.urandom(16).hex(), tenant, charge, now)
        try:
            denial = await self.store.reserve(tenant.id, tenant.quotas, res.charge, now, res.id)
        except StoreUnavailable as e:
            metrics.STORE_ERRORS.labels("reserve").inc()
            res.local, res.abandoned = True, e.sent
            if self.failure == "closed":
                await self._release(res)
                raise _unavailable(e) from None
            denial = self.local.try_reserve(tenant.id, self._local(tenant), res.charge, now)
            if denial is None:
                metrics.FAIL_OPEN_ADMISSIONS.inc()
            else:
                await self._release(res)
        if denial is not None:
            metrics.QUOTA_DENIALS.labels(denial.limit).inc()
            raise QuotaExceeded(tenant, denial)
        return res

    async def _release(self, res: Reservation) -> None:
        """A request refused after its reserve was sent and not answered: should that reserve land, the
        outbox's record takes it back (it counts nothing)."""
        if res.abandoned:
            res.settled = True
            entry = Entry(
                "release",
                res.id,
                res.tenant.id,
                res.tenant.quotas,
                res.charge,
                Charge(),
                res.reserved_at,
                res.reserved_at,
            )
            await self._owe(entry, "a reserve given up on")

    async def minute_levels(self, tenant: Tenant, now: float | None = None) -> dict[str, float]:
        """Read-only: the current level of each per-minute limit the tenant has (the `x-ratelimit-*`
        response headers). Empty when it has none; during a store outage, the local fail-open levels."""
        if not any(getattr(tenant.quotas, name) is not None for name in BUCKET_LIMITS):
            return {}
        now = self.clock() if now is None else now
        try:
            return await self.store.levels(tenant.id, tenant.quotas, now)
        except StoreUnavailable:
            return self.local.levels(tenant.id, self._local(tenant), now)

    async def reconcile(
        self,
        reservation: Reservation,
        actual_in: int,
        actual_out: int,
        now: float | None = None,
        audio_seconds: float = 0.0,
    ) -> None:
        """Charge actual usage (tokens and the audio seconds delivered), return the rest, free the slot.
        Never raises: what the store cannot take now goes to the outbox (retried by `run_outbox`); usage
        admitted under local limits (fail-open) is settled locally and queued there for the store's
        ledger.

        Idempotent. `reconcile(r, 0, 0)` releases a reservation whose request never ran."""
        if reservation.settled:
            return
        reservation.settled = True
        now = self.clock() if now is None else now
        tenant, actual = reservation.tenant, Charge(actual_in, actual_out, audio_ms(audio_seconds))
        entry = Entry(
            "usage" if reservation.local else "settle",
            reservation.id,
            tenant.id,
            tenant.quotas,
            reservation.charge,
            actual,
            reservation.reserved_at,
            now,
        )
        if reservation.local:
            self.local.settle(
                tenant.id, self._local(tenant), reservation.charge, actual, reservation.reserved_at, now
            )
            await self._owe(entry, "admitted under local limits")
            return
        try:
            await self._apply(entry, replay=False)
        except Exception as e:  # whatever the store's failure, the charge is kept
            metrics.STORE_ERRORS.labels("reconcile").inc()
            await self._owe(entry, f"{type(e).__name__}: {e}")

    async def _apply(self, entry: Entry, replay: bool) -> None:
        """Give the store one charge: a reconcile, or a fail-open admission's usage for its ledger."""
        if entry.kind != "settle":
            await self.store.record_usage(
                entry.tenant_id,
                entry.quotas,
                entry.reserved,
                entry.actual,
                entry.reserved_at,
                entry.now,
                entry.reservation_id,
                requests=1 if entry.kind == "usage" else 0,
            )
            return
        await self.store.settle(
            entry.tenant_id,
            entry.quotas,
            entry.reserved,
            entry.actual,
            entry.reserved_at,
            entry.now,
            entry.reservation_id,
            replay=replay,
        )

    async def _owe(self, entry: Entry, why: str) -> None:
        if not self.outbox.pending:  # the first of a run: logged once, not per request
            log.warning("ledger outbox: tenant store %s cannot take charges now (%s)", self.store.kind, why)
        await self.outbox.put(entry)

    async def replay_outbox(self) -> int:
        """Apply the outbox's charges, oldest first, until the store refuses one for being unavailable;
        returns how many were applied."""
        applied = 0
        for entry in list(self.outbox.pending.values()):
            try:
                with self.store.patient():
                    await self._apply(entry, replay=True)
            except StoreUnavailable:
                break
            except Exception:
                if entry.reservation_id not in self._replay_failed:
                    self._replay_failed.add(entry.reservation_id)
                    log.exception("ledger outbox: replaying a charge of tenant %s failed", entry.tenant_id)
                continue
            self._replay_failed.discard(entry.reservation_id)
            await self.outbox.done(entry)
            applied += 1
        if applied and not self.outbox.pending:
            log.warning("ledger outbox: drained, %d charges applied to %s", applied, self.store.kind)
        return applied

    async def run_outbox(self, interval: float = 1.0) -> None:
        """Replay the outbox every `interval` seconds while it holds anything (forever; cancel to stop)."""
        while True:
            if self.outbox.pending:
                await self.replay_outbox()
            await anyio.sleep(interval)

    # -- administration ---------------------------------------------------------------------------
    async def list_tenants(self) -> list[TenantSpec]:
        with self._store_errors("admin"), self.store.patient():
            return await self.store.list_tenants()

    async def get_tenant(self, tenant_id: str) -> TenantSpec:
        with self._store_errors("admin"), self.store.patient():
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
        with self._store_errors("admin"), self.store.patient():
            created = await self.store.create_tenant(spec)
        if not created:
            raise ApiError(
                409, f"Tenant {spec.id!r} already exists.", code=ErrorCode.TENANT_EXISTS, param="id"
            )
        log.info("tenant %s created", spec.id)
        return spec

    async def update_tenant(self, tenant_id: str, patch: TenantPatch) -> TenantSpec:
        spec = (await self.get_tenant(tenant_id)).patched(patch, self.clock())
        with self._store_errors("admin"), self.store.patient():
            if not await self.store.update_tenant(spec):
                raise ApiError(
                    404, f"No tenant {tenant_id!r}.", code=ErrorCode.TENANT_NOT_FOUND, param="tenant_id"
                )
        log.info("tenant %s updated: %s", tenant_id, sorted(patch.model_fields_set))
        return spec

    async def delete_tenant(self, tenant_id: str) -> None:
        with self._store_errors("admin"), self.store.patient():
            deleted = await self.store.delete_tenant(tenant_id)
        if not deleted:
            raise ApiError(
                404, f"No tenant {tenant_id!r}.", code=ErrorCode.TENANT_NOT_FOUND, param="tenant_id"
            )
        self._resolved.pop(tenant_id, None)
        log.info("tenant %s deleted", tenant_id)

    async def create_key(self, tenant_id: str, name: str = "") -> tuple[KeyRecord, str]:
        """A new key for the tenant: its record and the plaintext, which is never stored or shown again."""
        await self.get_tenant(tenant_id)
        record, plaintext = new_key(tenant_id, name, self.clock())
        with self._store_errors("admin"), self.store.patient():
            await self.store.add_key(record)
        log.info("key %s (%s…) created for tenant %s", record.id, record.prefix, tenant_id)
        return record, plaintext

    async def list_keys(self, tenant_id: str) -> list[KeyRecord]:
        await self.get_tenant(tenant_id)
        with self._store_errors("admin"), self.store.patient():
            return await self.store.list_keys(tenant_id)

    async def revoke_key(self, tenant_id: str, key_id: str) -> KeyRecord:
        with self._store_errors("admin"), self.store.patient():
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
        with self._store_errors("usage"), self.store.patient():
            return await usage_report(self.store, tenant, self.clock(), days)


def _unavailable(error: StoreUnavailable) -> ApiError:
    """The 503 of a request the store could not serve (fail-closed, or an admin or key lookup)."""
    if error.state == "slow":
        message = "The tenant/quota store is not answering within its deadline; retry shortly."
    else:
        message = "The tenant/quota store is unavailable."
    return ApiError(503, message, code=ErrorCode.QUOTA_STORE_UNAVAILABLE, retry_after=1.0)
