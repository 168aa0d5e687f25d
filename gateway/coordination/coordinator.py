"""The replica's side of the shared budgets: heartbeat, lease refresh, limit ownership, clean leave.

Every `refresh_s` (sooner when a scheduler nudges: requests wait), one pipelined round trip runs the
allocator (scripts.ALLOCATE) once per backend with this replica's demand there — per band, the requests
it runs on that backend plus those its pool queues — its active count, its reserved KV and its own
adaptive limit. The answers become the leases `Shares` serves to the schedulers; the peers' active count
and reserved KV go onto the backend's state (the limit's in-flight signal, the KV check). A replica that
does not own a backend's limit follows the owner's value (PoolScheduler._sync_limits). A failed round trip
puts `Shares` into its fallback; the first good one after it tells the allocator it is returning.
The same round trip adds each pool's changes of the tenants' virtual token counters to their sums over
the replicas and reads the sums back (scripts.VTC), so the queues order tenants by their service from
every replica.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import anyio
import orjson
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.admission.replica_shares import SharedPool
from gateway.backends.state import BackendState
from gateway.coordination.registry import REGISTRY
from gateway.coordination.scripts import ALLOCATE, LEAVE, RECENT, VTC
from gateway.coordination.shares import Lease, Shares
from gateway.settings.config import CoordinationConfig

log = logging.getLogger("omnigate.coordination")
OUTAGE_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)
NUDGE_GAP_S = 0.05
"""Least time between two refreshes that nudges asked for."""


class Coordinator:
    def __init__(
        self,
        redis_url: str,
        prefix: str,
        config: CoordinationConfig,
        schedulers: Mapping[str, SharedPool],
        replica: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.schedulers = schedulers
        self.clock = clock
        self.prefix = prefix + "coord:"
        self.registry = prefix + REGISTRY
        self.shares = Shares(replica, config.lease_ttl_s, config.replicas_hint, clock)
        self.shares.on_want = self.nudge
        timeout = config.redis_timeout_s
        self.redis: aioredis.Redis = aioredis.Redis.from_url(
            redis_url, socket_timeout=timeout, socket_connect_timeout=timeout
        )
        self._allocate = self.redis.register_script(ALLOCATE)
        self._leave = self.redis.register_script(LEAVE)
        self._vtc = self.redis.register_script(VTC)
        self._recent = self.redis.register_script(RECENT)
        self._wake = anyio.Event()
        self._last = -float("inf")
        for sched in schedulers.values():
            sched.share(self.shares)

    def nudge(self) -> None:
        self._wake.set()

    def _key(self, url: str) -> str:
        return f"{self.prefix}b:{url}"

    async def refresh(self) -> None:
        """One allocation per backend and one sum of the tenants' counters per pool, in one round trip;
        on failure, the fallback (`Shares.failed`) and the counters' changes kept for the next one."""
        ttl_ms = int(self.config.lease_ttl_s * 1000)
        shares = self.shares
        calls: list[tuple[SharedPool, BackendState]] = []
        taken = {name: sched.take_fairness() for name, sched in self.schedulers.items()}
        sent = self.clock()
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for name, f in taken.items():
                    await self._vtc(keys=[f"{self.prefix}vtc:{name}"], args=_pairs(f.counters), client=pipe)
                    decay: list[str | int] = [int(f.window_s * 1000), *_pairs(f.recent)]
                    await self._recent(keys=[f"{self.prefix}recent:{name}"], args=decay, client=pipe)
                for sched in self.schedulers.values():
                    shield_top = sched.shield_top()
                    for b in sched.backends:
                        limit = sched.local_limit(b.url)
                        reserve, top = sched.top_reserve(limit)
                        demand = sched.demand(b.url)
                        args: list[str | int | bytes] = [
                            shares.replica,
                            ttl_ms,
                            limit,
                            b.active,
                            b.reserved_kv_tokens,
                            shares.seen_replicas,
                            1 if shares.returning else 0,
                            orjson.dumps([[band, n] for band, n in demand.items() if n > 0]),
                            reserve,
                            top,
                            "" if shield_top is None else repr(shield_top),
                        ]
                        await self._allocate(keys=[self._key(b.url), self.registry], args=args, client=pipe)
                        calls.append((sched, b))
                sent = self.clock()
                answers = await pipe.execute()
        except OUTAGE_ERRORS as e:
            for name, f in taken.items():
                self.schedulers[name].restore_fairness(f)
            if not shares.returning:
                log.warning("coordination: redis unreachable (%s); each replica holds 1/N", type(e).__name__)
            shares.failed(sent)
            return
        if shares.returning:
            log.warning("coordination: redis reachable again; leases resume")
        until = sent + self.config.lease_ttl_s
        sums, leases = answers[: 2 * len(taken)], answers[2 * len(taken) :]
        for i, (name, f) in enumerate(taken.items()):
            self.schedulers[name].merge_fairness(f, _floats(sums[2 * i]), _floats(sums[2 * i + 1]))
        peer_ranks: dict[SharedPool, list[float]] = {}  # the peers' top ranks over the pool's backends
        for (sched, backend), answer in zip(calls, leases, strict=True):
            grant, limit, live, peer_kv, peer_active, owner, target, peer_rank, *pairs = answer
            ranks = peer_ranks.setdefault(sched, [])
            if peer_rank:  # "": no peer dispatched lately
                ranks.append(float(_text(peer_rank)))
            grants = {_text(pairs[i]): int(pairs[i + 1]) for i in range(0, len(pairs), 2)}
            shares.leased(
                backend.url,
                Lease(
                    int(grant),
                    int(limit),
                    until,
                    int(live),
                    int(peer_kv),
                    int(peer_active),
                    owner == 1,
                    grants,
                    int(target),
                ),
            )
            backend.peer_active = int(peer_active)
            backend.peer_kv_tokens = int(peer_kv)
        for sched, ranks in peer_ranks.items():
            sched.peers_shield(max(ranks, default=None), until)
        shares.refreshed()
        for sched in self.schedulers.values():
            sched.pump()  # a grown share may let waiting requests go

    async def run(self) -> None:
        """Refresh every `refresh_s`, or soon after a nudge; until cancelled, then leave."""
        try:
            while True:
                self._last = self.clock()
                await self.refresh()
                self._wake = anyio.Event()
                with anyio.move_on_after(self.config.refresh_s):
                    await self._wake.wait()
                    await anyio.sleep(max(0.0, self._last + NUDGE_GAP_S - self.clock()))
        finally:
            with anyio.CancelScope(shield=True):
                await self.leave()

    async def leave(self) -> None:
        """Give the leases back at once (a clean stop); the registry forgets this replica."""
        keys = [self._key(b.url) for s in self.schedulers.values() for b in s.backends]
        with contextlib.suppress(*OUTAGE_ERRORS), anyio.move_on_after(self.config.redis_timeout_s):
            await self._leave(keys=[*keys, self.registry], args=[self.shares.replica])
        with contextlib.suppress(*OUTAGE_ERRORS):
            await self.redis.aclose()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _pairs(values: dict[str, float]) -> list[str]:
    """A tenant → value map as the scripts' flat argument list (`Fairness`'s parts)."""
    return [x for tenant, value in values.items() for x in (tenant, repr(value))]


def _floats(flat: list[bytes]) -> dict[str, float]:
    return {_text(flat[i]): float(flat[i + 1]) for i in range(0, len(flat), 2)}
