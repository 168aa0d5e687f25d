"""Least-outstanding-requests selection among healthy backends, with lease-based accounting.

A Lease is the request's claim on a backend; releasing it (exactly once) returns every slot it held.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.backends.pool import Pool
from gateway.backends.state import BackendState
from gateway.errors import ApiError
from gateway.observability import metrics
from gateway.ticket import Ticket, Usage


class Lease:
    __slots__ = ("_pool", "_released", "backend", "ticket")

    def __init__(self, pool: Pool, backend: BackendState, ticket: Ticket) -> None:
        self._pool = pool
        self.backend = backend
        self.ticket = ticket
        self._released = False
        backend.active += 1
        backend.outstanding_tokens += ticket.cost.total_tokens
        metrics.BACKEND_ACTIVE.labels(pool.name, pool.backend_id(backend)).set(backend.active)

    def release(
        self,
        usage: Usage | None = None,
        outcome: str = "ok",
        ttft_s: float | None = None,
        tpot_s: float | None = None,
    ) -> None:
        if self._released:
            return
        self._released = True
        self.backend.active -= 1
        self.backend.outstanding_tokens -= self.ticket.cost.total_tokens
        metrics.BACKEND_ACTIVE.labels(self._pool.name, self._pool.backend_id(self.backend)).set(
            self.backend.active
        )


def pick(backends: Iterable[BackendState], exclude: frozenset[str] | set[str]) -> BackendState | None:
    best: BackendState | None = None
    for b in backends:
        if b.url in exclude or not b.available:
            continue
        if b.circuit == "half_open" and b.active > 0:
            continue  # one probe at a time while half-open
        if best is None or (b.active, b.outstanding_tokens) < (best.active, best.outstanding_tokens):
            best = b
    return best


class LeastOutstanding:
    """The pool's dispatcher when no queueing is configured: pick now or fail with 503."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def acquire(self, ticket: Ticket, *, exclude: frozenset[str] | set[str] = frozenset()) -> Lease:
        backend = pick(self.pool.backends, exclude)
        if backend is None:
            raise ApiError(
                503,
                f"No healthy backend available in pool '{self.pool.name}'.",
                code="no_healthy_backend",
                retry_after=1,
            )
        return Lease(self.pool, backend, ticket)
