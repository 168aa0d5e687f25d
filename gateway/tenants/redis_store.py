"""Shared store for several replicas: tenants, key hashes, token buckets and the ledger in Redis.

Each replica caches tenants and keys it has read; every admin write publishes the changed id on one
channel and every replica drops that entry on receipt (well under a second). When the subscription
breaks, the cache is cleared on reconnect, since messages may have been missed. A read that started
before an invalidation is not cached (generation check), so a stale value cannot outlive the message.

Any connection failure raises StoreUnavailable, an error answer (out of memory, read-only, loading)
StoreUnusable; after one, the store does not touch Redis again for `retry_interval` seconds (so a dead
Redis costs nothing per request), then tries again by itself. A lost subscription clears nothing at once:
the entries cached before it stay usable while Redis cannot be asked (so a key that worked keeps working
across a reconnect), and are dropped once Redis answers again. `check` (every second) beats this
replica's heartbeat, counts the live replicas and notices a Redis that forgot its data (the `seeded` key
is gone).
Concurrency slots are leases: a replica renews its open ones every lease/3 seconds, so a crashed
replica's slots expire instead of leaking.

The request path's calls (key and tenant loads, reserve, levels, settle) each wait at most `deadline_s`
(store.deadline_s, 50 ms): a call that misses it raises StoreSlow (it is left to finish in the
background) and marks the store slow; from then on
those calls are refused at once (nothing is sent) until a background probe — a PING every
`PROBE_INTERVAL_S` — answers within the deadline again. A reserve given up on may still land in Redis: its
id is kept among the leases (renewed if it did land), and the fail-open record of the request reconciles
it instead of counting the request twice (redis_scripts.RECORD). Calls made off the request path — the
periodic check, seeding, the admin API, outbox replays (`Store.patient`) — wait for the socket timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import typing
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from functools import partial
from typing import Any, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.coordination import registry
from gateway.tenants import metrics
from gateway.tenants.failopen import Known
from gateway.tenants.models import KeyRecord, Quotas, TenantSpec
from gateway.tenants.quota import (
    BUCKET_LIMITS,
    Charge,
    Denial,
    LedgerRow,
    day_of,
    month_of,
    seconds_to_next_day,
    seconds_to_next_month,
)
from gateway.tenants.redis_batch import ScriptBatch
from gateway.tenants.redis_scripts import LEVELS, RECORD, RESERVE, SETTLE
from gateway.tenants.store import Health, Store, StoreSlow, StoreState, StoreUnavailable, StoreUnusable

log = logging.getLogger("omnigate.tenants.redis")
T = TypeVar("T")
OUTAGE_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
LEDGER_TTL_S = 400 * 86400
BUCKET_TTL_S = 3600
# How long a reservation's applied mark is kept: a first reconcile's for an hour (the retry of one whose
# answer was lost comes within seconds of Redis answering again; a mark per request costs memory), a
# replay's for two days (replays are few, and may repeat after a restart).
FIRST_MARK_TTL_S = 3600
REPLAY_MARK_TTL_S = 2 * 86400
_PATIENT: ContextVar[bool] = ContextVar("patient", default=False)  # see Store.patient
PROBE_INTERVAL_S = 0.1
"""How often a slow store is probed; it is slow at least this long after it missed a deadline."""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _limit(value: int | None) -> int:
    return -1 if value is None else value


class RedisStore(Store):
    kind = "redis"

    def __init__(
        self,
        url: str,
        prefix: str = "omnigate:",
        *,
        clock: Callable[[], float] = time.time,
        retry_interval: float = 1.0,
        lease_s: float = 120.0,
        socket_timeout: float = 2.0,
        max_connections: int = 64,
        replica: str | None = None,
        deadline_s: float = 0.05,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.clock = clock
        self.retry_interval = retry_interval
        self.lease_s = lease_s
        self.socket_timeout = socket_timeout
        self.deadline_s = deadline_s
        self.slow = False  # a request-path call missed its deadline and no probe has answered in time since
        self._probe: asyncio.Task[None] | None = None
        self.channel = prefix + "changes"
        self.replica_id = replica or registry.replica_name()
        # A blocking pool: a burst of admissions waits for a free connection instead of failing. A command
        # on a broken connection (a pooled one Redis dropped when it restarted) is sent once more on a new
        # one — every call here may be repeated (redis_scripts.py) — so a restart costs no request a 503.
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
            socket_timeout=socket_timeout,
            retry_on_error=[RedisConnectionError],
        )
        self.redis: aioredis.Redis = aioredis.Redis(connection_pool=pool)
        self._reserve = self.redis.register_script(RESERVE)
        self._settle = self.redis.register_script(SETTLE)
        self._levels = self.redis.register_script(LEVELS)
        self._record = self.redis.register_script(RECORD)
        self._beat = self.redis.register_script(registry.BEAT)
        self._batch = ScriptBatch(self.redis)  # the per-request scripts, one pipeline per loop turn
        self._tenants: dict[str, TenantSpec] = {}
        self._keys: dict[str, KeyRecord] = {}
        # what was cached before the subscription broke: served only while Redis cannot be asked
        self._stale_tenants: dict[str, TenantSpec] = {}
        self._stale_keys: dict[str, KeyRecord] = {}
        self._known: dict[str, Known] = {}
        self._generation = 0
        self._leases: dict[str, str] = {}
        self._down_until = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self.subscribed = asyncio.Event()
        self.on_state: Callable[[StoreState], None] = lambda state: None

    # -- plumbing ---------------------------------------------------------------------------------
    def _tenant_key(self, tenant_id: str) -> str:
        return f"{self.prefix}tenant:{tenant_id}"

    def _quota_keys(self, tenant_id: str, ts: float) -> list[str]:
        base = f"{self.prefix}q:{{{tenant_id}}}:"
        return [base + "bucket", base + "conc", base + "day:" + day_of(ts), base + "month:" + month_of(ts)]

    def _mark_key(self, tenant_id: str, reservation_id: str) -> str:
        return f"{self.prefix}q:{{{tenant_id}}}:applied:{reservation_id}"

    async def _call(self, op: Callable[[], Awaitable[T]], bounded: str | None = None) -> T:
        """Run one Redis operation; `bounded` names a request-path operation, which waits at most the
        deadline and is not sent while the store is slow."""
        if time.monotonic() < self._down_until:
            raise StoreUnavailable("redis unavailable (backing off)", sent=False)
        if bounded is None or _PATIENT.get():
            return await self._run(op)
        if self.slow:
            raise StoreSlow("redis slow: waiting for it to answer within its deadline", sent=False)
        # A task of its own, not cancelled at the deadline: a reply read in the loop turn the deadline
        # fired in (a busy loop runs both at once) still counts, and a call that does miss it is left to
        # finish rather than cut mid-reply (which would cost its connection).
        call = asyncio.ensure_future(self._run(op))
        call.add_done_callback(_retrieve)
        await asyncio.wait((call,), timeout=self.deadline_s)
        if not call.done():
            await asyncio.sleep(0)
        if call.done():
            return call.result()
        metrics.STORE_DEADLINE_MISSES.labels(bounded).inc()
        self._mark_slow()
        raise StoreSlow(f"redis did not answer {bounded} within {self.deadline_s * 1000:.0f} ms")

    async def _run(self, op: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await op()
        except OUTAGE_ERRORS as e:
            self._failed(StoreUnavailable(f"redis unavailable: {type(e).__name__}"))
        except ResponseError as e:
            self._failed(StoreUnusable(f"redis refused: {e}"))
        self.on_state("slow" if self.slow else "up")
        return result

    @contextlib.contextmanager
    def patient(self) -> Iterator[None]:
        token = _PATIENT.set(True)
        try:
            yield
        finally:
            _PATIENT.reset(token)

    def _mark_slow(self) -> None:
        if not self.slow:
            self.slow = True
            self.on_state("slow")
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_until_quick())

    async def _probe_until_quick(self) -> None:
        """PING until Redis answers within the deadline; then the request path uses it again."""
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            started = time.monotonic()
            try:
                await self.redis.ping()
            except OUTAGE_ERRORS:
                self.on_state("down")
                continue
            except ResponseError:
                self.on_state("unusable")
                continue
            if time.monotonic() - started <= self.deadline_s:
                self.slow = False
                self._down_until = 0.0
                self.on_state("up")
                return

    def _failed(self, error: StoreUnavailable) -> typing.NoReturn:
        self._down_until = time.monotonic() + self.retry_interval
        self.on_state(error.state)
        raise error from None

    async def _publish(self, kind: str, ident: str) -> None:
        self._invalidate(kind, ident)
        message = orjson.dumps({"src": self.replica_id, kind: ident})
        await self._call(lambda: self.redis.publish(self.channel, message))

    def _invalidate(self, kind: str, ident: str) -> None:
        self._generation += 1
        if kind == "tenant":
            self._tenants.pop(ident, None)
            self._stale_tenants.pop(ident, None)
            for keys in (self._keys, self._stale_keys):
                for key_hash in [h for h, r in keys.items() if r.tenant_id == ident]:
                    del keys[key_hash]
        else:
            self._keys.pop(ident, None)
            self._stale_keys.pop(ident, None)

    def _clear_caches(self) -> None:
        """Messages may have been missed: keep what was cached for use only while Redis is unreachable."""
        self._generation += 1
        self._stale_tenants.update(self._tenants)
        self._stale_keys.update(self._keys)
        self._tenants.clear()
        self._keys.clear()

    async def start(self) -> None:
        """Start the subscription and lease renewal; wait briefly for the subscription so that nothing is
        cached before it (a Redis that is down at start only delays this by the socket timeout)."""
        self._tasks = [asyncio.create_task(self._listen()), asyncio.create_task(self._renew_leases())]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.subscribed.wait(), self.socket_timeout)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await self.redis.aclose()

    async def _listen(self) -> None:
        """Keep one subscription alive; every message drops one cache entry. Its loss is logged once."""
        lost = False
        while True:
            pubsub = self.redis.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                self._clear_caches()
                self._down_until = 0.0  # Redis answers: the request path need not wait out its back-off
                self.subscribed.set()
                if lost:
                    log.warning("tenant change subscription restored")
                    lost = False
                while True:
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None and msg.get("type") == "message":
                        change = orjson.loads(msg["data"])
                        if change.pop("src", None) != self.replica_id:  # our own writes invalidated already
                            for kind, ident in change.items():
                                self._invalidate(kind, ident)
            except (*OUTAGE_ERRORS, ResponseError) as e:
                self.subscribed.clear()
                if not lost:
                    log.warning("tenant change subscription lost (%s); retrying", type(e).__name__)
                    lost = True
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(*OUTAGE_ERRORS, ResponseError):
                    await pubsub.aclose()

    async def _renew_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            until = self.clock() + self.lease_s
            by_key: dict[str, dict[str, float]] = {}
            for rid, tenant_id in self._leases.items():
                by_key.setdefault(self._quota_keys(tenant_id, 0)[1], {})[rid] = until
            with contextlib.suppress(StoreUnavailable):
                for key, leases in by_key.items():
                    await self._call(partial(self.redis.zadd, key, leases, xx=True))

    async def _cached(
        self, cache: dict[str, Any], stale: dict[str, Any], ident: str, load: Callable[[], Awaitable[Any]]
    ) -> Any:
        if ident in cache:
            return cache[ident]
        generation = self._generation
        try:
            value = await self._call(load, "lookup")
        except StoreUnavailable:
            if ident in stale:  # cached before the subscription broke; Redis cannot say otherwise now
                return stale[ident]
            raise
        stale.pop(ident, None)
        if value is not None and generation == self._generation:
            cache[ident] = value
        return value

    # -- tenants and keys -------------------------------------------------------------------------
    async def _load_tenant(self, tenant_id: str) -> TenantSpec | None:
        raw = await self.redis.get(self._tenant_key(tenant_id))
        return TenantSpec.model_validate_json(raw) if raw else None

    async def list_tenants(self) -> list[TenantSpec]:
        async def load() -> list[TenantSpec]:
            ids = sorted(_text(m) for m in await self.redis.smembers(self.prefix + "tenants"))
            raws = await self.redis.mget([self._tenant_key(i) for i in ids]) if ids else []
            return [TenantSpec.model_validate_json(r) for r in raws if r]

        return await self._call(load)

    async def get_tenant(self, tenant_id: str) -> TenantSpec | None:
        spec: TenantSpec | None = await self._cached(
            self._tenants, self._stale_tenants, tenant_id, lambda: self._load_tenant(tenant_id)
        )
        return spec

    async def create_tenant(self, spec: TenantSpec) -> bool:
        async def write() -> bool:
            if not await self.redis.set(self._tenant_key(spec.id), spec.model_dump_json(), nx=True):
                return False
            await self.redis.sadd(self.prefix + "tenants", spec.id)
            return True

        created = await self._call(write)
        if created:
            await self._publish("tenant", spec.id)
        return created

    async def update_tenant(self, spec: TenantSpec) -> bool:
        updated = await self._call(
            lambda: self.redis.set(self._tenant_key(spec.id), spec.model_dump_json(), xx=True)
        )
        if updated:
            await self._publish("tenant", spec.id)
        return bool(updated)

    async def delete_tenant(self, tenant_id: str) -> bool:
        async def delete() -> bool:
            if not await self.redis.delete(self._tenant_key(tenant_id)):
                return False
            keys_set = f"{self.prefix}keys:{tenant_id}"
            hashes = [_text(h) for h in await self.redis.smembers(keys_set)]
            await self.redis.delete(keys_set, *(f"{self.prefix}key:{h}" for h in hashes))
            await self.redis.srem(self.prefix + "tenants", tenant_id)
            await self.redis.delete(*self._quota_keys(tenant_id, 0)[:2])
            return True

        deleted = await self._call(delete)
        if deleted:
            await self._publish("tenant", tenant_id)
        return deleted

    async def _put_key(self, record: KeyRecord) -> None:
        async def write() -> None:
            await self.redis.set(f"{self.prefix}key:{record.key_hash}", record.model_dump_json())
            await self.redis.sadd(f"{self.prefix}keys:{record.tenant_id}", record.key_hash)

        await self._call(write)
        await self._publish("key", record.key_hash)

    async def add_key(self, record: KeyRecord) -> None:
        await self._put_key(record)

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        async def load() -> KeyRecord | None:
            raw = await self.redis.get(f"{self.prefix}key:{key_hash}")
            return KeyRecord.model_validate_json(raw) if raw else None

        record: KeyRecord | None = await self._cached(self._keys, self._stale_keys, key_hash, load)
        return record

    async def list_keys(self, tenant_id: str) -> list[KeyRecord]:
        async def load() -> list[KeyRecord]:
            hashes = [_text(h) for h in await self.redis.smembers(f"{self.prefix}keys:{tenant_id}")]
            raws = await self.redis.mget([f"{self.prefix}key:{h}" for h in hashes]) if hashes else []
            return sorted((KeyRecord.model_validate_json(r) for r in raws if r), key=lambda k: k.created_at)

        return await self._call(load)

    async def revoke_key(self, tenant_id: str, key_id: str, now: float) -> KeyRecord | None:
        record = next((k for k in await self.list_keys(tenant_id) if k.id == key_id), None)
        if record is None or record.revoked:
            return record
        revoked = record.model_copy(update={"revoked_at": now})
        await self._put_key(revoked)
        return revoked

    # -- quota counters ---------------------------------------------------------------------------
    async def reserve(
        self, tenant_id: str, quotas: Quotas, charge: Charge, now: float, reservation_id: str
    ) -> Denial | None:
        args: list[str | int | float] = [
            repr(now),
            charge.input_tokens,
            charge.output_tokens,
            *(_limit(getattr(quotas, name)) for name in BUCKET_LIMITS[:4]),
            _limit(quotas.max_concurrent),
            _limit(quotas.daily_tokens),
            _limit(quotas.monthly_tokens),
            reservation_id,
            repr(now + self.lease_s),
            repr(seconds_to_next_day(now)),
            repr(seconds_to_next_month(now)),
            LEDGER_TTL_S,
            BUCKET_TTL_S,
            charge.audio_ms,
            _limit(quotas.audio_spm),
            _limit(quotas.daily_audio_seconds and quotas.daily_audio_seconds * 1000),
            _limit(quotas.monthly_audio_seconds and quotas.monthly_audio_seconds * 1000),
        ]
        keys = [*self._quota_keys(tenant_id, now), self._mark_key(tenant_id, reservation_id)]
        try:
            result = await self._call(lambda: self._batch.call(self._reserve, keys, args), "reserve")
        except StoreUnavailable as e:
            if e.sent:  # it may land yet: its slot is renewed until the fail-open record reconciles it
                self._leases[reservation_id] = tenant_id
            raise
        if int(result[0]) == 1:
            self._leases[reservation_id] = tenant_id
            levels = {n: float(v) for n, v in zip(BUCKET_LIMITS, result[1:6], strict=True) if v}
            if levels or int(result[6]):  # a retry's answer carries no state
                self._known[tenant_id] = Known(
                    levels, int(result[6]), int(result[7]), now, int(result[8]), int(result[9])
                )
            return None
        return Denial(result[1].decode(), float(result[2]))

    def known(self, tenant_id: str) -> Known | None:
        return self._known.get(tenant_id)

    # -- health -----------------------------------------------------------------------------------
    async def check(self, now: float) -> Health:
        """Beat, count live replicas, and see whether Redis still holds what was seeded."""

        async def probe() -> tuple[int, bool]:
            live = await registry.beat(self._beat, self.prefix + registry.REGISTRY, self.replica_id)
            return live, not await self.redis.exists(self.prefix + "seeded")

        self._down_until = 0.0  # the check is what notices a recovery: it never waits out the back-off
        try:
            live, emptied = await self._call(probe)
        except StoreUnavailable as e:
            return Health(e.state)
        if emptied:  # nothing cached is true any more
            self._clear_caches()
            self._stale_tenants.clear()
            self._stale_keys.clear()
        return Health("slow" if self.slow else "up", live, emptied)

    async def mark_seeded(self) -> None:
        await self._call(lambda: self.redis.set(self.prefix + "seeded", "1"))

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
        args = _reconcile_args(quotas, reserved, actual, now, reservation_id, replay)
        self._leases.pop(reservation_id, None)
        keys = [*self._quota_keys(tenant_id, reserved_at), self._mark_key(tenant_id, reservation_id)]
        await self._call(lambda: self._batch.call(self._settle, keys, args), "settle")

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
        keys = [*self._quota_keys(tenant_id, ts), self._mark_key(tenant_id, reservation_id)]
        args = [*_reconcile_args(quotas, reserved, usage, now, reservation_id, True), LEDGER_TTL_S, requests]
        await self._call(lambda: self._record(keys=keys, args=args))
        self._leases.pop(reservation_id, None)

    async def _levels_and_active(self, tenant_id: str, quotas: Quotas, now: float) -> list[Any]:
        args: list[str | int | float] = [
            repr(now),
            *(_limit(getattr(quotas, name)) for name in BUCKET_LIMITS),
        ]
        keys = self._quota_keys(tenant_id, now)[:2]
        result: list[Any] = await self._call(lambda: self._batch.call(self._levels, keys, args), "levels")
        return result

    async def levels(self, tenant_id: str, quotas: Quotas, now: float) -> dict[str, float]:
        raw = await self._levels_and_active(tenant_id, quotas, now)
        return {name: float(v) for name, v in zip(BUCKET_LIMITS, raw[:5], strict=True) if v}

    async def active_count(self, tenant_id: str, now: float) -> int:
        return int((await self._levels_and_active(tenant_id, Quotas(), now))[5])

    async def ledger(
        self, tenant_id: str, days: list[str], month: str
    ) -> tuple[dict[str, LedgerRow], LedgerRow]:
        base = f"{self.prefix}q:{{{tenant_id}}}:"

        async def load() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            for day in days:
                pipe.hmget(base + "day:" + day, "in", "out", "req", "aud")
            pipe.hmget(base + "month:" + month, "in", "out", "req", "aud")
            return list(await pipe.execute())

        raw = await self._call(load)
        rows = {
            d: LedgerRow(*(int(v or 0) for v in r))
            for d, r in zip(days, raw, strict=False)
            if r[2] is not None
        }
        return rows, LedgerRow(*(int(v or 0) for v in raw[-1]))


def _retrieve(call: asyncio.Future[Any]) -> None:
    """A call given up on may fail later: its error is the failure mode's already, not one to report."""
    if not call.cancelled():
        call.exception()


def _reconcile_args(
    quotas: Quotas, reserved: Charge, actual: Charge, now: float, reservation_id: str, replay: bool
) -> list[str | int | float]:
    """The arguments of redis_scripts.SETTLE (and the first ones of RECORD)."""
    return [
        repr(now),
        reserved.input_tokens,
        reserved.output_tokens,
        actual.input_tokens,
        actual.output_tokens,
        *(_limit(getattr(quotas, name)) for name in BUCKET_LIMITS[:3]),
        reservation_id,
        REPLAY_MARK_TTL_S if replay else FIRST_MARK_TTL_S,
        reserved.audio_ms,
        actual.audio_ms,
        _limit(quotas.audio_spm),
    ]
