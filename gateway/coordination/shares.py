"""What this replica may use of each backend: its leased share, or its fallback share without Redis.

Pure state on an injected clock; the coordinator (coordinator.py) feeds it the allocator's answers and
its failures, the pool schedulers read it on every decision (`granted`). The rules:
- a lease answered at `sent` is good until `sent + ttl` on the local clock (the request's send time, so
  the local lease always ends before Redis's);
- after a failed refresh, or once the lease ran out, the share is min(last grant, L / N) — N the live
  replicas last seen — and, once a whole TTL has passed since the failure (every other replica's lease
  has ended by then, and they hold L / N too), L / N;
- before the first answer: L / `replicas_hint` (the local limit as L).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Lease:
    """The allocator's last answer for one backend."""

    grant: int
    limit: int  # the engine's whole concurrency limit (the owner's value)
    until: float  # local clock
    replicas: int
    peer_kv_tokens: int
    peer_active: int
    owner: bool
    grants: dict[str, int] = field(default_factory=dict)  # replica → grant, every live lease
    target: int = 0  # this replica's part by demand, which its grant reaches as the others' decodes end


class Shares:
    """Per backend URL: the lease, and the share it yields now (`granted`)."""

    def __init__(self, replica: str, ttl_s: float, replicas_hint: int, clock: Callable[[], float]) -> None:
        self.replica = replica
        self.ttl_s = ttl_s
        self.clock = clock
        self.seen_replicas = max(1, replicas_hint)
        self.leases: dict[str, Lease] = {}
        self.failed_at: float | None = None  # the first failed refresh since the last good one
        self.on_want: Callable[[], None] = lambda: None  # the coordinator's early refresh

    def leased(self, url: str, lease: Lease) -> None:
        self.leases[url] = lease
        self.seen_replicas = max(1, lease.replicas)

    def nudge(self) -> None:
        self.on_want()

    def refreshed(self) -> None:
        """A whole refresh succeeded: leave the fallback."""
        self.failed_at = None

    def failed(self, now: float) -> None:
        if self.failed_at is None:
            self.failed_at = now

    @property
    def returning(self) -> bool:
        """The last refresh failed: the allocator must cap everybody at L / N until all are back."""
        return self.failed_at is not None

    def fallback(self, url: str, local_limit: int) -> int:
        """L / N: the share every replica may hold while Redis cannot be asked."""
        lease = self.leases.get(url)
        limit = local_limit if lease is None else lease.limit
        return limit // self.seen_replicas

    def granted(self, url: str, local_limit: int) -> int:
        """The concurrency this replica may use on `url` now (see the module docstring)."""
        now = self.clock()
        lease = self.leases.get(url)
        if lease is not None and self.failed_at is None and now < lease.until:
            return lease.grant
        base = self.fallback(url, local_limit)
        if lease is None:
            return base
        since = self.failed_at if self.failed_at is not None else lease.until
        if now < since + self.ttl_s:
            return min(lease.grant, base)
        return base

    def limit(self, url: str, local_limit: int) -> int:
        """The engine's whole limit: the owner's value while leased, else this replica's own."""
        lease = self.leases.get(url)
        return local_limit if lease is None else lease.limit

    def peer_active(self, url: str) -> int:
        lease = self.leases.get(url)
        return 0 if lease is None else lease.peer_active

    def inbound(self, url: str) -> int:
        """The peers' running requests whose slots come to this replica as they end: all of them while
        its demand is owed more than its grant (by band, the allocator hands every release to the
        highest waiting band first), else none."""
        lease = self.leases.get(url)
        if lease is None or self.failed_at is not None or lease.target <= lease.grant:
            return 0
        return lease.peer_active

    def peer_kv_tokens(self, url: str) -> int:
        lease = self.leases.get(url)
        return 0 if lease is None else lease.peer_kv_tokens

    def follows(self, url: str) -> int | None:
        """The limit to adopt when another replica owns `url`'s adaptive limit (None: we own it)."""
        lease = self.leases.get(url)
        return None if lease is None or lease.owner else lease.limit

    def fraction(self, urls: list[str], limits: dict[str, int]) -> float:
        """Σ shares / Σ engine limits over `urls`: this replica's part of the pool's prefill budget."""
        total = sum(self.limit(u, limits[u]) for u in urls)
        return 1.0 if total <= 0 else min(1.0, sum(self.granted(u, limits[u]) for u in urls) / total)

    def pace(self, urls: list[str], limits: dict[str, int]) -> float:
        """`fraction`, at least 1 / the live replicas: the pace this replica's queue predicts with."""
        return max(self.fraction(urls, limits), 1.0 / self.seen_replicas)

    def describe(self, url: str, local_limit: int) -> dict[str, Any]:
        """The /admin/state view of one backend's shared budget."""
        lease = self.leases.get(url)
        now = self.clock()
        mode = "leased" if lease is not None and self.failed_at is None and now < lease.until else "fallback"
        return {
            "replica": self.replica,
            "mode": mode,
            "engine_limit": self.limit(url, local_limit),
            "share": self.granted(url, local_limit),
            "limit_owner": lease is not None and lease.owner,
            "live_replicas": self.seen_replicas,
            "replica_shares": {} if lease is None else dict(sorted(lease.grants.items())),
            "lease_left_s": None if lease is None else max(0.0, round(lease.until - now, 3)),
            "peer_active": self.peer_active(url),
        }
