"""Stage 2: admit a request into a pool — classify it, route it, price it, and reserve its quota.

A route the pool's servers lack is refused as soon as the pool is known: before pricing, the quota and the
queue, so such a request takes nothing from the tenant and never waits.

The ticket leaves this stage with its tenant, class, pool, priority, deadline, cost, bucket and (for a
generation) its prompt's chunk chain for the prefix indexes set, and
(with auth on) a quota reservation that must reach the finish stage whatever happens next.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import anyio
from starlette.requests import Request

from gateway.backends.pool import Pool
from gateway.backends.prefix_key import prefix_key
from gateway.estimate.estimator import Estimator
from gateway.estimate.speech import voice_of
from gateway.livepolicy.policy import Policy
from gateway.observability import record
from gateway.request.errors import ApiError, ErrorCode
from gateway.request.openai_api import ParsedRequest
from gateway.request.ticket import Ticket
from gateway.stages.route import Router
from gateway.tenants.models import Tenant
from gateway.tenants.ratelimit_headers import ratelimit_headers
from gateway.tenants.service import QuotaExceeded, Reservation, TenantService

QUOTA_WAIT_MAX_S = 60.0  # a tenant that may wait for its quota never waits for a refill longer than this
# a client deadline only ever tightens the class's; past a week it means nothing, and an unbounded integer
# would overflow the float clock
MAX_DEADLINE_MS = 7 * 24 * 3600 * 1000


def _priority_header(raw: str | None, levels: Mapping[str, int]) -> int | None:
    """`x-priority`: an integer, or one of the policy's level names (`queue.priorities.levels`)."""
    if raw is None:
        return None
    name = raw.strip()
    if name in levels:
        return levels[name]
    try:
        return int(name)
    except ValueError:
        names = ", ".join(sorted(levels, key=levels.__getitem__, reverse=True))
        raise ApiError(
            400,
            f"Header 'x-priority' must be an integer or a priority level name ({names}).",
            param="x-priority",
            code=ErrorCode.INVALID_HEADER,
        ) from None


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ApiError(
            400, f"Header '{name}' must be an integer.", param=name, code=ErrorCode.INVALID_HEADER
        ) from None


class Admit:
    def __init__(
        self,
        tenants: TenantService,
        router: Router,
        estimator: Callable[[], Estimator],
        reserve_quota: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.tenants = tenants
        self.router = router
        self.estimator = estimator  # the live one: a policy reload replaces it
        self.reserve_quota = reserve_quota
        self.clock = clock

    async def __call__(
        self,
        ticket: Ticket,
        parsed: ParsedRequest,
        request: Request,
        policy: Policy,
        tenant: Tenant,
        path: str,
    ) -> tuple[Pool, Reservation | None]:
        """Classify, route (refusing a `path` the pool's servers lack), price and reserve quota; the
        returned reservation must reach the finish stage."""
        ticket.tenant = tenant.id
        served = policy.model_aliases.get(parsed.model)
        if served is not None:  # the engines know the served name only
            parsed.body["model"] = parsed.model = ticket.model = served
        self.tenants.check_model(tenant, parsed.model)
        headers = request.headers  # one dict lookup each (IndexedHeaders, http/asgi.py)
        requested = headers.get("x-omnigate-class")
        traffic_class = self.tenants.traffic_class(tenant, requested)
        if traffic_class not in policy.queue.classes:
            raise ApiError(
                400,
                f"Unknown traffic class '{traffic_class}'.",
                param="x-omnigate-class",
                code=ErrorCode.INVALID_TRAFFIC_CLASS,
            )
        ticket.traffic_class = traffic_class
        pool = self.router.route(parsed.model, traffic_class, policy)
        ticket.pool = pool.name
        pool.kind.check_route(path, parsed.model)
        levels = policy.queue.priorities
        asked = _priority_header(headers.get("x-priority"), levels.levels)
        ticket.priority = levels.clamp(self.tenants.effective_priority(tenant, asked))
        ticket.band = levels.band(ticket.priority)
        ticket.job_id = headers.get("x-omnigate-job")
        deadline_ms = _int_header(headers, "x-omnigate-deadline-ms")
        if deadline_ms is not None:
            ticket.deadline = ticket.arrival + min(max(0, deadline_ms), MAX_DEADLINE_MS) / 1000
        ticket.cost, ticket.bucket = self.estimator().estimate(
            parsed.body,
            endpoint=parsed.endpoint,
            tenant=tenant.id,
            urls=policy.pool(pool.name).media_urls,
        )
        ticket.voice = voice_of(parsed.body, parsed.endpoint)
        if parsed.endpoint in ("chat", "completions"):
            ticket.prefix = prefix_key(
                parsed.body,
                parsed.endpoint,
                ticket.cost,
                policy.budgets.for_pool(pool.name).placement.chunk_chars,
                headers.get("x-session-id"),
            )
        record.record_priced(ticket)
        if not pool.ready():
            raise ApiError(
                503,
                f"No healthy backend available in pool '{pool.name}'.",
                code=ErrorCode.NO_HEALTHY_BACKEND,
                retry_after=1,
            )
        if not self.reserve_quota:
            return pool, None
        reservation = await self._reserve(ticket, tenant)
        ticket.rate_limits = await self._rate_limits(tenant, reservation.reserved_at)
        return pool, reservation

    async def _reserve(self, ticket: Ticket, tenant: Tenant) -> Reservation:
        """Reserve the estimate; a tenant allowed to wait is held while a refill still meets its deadline."""
        while True:
            try:
                return await self.tenants.reserve(
                    tenant,
                    ticket.cost.prompt_tokens,
                    ticket.cost.expected_output_tokens,
                    audio_seconds=ticket.cost.speech_seconds,
                )
            except QuotaExceeded as e:
                wait = e.retry_after or 0.0
                if not e.wait_allowed or self.clock() + wait >= ticket.deadline or wait > QUOTA_WAIT_MAX_S:
                    e.headers.update(await self._rate_limits(tenant))
                    raise
                await anyio.sleep(wait)

    async def _rate_limits(self, tenant: Tenant, at: float | None = None) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for the tenant's per-minute limits, as they stand `at` (the
        reservation's moment; default now)."""
        return ratelimit_headers(tenant.quotas, await self.tenants.minute_levels(tenant, at))
