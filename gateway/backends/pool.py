"""A pool of backends of one kind: one shared upstream client (gateway/relay/upstream.py), live backend state,
the health-check loop that asks the kind's adapter to probe each backend, and the holds on requests a server
runs on after the gateway left them (`holds.py`), settled after each probe."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import aiohttp
import anyio

from gateway.backends import circuit
from gateway.backends.circuit import Transition
from gateway.backends.holds import Hold, Holds, predicted_end
from gateway.backends.kinds import adapter_for
from gateway.backends.settings import CircuitPolicy
from gateway.backends.state import BackendState
from gateway.relay.upstream import KEEPALIVE_S, Upstream
from gateway.request.ticket import Ticket
from gateway.settings.config import PoolConfig

log = logging.getLogger("omnigate.backends")


class Pool:
    """Backends serving one traffic class; the dispatcher decides which of them gets each request."""

    # (max_connections, max_keepalive) → the pool's client; tracing gives its own (observability/tracing.py)
    upstream: Callable[[int, int], Upstream] = Upstream

    def __init__(
        self,
        config: PoolConfig,
        clock: Callable[[], float] = time.monotonic,
        circuit: Callable[[], CircuitPolicy] = CircuitPolicy,
        on_transition: Callable[[Transition], None] | None = None,
    ) -> None:
        self.config = config
        self.name = config.name
        self.kind = adapter_for(config)
        self._clock = clock
        self._circuit = circuit  # the live policy's breaker settings for this pool
        self._on_transition = on_transition
        self.backends = [
            BackendState(url=url, pool=config.name, name=f"{config.name}-{i}")
            for i, url in enumerate(config.backends)
        ]
        self.client: Upstream | None = None
        self._probe: aiohttp.ClientSession | None = None
        self.holds = Holds(grace_s=config.health_interval_s)

    async def start(self) -> None:
        """Open the clients; timeouts come per request from the live policy (gateway/relay/proxy.py). Health
        checks and scrapes go through a small aiohttp session of their own, off the request path."""
        self.client = self.upstream(self.config.max_connections, self.config.max_keepalive)
        self._probe = _probe_session(len(self.backends) * 2)

    async def close(self) -> None:
        self.holds.release_all()
        for c in (self.client, self._probe):
            if c is not None:
                await c.close()

    def ready(self) -> bool:
        """Some backend is up: requests may queue for it (a half-open one's probes may all be out)."""
        return any(b.up for b in self.backends)

    # -- the circuit breaker (gateway/backends/circuit.py): one verdict per request sent -----------
    def record_success(self, state: BackendState, dispatched_at: float | None = None) -> None:
        """The backend answered (a status below 500 and not a refusal, or a stream's first byte)."""
        self._moved(state, circuit.success(state.breaker, self._circuit(), self._clock(), dispatched_at))

    def record_failure(
        self, state: BackendState, dispatched_at: float | None = None, answered: bool = False
    ) -> None:
        """The backend failed a request: no connection, a deadline, a 5xx; `answered`: a stream broke
        after its first byte (recorded a success then)."""
        now = self._clock()
        self._moved(state, circuit.failure(state.breaker, self._circuit(), now, dispatched_at, answered))

    def record_no_verdict(self, state: BackendState, dispatched_at: float | None) -> None:
        """A request sent there ended telling nothing of the backend (cancelled, revoked, a 4xx)."""
        circuit.no_verdict(state.breaker, dispatched_at)

    def _moved(self, state: BackendState, moved: tuple[circuit.CircuitState, str] | None) -> None:
        if moved is None:
            return
        old, reason = moved
        t = Transition(self.name, state.name, old, state.circuit, reason)
        log_at = logging.WARNING if t.new == circuit.CircuitState.OPEN else logging.INFO
        log.log(log_at, "backend %s: circuit %s -> %s (%s)", t.backend, t.old, t.new, reason)
        if self._on_transition is not None:
            self._on_transition(t)

    def hold(self, state: BackendState, ticket: Ticket, release: Callable[[], None], total_s: float) -> bool:
        """Keep the budgets of a request the gateway walked away from charged while the server runs it on
        (`holds.py`); False when the backend's kind stops such a request (then release it now). `total_s`:
        its total deadline from dispatch, the latest its hold lasts."""
        if not self.kind.runs_on(ticket):
            return False
        now = self._clock()
        latest = (ticket.dispatched_at if ticket.dispatched_at is not None else now) + total_s
        until = predicted_end(ticket, now, latest, self.kind.ends_with_text(ticket))
        self.holds.add(state.url, Hold(release, ticket.stream, now, until))
        return True

    async def monitor(self) -> None:
        """Health-check and scrape every backend forever (cancelled at shutdown)."""
        while True:
            async with anyio.create_task_group() as tg:
                for state in self.backends:
                    tg.start_soon(self.check, state)
            await anyio.sleep(self.config.health_interval_s)

    async def check(self, state: BackendState) -> None:
        assert self._probe is not None
        sent = self._clock()
        healthy = await self.kind.probe(self._probe, state, self._clock)
        self.record_health(state, healthy)
        self.holds.settle(state, self._clock(), sent if healthy else None)

    async def stream_usage(self, state: BackendState, headers: Mapping[str, str]) -> tuple[int, int] | None:
        """A finished raw-audio stream's (prompt, completion) tokens, asked of the backend off the request
        path (its kind knows where: sglang-omni's outcome route)."""
        assert self._probe is not None
        return await self.kind.stream_usage(self._probe, state, headers)

    def record_health(self, state: BackendState, healthy: bool) -> None:
        """A health check's result: the backend's health, and the breaker's cool-down and probing."""
        if healthy != state.healthy:
            log.warning("backend %s %s", state.name, "healthy" if healthy else "unhealthy")
        state.healthy = healthy
        self._moved(state, circuit.health(state.breaker, self._circuit(), self._clock(), healthy))


def _probe_session(max_connections: int) -> aiohttp.ClientSession:
    """No cookies, no proxy settings from the environment."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        skip_auto_headers=("User-Agent",),
    )
