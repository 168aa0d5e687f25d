"""A backend's own budgets besides its slots: the KV watermark and the modality bucket caps, and the
accounting a dispatch holds on the backend until it ends.

- KV: max(scraped used tokens, gateway-reserved tokens) + the request's KV tokens ≤ watermark · the
  backend's max_total_tokens. The scrape lags our own dispatches and the reservation misses what others
  (or our under-estimates) hold, so the larger of the two is the occupancy. Until the first scrape tells
  max_total_tokens the check is off; a request may always go to a backend with nothing active.
- Buckets: a request's modality bucket must be under its cap on the backend (`bucket_caps`). A request
  whose bucket is at cap everywhere is out by its own constraint: the dispatcher skips it (dispatch.py).
The concurrency budget (a slot under the limit, less the band's and the tenant's headroom) is slots.py's.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.admission.blocks import Block
from gateway.admission.decision import Decision
from gateway.admission.families import Ask
from gateway.admission.settings import PoolBudgets
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket


def kv_occupied(backend: BackendState) -> int:
    """KV tokens the backend holds: the larger of the scrape and the gateway's own reservations."""
    scraped = backend.used_tokens
    if scraped is None and backend.token_usage is not None and backend.max_total_tokens is not None:
        scraped = int(backend.token_usage * backend.max_total_tokens)
    return max(scraped or 0, backend.reserved_kv_tokens + backend.peer_kv_tokens)


def kv_miss(ticket: Ticket, backend: BackendState, budgets: PoolBudgets) -> Block | None:
    """The KV watermark when `ticket`'s KV tokens would lift the backend above its watermark, else None."""
    total = backend.max_total_tokens
    if total is None or backend.active == 0:
        return None
    if kv_occupied(backend) + ticket.cost.total_tokens > budgets.kv_watermark * total:
        return Block.KV_WATERMARK
    return None


def bucket_full(ticket: Ticket, backend: BackendState, budgets: PoolBudgets) -> bool:
    """Is `ticket`'s modality bucket at its cap on `backend`?"""
    return _at_cap(ticket.bucket, backend, budgets)


def _at_cap(bucket: str, backend: BackendState, budgets: PoolBudgets) -> bool:
    cap = budgets.bucket_caps.get(bucket)
    return cap is not None and backend.bucket_active.get(bucket, 0) >= cap


def full_buckets(backends: Iterable[BackendState], budgets: PoolBudgets) -> frozenset[str]:
    """The buckets at their cap on every available backend: their requests wait for their own bucket,
    and the queue's predictions let the others pass them (queue.Ahead); none without a backend."""
    usable = [b for b in backends if b.available]
    if not usable:
        return frozenset()
    full = []
    for bucket, cap in budgets.bucket_caps.items():  # loops, not nested generators: asked on every arrival
        for b in usable:
            if b.bucket_active.get(bucket, 0) < cap:
                break
        else:
            full.append(bucket)
    return frozenset(full)


def own_backends(
    ticket: Ticket, exclude: frozenset[str], usable: Iterable[BackendState], budgets: PoolBudgets
) -> list[BackendState]:
    """The usable backends the request's own constraints allow: not excluded, its bucket under its cap."""
    return [b for b in usable if b.url not in exclude and not bucket_full(ticket, b, budgets)]


def backend_load(backend: BackendState, limit: int, budgets: PoolBudgets) -> float:
    """How full a backend is, 0..1+: the larger of active / limit and KV occupancy / watermark."""
    load = backend.active / limit
    if backend.max_total_tokens:
        load = max(load, kv_occupied(backend) / (budgets.kv_watermark * backend.max_total_tokens))
    return load


class Occupancy:
    """A dispatch's hold on the backend's own accounting (a slot, its tokens, its KV, its bucket) and the
    KV watermark it is judged by: a `Budget` (families.py)."""

    lasting = True

    def miss(self, ask: Ask, backend: BackendState, ctx: Decision) -> Block | None:
        return kv_miss(ask.ticket, backend, ctx.budgets)

    def commit(self, ask: Ask, backend: BackendState, ctx: Decision) -> None:
        occupy(backend, ask.ticket)

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        vacate(backend, ticket)


def occupy(backend: BackendState, ticket: Ticket) -> None:
    """Hold `ticket`'s share of the backend: a slot, its tokens, its KV, its bucket."""
    cost = ticket.cost
    backend.active += 1
    backend.outstanding_tokens += cost.total_tokens
    backend.reserved_kv_tokens += cost.total_tokens
    backend.bucket_active[ticket.bucket] = backend.bucket_active.get(ticket.bucket, 0) + 1


def vacate(backend: BackendState, ticket: Ticket) -> None:
    """Give back exactly what `occupy` held."""
    cost = ticket.cost
    backend.active -= 1
    backend.outstanding_tokens -= cost.total_tokens
    backend.reserved_kv_tokens -= cost.total_tokens
    left = backend.bucket_active[ticket.bucket] - 1
    if left:
        backend.bucket_active[ticket.bucket] = left
    else:
        del backend.bucket_active[ticket.bucket]
