"""Everything one gateway replica holds, and the request's stages that need it.

The pipeline (gateway/pipeline.py) calls these in order: authenticate → admit (classify, estimate, quota)
→ scheduler.acquire (queue, dispatch) → proxy → finish (release, reconcile, learn, measure, log, alert).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.requests import Request

from gateway.admission.scheduler import PoolScheduler
from gateway.backends.pool import Pool
from gateway.config import GatewayConfig
from gateway.errors import CAPACITY_REJECTIONS, ApiError, ErrorCode, rejection_reason
from gateway.estimate.estimator import Estimator
from gateway.observability import metrics, record
from gateway.observability.accesslog import AccessLog
from gateway.observability.failures import FailureEvent
from gateway.observability.manager import AlertManager
from gateway.observability.rolling import SloTracker
from gateway.observability.rules import AlertInputs
from gateway.openai_api import ParsedRequest
from gateway.policy import Policy
from gateway.reloader import PolicyHolder
from gateway.tenants.models import Tenant
from gateway.tenants.service import QuotaExceeded, Reservation, TenantService
from gateway.ticket import FAILED_OUTCOMES, Outcome, Ticket

log = logging.getLogger("omnigate")


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


class Gateway:
    """Config, live policy, tenants, estimator, pools with their schedulers, SLO tracking and alerting."""

    def __init__(
        self,
        config: GatewayConfig,
        policy: PolicyHolder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock
        self.policy = policy or PolicyHolder(config.policy_path)
        current = self.policy.current
        self.admin_token = config.admin.resolve_token()
        self.estimator = Estimator(current.estimation, current.buckets)
        self.tenants = TenantService.from_config(config.store, config.tenants, current.tenant_defaults)
        self.policy.add_preparer(self._prepare)
        self.weights: dict[str, float] = {}
        self.pools = {p.name: Pool(p, clock=clock) for p in config.pools}
        self.schedulers = {
            name: PoolScheduler(
                name,
                pool.backends,
                self.policy,
                clock=clock,
                weight_of=self.weights.get,
                engine_priorities=pool.config.priority_scheduling,
            )
            for name, pool in self.pools.items()
        }
        for lender in self._pools_of_class("interactive"):
            for borrower in self._pools_of_class("offline"):
                self.schedulers[lender].lend_to(self.schedulers[borrower])  # used only if policy enables it
        self.models: dict[str, list[Pool]] = {}
        for pool in self.pools.values():
            for model in pool.config.models:
                self.models.setdefault(model, []).append(pool)
        self.slo = SloTracker(window_s=config.alerts.slo_window_s)
        self.alerts = AlertManager(
            config.alerts, lambda: self.policy.current.alerts, provider=self.alert_inputs
        )
        self.access = AccessLog(config.access_log_sample_rate) if config.access_log else None
        self.answered = 0
        self.rejected = 0

    def _pools_of_class(self, traffic_class: str) -> list[str]:
        return [name for name, p in self.pools.items() if (p.config.traffic_class or name) == traffic_class]

    def _prepare(self, new: Policy) -> Callable[[], None]:
        estimator = self.estimator.reconfigure(new.estimation, new.buckets)

        def commit() -> None:
            self.estimator = estimator
            self.tenants.set_defaults(new.tenant_defaults)

        return commit

    # -- stages ---------------------------------------------------------------------------------------
    async def authenticate(self, request: Request) -> Tenant:
        if not self.config.auth.required:
            return self.tenants.anonymous()
        tenant = await self.tenants.authenticate(request.headers.get("authorization"))
        self.weights[tenant.id] = tenant.weight
        return tenant

    def route(self, model: str, traffic_class: str, policy: Policy) -> Pool:
        pools = self.models.get(model)
        if not pools:
            raise ApiError(
                404, f"The model `{model}` does not exist.", param="model", code=ErrorCode.MODEL_NOT_FOUND
            )
        wanted = policy.queue.classes[traffic_class].pool or traffic_class
        for pool in pools:
            if pool.name == wanted or pool.config.traffic_class == traffic_class:
                return pool
        return pools[0]

    async def admit(
        self, ticket: Ticket, parsed: ParsedRequest, request: Request, policy: Policy, tenant: Tenant
    ) -> tuple[Pool, Reservation | None]:
        """Classify, price and reserve quota; the returned reservation must reach `finish`."""
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
        pool = self.route(parsed.model, traffic_class, policy)
        ticket.pool = pool.name
        ticket.priority = self.tenants.effective_priority(tenant, _int_header(request, "x-priority"))
        ticket.job_id = request.headers.get("x-omnigate-job")
        deadline_ms = _int_header(request, "x-omnigate-deadline-ms")
        if deadline_ms is not None:
            ticket.deadline = ticket.arrival + max(0, deadline_ms) / 1000
        ticket.cost, ticket.bucket = self.estimator.estimate(
            parsed.body, endpoint=parsed.endpoint, tenant=tenant.id
        )
        record.record_priced(ticket)
        if not pool.ready():
            raise ApiError(
                503,
                f"No healthy backend available in pool '{pool.name}'.",
                code=ErrorCode.NO_HEALTHY_BACKEND,
                retry_after=1,
            )
        if not self.config.auth.required:
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
                if not e.wait_allowed or self.clock() + wait >= ticket.deadline or wait > 60:
                    raise
                await anyio.sleep(wait)

    async def finish(
        self, ticket: Ticket, reservation: Reservation | None, status: int, error: str | None
    ) -> None:
        """Everything that happens once per request, whatever its outcome; never raises."""
        if ticket.finished_at is None:
            ticket.finished_at = self.clock()
        if ticket.outcome == Outcome.PENDING:
            ticket.outcome = Outcome.OK
        usage = ticket.usage
        try:
            if reservation is not None:
                with anyio.CancelScope(shield=True):
                    await self.tenants.reconcile(
                        reservation,
                        usage.prompt_tokens if usage else 0,
                        usage.completion_tokens if usage else 0,
                    )
            self._measure(ticket, status, error)
        except Exception:
            log.exception("finishing request %s failed", ticket.id)

    def _measure(self, ticket: Ticket, status: int, error: str | None) -> None:
        self.answered += 1
        slo = self.policy.current.queue.classes.get(ticket.traffic_class)
        ttft_slo = slo.ttft_p99_s if slo else None
        tpot_slo = slo.tpot_p99_s if slo else None
        if ticket.outcome in (Outcome.REJECTED, Outcome.CLIENT_ERROR):
            reason = rejection_reason(status, ticket.error_code)
            record.record_rejection(ticket, reason)
            self.rejected += 1
            if reason in CAPACITY_REJECTIONS:
                self.slo.observe(
                    ticket.traffic_class,
                    self.clock(),
                    ttft=None,
                    tpot=None,
                    ttft_slo=ttft_slo,
                    tpot_slo=tpot_slo,
                    failed=True,
                )
        else:
            lat = record.record_finished(ticket)
            if ticket.outcome != Outcome.CANCELLED:
                self.slo.observe(
                    ticket.traffic_class,
                    self.clock(),
                    ttft=lat.ttft,
                    tpot=lat.tpot,
                    ttft_slo=ttft_slo,
                    tpot_slo=tpot_slo,
                    failed=ticket.outcome in FAILED_OUTCOMES,
                )
            if ticket.outcome == Outcome.OK and ticket.usage is not None:
                self.estimator.observe(ticket.tenant, ticket.bucket, ticket.usage.completion_tokens)
        if ticket.outcome == Outcome.CANCELLED and ticket.pool:
            metrics.CLIENT_DISCONNECTS.labels(ticket.pool).inc()
        if ticket.outcome in FAILED_OUTCOMES:
            event = FailureEvent.from_ticket(
                ticket, ticket.error_status or status, error or ticket.outcome, self._kv_usage(ticket)
            )
            self.alerts.notify_failure(event)
        if self.access is not None:
            self.access.log(ticket, status)

    def _kv_usage(self, ticket: Ticket) -> float | None:
        """The KV watermark of the backend that served the ticket (possibly lent by another pool)."""
        for pool in self.pools.values():
            for b in pool.backends:
                if b.name == ticket.backend:
                    return b.token_usage
        return None

    def client_headers(self, ticket: Ticket) -> dict[str, str]:
        return {
            "x-omnigate-pool": ticket.pool,
            "x-omnigate-backend": ticket.backend or "",
            "x-omnigate-queue-ms": f"{ticket.queue_seconds * 1000:.1f}",
            "x-omnigate-bucket": ticket.bucket,
            "x-omnigate-priority": str(ticket.priority),
            "x-omnigate-estimated-tokens": str(ticket.cost.total_tokens),
        }

    # -- live state -----------------------------------------------------------------------------------
    def alert_inputs(self) -> AlertInputs:
        policy = self.policy.current
        targets = {c: (s.ttft_p99_s, s.tpot_p99_s) for c, s in policy.queue.classes.items()}
        return AlertInputs.build(
            queue_depth={name: len(s.queue) for name, s in self.schedulers.items()},
            backends=[b for pool in self.pools.values() for b in pool.backends],
            slo_stats=self.slo.snapshot(self.clock()).values(),
            slo_targets=targets,
            answered_total=self.answered,
            rejected_total=self.rejected,
        )

    def export_gauges(self) -> None:
        """Refresh the gauges that describe state rather than events (called every second)."""
        policy = self.policy.current
        for name, sched in self.schedulers.items():
            snap = sched.snapshot()
            for band in policy.queue.priorities.levels.values():
                depth = int(snap["queue_by_priority"].get(str(band), 0))
                record.record_queue(name, band, depth, snap["oldest_wait_by_priority"].get(str(band), 0.0))
            record.record_window(name, snap["window_s"])
        record.record_backends(b for pool in self.pools.values() for b in pool.backends)
        targets = {c: (s.ttft_p99_s, s.tpot_p99_s) for c, s in policy.queue.classes.items()}
        record.record_slo(self.slo.snapshot(self.clock()).values(), targets)

    def state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pools": {}}
        for name, pool in self.pools.items():
            snap = self.schedulers[name].snapshot()
            for entry, b in zip(snap["backends"], pool.backends, strict=True):
                entry.update(
                    backend=b.name,
                    healthy=b.healthy,
                    circuit=b.circuit,
                    token_usage=b.token_usage,
                    running=b.running_reqs,
                    queued=b.queue_reqs,
                )
            out["pools"][name] = snap
        return out

    async def _gauges_loop(self) -> None:
        while True:
            self.export_gauges()
            for sched in self.schedulers.values():
                sched.pump()  # health/scrape changes may have opened room
            await anyio.sleep(1.0)

    # -- lifecycle ------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        await self.tenants.start()
        for pool in self.pools.values():
            await pool.start()
        try:
            async with self.alerts, anyio.create_task_group() as tg:
                for pool in self.pools.values():
                    tg.start_soon(pool.monitor)
                for sched in self.schedulers.values():
                    tg.start_soon(sched.run)
                tg.start_soon(self._gauges_loop)
                if self.config.watch_policy:
                    tg.start_soon(self.policy.watch_file)
                tg.start_soon(self.policy.watch_sighup)
                # Start-up objects live for the process: keep the cyclic GC from rescanning them forever.
                gc.collect()
                gc.freeze()
                yield
                tg.cancel_scope.cancel()
        finally:
            for pool in self.pools.values():
                await pool.close()
            await self.tenants.close()
