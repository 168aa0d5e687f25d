"""AlertManager: the anyio shell around the pure rule engine, failure throttle and sink deliveries.

The app owns the data; the manager only asks for it. Either the app calls `evaluate(inputs)` on its own
timer, or it passes a `provider` callable and the manager pulls a snapshot every evaluation interval.
`notify_failure` and `evaluate` are synchronous and never wait on a sink: they enqueue and return.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import get_args

import anyio
import httpx
from anyio.abc import TaskGroup

from gateway.backends.circuit import CircuitState, Transition
from gateway.observability import metrics as m
from gateway.observability.failures import FailureEvent, FailureThrottle
from gateway.observability.notification import Kind, Notification, Severity
from gateway.observability.rules import AlertInputs, RuleEngine
from gateway.observability.settings import AlertThresholds, RuleName
from gateway.observability.sinks import Deliveries
from gateway.settings.config import AlertsConfig

log = logging.getLogger("omnigate.alerts")


class AlertManager:
    def __init__(
        self,
        config: AlertsConfig,
        thresholds: Callable[[], AlertThresholds],
        *,
        provider: Callable[[], AlertInputs] | None = None,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        backoff_sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        environ: dict[str, str] | None = None,
    ) -> None:
        """`thresholds` is read at every use, so a policy reload applies at the next evaluation."""
        self.config = config
        self._thresholds = thresholds
        self._provider = provider
        self._client = client
        self._owns_client = client is None
        self._clock = clock
        self._wall = wall
        self._backoff_sleep = backoff_sleep
        self._environ = environ
        self._engine = RuleEngine()
        self._failures = FailureThrottle()
        self._deliveries: Deliveries | None = None
        self._pending: deque[Notification] = deque(maxlen=config.queue_size)  # until start() runs sinks
        self._tg: TaskGroup | None = None

    async def __aenter__(self) -> AlertManager:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start delivery and the evaluation loop; call `stop()` from the same task (a lifespan does)."""
        if self._client is None:
            self._client = httpx.AsyncClient()
        self._deliveries = Deliveries(self.config, self._client, self._environ, self._backoff_sleep)
        for n in self._pending:
            self._deliveries.enqueue(n)
        self._pending.clear()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._deliveries.run)
        self._tg.start_soon(self._loop)

    async def stop(self, grace_s: float = 2.0) -> None:
        """Give queued messages up to `grace_s` to go out (a resolved alert is worth waiting for)."""
        if self._tg is None:
            return
        with anyio.move_on_after(grace_s):
            if self._deliveries is not None:
                await self._deliveries.drain()
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        self._tg = None
        if self._owns_client and self._client is not None:
            await self._client.aclose()
            self._client = None

    def _send(self, notes: list[Notification]) -> None:
        if not self.config.enabled:
            return
        for n in notes:
            log.info("alert %s", n.headline)
            if self._deliveries is None:
                self._pending.append(n)
            else:
                self._deliveries.enqueue(n)

    def evaluate(self, inputs: AlertInputs) -> list[Notification]:
        """Run the threshold rules on one snapshot; returns (and enqueues) the messages it produced."""
        notes = self._engine.evaluate(inputs, self._thresholds(), self._clock(), self._wall())
        firing = self._engine.firing()
        for rule in get_args(RuleName):
            m.ALERTS_FIRING.labels(rule).set(firing.get(rule, 0))
        notes += self._failures.flush(self._thresholds(), self._clock(), self._wall())
        self._send(notes)
        return notes

    def notify_circuit(self, t: Transition) -> None:
        """A circuit breaker changed state: one message at once (open: critical; closed: resolved)."""
        messages: dict[CircuitState, tuple[Kind, Severity, str]] = {
            CircuitState.OPEN: ("firing", "critical", f"Circuit open: {t.backend}"),
            CircuitState.HALF_OPEN: ("firing", "warning", f"Circuit half-open: probing {t.backend}"),
            CircuitState.CLOSED: ("resolved", "info", f"Circuit closed: {t.backend}"),
        }
        kind, severity, title = messages[t.new]
        fields = (("pool", t.pool), ("backend", t.backend), ("from", t.old), ("reason", t.reason))
        self._send([Notification(kind, title, severity, fields, rule="circuit", key=t.backend)])

    def notify_failure(self, event: FailureEvent) -> None:
        """A request or job failed: alert now, or fold it into the window's storm summary."""
        self._send(self._failures.offer(event, self._thresholds(), self._clock(), self._wall()))

    def tick(self) -> list[Notification]:
        """Close a finished failure window and send its summary; `evaluate` and the loop do this too."""
        notes = self._failures.flush(self._thresholds(), self._clock(), self._wall())
        self._send(notes)
        return notes

    async def _loop(self) -> None:
        while True:
            await anyio.sleep(self.config.evaluation_interval_s)
            try:
                if self._provider is not None:
                    self.evaluate(self._provider())
                else:
                    self.tick()
            except Exception:
                log.exception("alert evaluation failed; will retry next interval")
