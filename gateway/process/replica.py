"""The composition root of one gateway replica: builds every part once, wires them, runs their loops.

A request's way is one straight line — cli → app → pipeline (gateway/http/pipeline.py) → the stages here:
`authenticate` → `admit` → the pool's scheduler (queue, dispatch) → proxy → `finish`. The stages are small
objects of their own (gateway/stages/); `live` renders state (gauges, alert inputs, /admin/state).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import anyio

from gateway.admission.engine_stages import StageBook
from gateway.admission.scheduler import PoolScheduler
from gateway.admission.settings import AdmissionSettings
from gateway.backends.circuit import CircuitState, Transition
from gateway.backends.kinds.base import BackendKind
from gateway.backends.pool import Pool
from gateway.backends.settings import CircuitPolicy
from gateway.coordination.coordinator import Coordinator
from gateway.coordination.registry import replica_name
from gateway.estimate.estimator import Estimator
from gateway.livepolicy.policy import Policy
from gateway.livepolicy.refs import check_refs
from gateway.livepolicy.reloader import PolicyHolder
from gateway.observability import record
from gateway.observability.accesslog import AccessLog
from gateway.observability.manager import AlertManager
from gateway.observability.rolling import SloTracker
from gateway.process.drain import Drain
from gateway.process.livestate import LiveState
from gateway.settings.config import ConfigError, GatewayConfig
from gateway.stages.admit import Admit
from gateway.stages.authenticate import Authenticate
from gateway.stages.finish import Finish
from gateway.stages.measure import Measure
from gateway.stages.route import Router
from gateway.tenants.service import TenantService

if TYPE_CHECKING:
    from gateway.observability.tracing import Tracing


class Gateway:
    """Config, live policy, tenants, estimator, pools with their schedulers, the stages, SLO and alerts."""

    def __init__(
        self,
        config: GatewayConfig,
        policy: PolicyHolder | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.clock = clock
        self.drain = Drain()
        self.policy = policy or PolicyHolder(config.policy_path)
        current = self.policy.current
        self.served = {p.name: p.models for p in config.pools}
        check_refs(current, self.served, str(self.policy.path or "<policy>"))
        self.admin_token = config.admin.resolve_token()
        self.estimator = Estimator(current.estimation, current.buckets)
        self.name = replica_name()
        self.tenants = TenantService.from_config(
            config.store, config.tenants, current.tenant_defaults, replica=self.name
        )
        self.policy.add_preparer(self._prepare)
        self.weights: dict[str, float] = {}
        self.pools = {
            p.name: Pool(p, clock, self._circuit_settings(p.name), self._circuit_moved) for p in config.pools
        }
        self.schedulers = {
            name: PoolScheduler(
                name,
                pool.backends,
                self._admission_settings,
                clock=clock,
                weight_of=self.weights.get,
                engine_priorities=pool.config.priority_scheduling,
                stages=self._stage_book(name, pool.kind),
            )
            for name, pool in self.pools.items()
        }
        for lender in self._pools_of_class("interactive"):
            for borrower in self._pools_of_class("offline"):
                self.schedulers[borrower].borrow_from(self.schedulers[lender])  # only if the policy lends
        self.router = Router(self.pools.values())
        self.slo = SloTracker(window_s=config.alerts.slo_window_s)
        self.alerts = AlertManager(
            config.alerts, lambda: self.policy.current.alerts, provider=lambda: self.live.alert_inputs()
        )
        self.access = AccessLog(config.access_log_sample_rate) if config.access_log else None
        # the stages, in the order a request meets them
        self.authenticate = Authenticate(self.tenants, config.auth.required, self.weights)
        self.admit = Admit(self.tenants, self.router, self._estimator, config.auth.required, clock)
        measure = Measure(
            self.policy, self.slo, self.alerts, self.access, self._estimator, self._kv_usage, clock
        )
        self.finish = Finish(self.tenants, measure, clock)
        self.live = LiveState(self.policy, self.pools, self.schedulers, self.slo, measure, clock)
        self.coordinator = (
            Coordinator(store.redis_url, store.redis_prefix, config.coordination, self.schedulers, self.name)
            if (store := config.store).kind == "redis" and store.redis_url and config.coordination.enabled
            else None
        )
        self.tracing: Tracing | None = None
        if config.tracing.enabled:
            try:  # the `otel` extra: loaded only when on
                from gateway.observability.tracing import Tracing
            except ImportError as e:
                raise ConfigError(
                    f"tracing.enabled needs the otel extra (pip install 'omnigate[otel]'): {e}"
                ) from None

            self.tracing = Tracing(config.tracing, clock, {p.name: p.kind for p in config.pools})
            self.authenticate = self.tracing.stage("omnigate.authenticate", self.authenticate)
            self.admit = self.tracing.admit(self.admit)
            self.finish = self.tracing.finish(self.finish)
            for pool in self.pools.values():
                pool.upstream = self.tracing.upstream

    def _circuit_settings(self, pool: str) -> Callable[[], CircuitPolicy]:
        return lambda: self.policy.current.pool(pool).circuit

    def _circuit_moved(self, t: Transition) -> None:
        """A breaker changed state: count and alert it, and let waiting requests at a backend that takes
        work again."""
        record.record_circuit(t)
        if self.policy.current.pool(t.pool).circuit.alert:
            self.alerts.notify_circuit(t)
        if t.new != CircuitState.OPEN:
            self.schedulers[t.pool].pump()

    def _stage_book(self, pool: str, kind: BackendKind) -> StageBook | None:
        """Per-stage budgets for a staged kind's backends, from the pool's live budgets policy."""
        if not kind.staged:
            return None
        return StageBook(
            kind, lambda: self.policy.current.admission.budgets.for_pool(pool).stages, self.clock
        )

    def _pools_of_class(self, traffic_class: str) -> list[str]:
        return [name for name, p in self.pools.items() if (p.config.traffic_class or name) == traffic_class]

    def _admission_settings(self) -> AdmissionSettings:
        return self.policy.current.admission

    def _estimator(self) -> Estimator:
        return self.estimator

    def _kv_usage(self, backend: str | None) -> float | None:
        return self.live.kv_usage(backend)

    def _prepare(self, new: Policy) -> Callable[[], None]:
        check_refs(new, self.served, str(self.policy.path or "<policy>"))
        estimator = self.estimator.reconfigure(new.estimation, new.buckets)

        def commit() -> None:
            self.estimator = estimator
            self.tenants.set_defaults(new.tenant_defaults)

        return commit

    async def _gauges_loop(self) -> None:
        while True:
            self.live.export_gauges()
            for sched in self.schedulers.values():
                sched.pump()  # health/scrape changes may have opened room
            await anyio.sleep(1.0)

    # -- lifecycle ------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        await self.tenants.start()
        for pool in self.pools.values():
            await pool.start()
        if self.coordinator is not None:
            await self.coordinator.refresh()  # the first leases before the first request
        try:
            async with self.alerts, anyio.create_task_group() as tg:
                for pool in self.pools.values():
                    tg.start_soon(pool.monitor)
                for sched in self.schedulers.values():
                    tg.start_soon(sched.run)
                tg.start_soon(self._gauges_loop)
                if self.coordinator is not None:
                    tg.start_soon(self.coordinator.run)
                tg.start_soon(self.tenants.run_outbox)
                tg.start_soon(self.tenants.run_store_watch)
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
            if self.tracing is not None:
                await anyio.to_thread.run_sync(self.tracing.shutdown)
