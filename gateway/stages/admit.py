"""Stage 2: admit a request into a pool — classify it, route it, price it, and reserve its quota.

The ticket leaves this stage with its tenant, class, pool, priority, deadline, cost and bucket set, and
(with auth on) a quota reservation that must reach the finish stage whatever happens next.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
from starlette.requests import Request

from gateway.backends.pool import Pool
from gateway.errors import ApiError, ErrorCode
from gateway.estimate.estimator import Estimator
from gateway.observability import record
from gateway.openai_api import ParsedRequest
from gateway.policy import Policy
from gateway.stages.route import Router
from gateway.tenants.models import Tenant
from gateway.tenants.service import QuotaExceeded, Reservation, TenantService
from gateway.ticket import Ticket

QUOTA_WAIT_MAX_S = 60.0  # a tenant that may wait for its quota never waits for a refill longer than this
# a client deadline only ever tightens the class's; past a week it means nothing, and an unbounded integer
# would overflow the float clock
MAX_DEADLINE_MS = 7 * 24 * 3600 * 1000


def _int_header(request: Request, name: str) -> int | None:
    raw = request.headers.get(name)
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
        self, ticket: Ticket, parsed: ParsedRequest, request: Request, policy: Policy, tenant: Tenant
    ) -> tuple[Pool, Reservation | None]:
        """Classify, price and reserve quota; the returned reservation must reach the finish stage."""
        ticket.tenant = tenant.id
        self.tenants.check_model(tenant, parsed.model)
        requested = request.headers.get("x-omnigate-class")
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
        levels = policy.queue.priorities
        ticket.priority = levels.clamp(
            self.tenants.effective_priority(tenant, _int_header(request, "x-priority"))
        )
        ticket.band = levels.band(ticket.priority)
        ticket.job_id = request.headers.get("x-omnigate-job")
        deadline_ms = _int_header(request, "x-omnigate-deadline-ms")
        if deadline_ms is not None:
            ticket.deadline = ticket.arrival + min(max(0, deadline_ms), MAX_DEADLINE_MS) / 1000
        ticket.cost, ticket.bucket = self.estimator().estimate(
            parsed.body,
            endpoint=parsed.endpoint,
            tenant=tenant.id,
            urls=policy.pool(pool.name).media_urls,
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
        return pool, await self._reserve(ticket, tenant)

    async def _reserve(self, ticket: Ticket, tenant: Tenant) -> Reservation:
        """Reserve the estimate; a tenant allowed to wait is held while a refill still meets its deadline."""
        while True:
            try:
                return await self.tenants.reserve(
                    tenant, ticket.cost.prompt_tokens, ticket.cost.expected_output_tokens
                )
            except QuotaExceeded as e:
                wait = e.retry_after or 0.0
                if not e.wait_allowed or self.clock() + wait >= ticket.deadline or wait > QUOTA_WAIT_MAX_S:
                    raise
                await anyio.sleep(wait)
