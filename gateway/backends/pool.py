"""A pool of SGLang backends: one shared httpx client, live backend state, health checks and scrapes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import anyio
import httpx
import orjson

from gateway.backends import circuit
from gateway.backends.scrape import apply_metrics_text, apply_server_info
from gateway.backends.state import BackendState
from gateway.config import PoolConfig
from gateway.policy import Policy

log = logging.getLogger("omnigate.backends")


class Pool:
    """Backends serving one traffic class; the dispatcher decides which of them gets each request."""

    def __init__(
        self, config: PoolConfig, policy: Callable[[], Policy], clock: Callable[[], float] = time.monotonic
    ):
        self.config = config
        self.name = config.name
        self._policy = policy
        self._clock = clock
        self.backends = [BackendState(url=url, pool=config.name) for url in config.backends]
        self.backend_ids = {b.url: f"{config.name}-{i}" for i, b in enumerate(self.backends)}
        self.client: httpx.AsyncClient | None = None
        self._probe: httpx.AsyncClient | None = None

    def backend_id(self, state: BackendState) -> str:
        """A stable short name for a backend, safe to show clients and use as a metric label."""
        return self.backend_ids[state.url]

    def timeouts(self) -> httpx.Timeout:
        t = self._policy().pool(self.name).timeouts
        # read=None: first-byte and idle-gap deadlines are enforced by the relay itself.
        return httpx.Timeout(connect=t.connect, read=None, write=t.connect, pool=t.first_byte)

    async def start(self) -> None:
        limits = httpx.Limits(
            max_connections=self.config.max_connections, max_keepalive_connections=self.config.max_keepalive
        )
        self.client = httpx.AsyncClient(limits=limits, timeout=self.timeouts(), trust_env=False)
        self._probe = httpx.AsyncClient(timeout=httpx.Timeout(2.0), trust_env=False)

    async def close(self) -> None:
        for c in (self.client, self._probe):
            if c is not None:
                await c.aclose()

    def ready(self) -> bool:
        return any(b.available for b in self.backends)

    def record_success(self, state: BackendState) -> None:
        circuit.record_success(state)

    def record_failure(self, state: BackendState) -> None:
        circuit.record_failure(state, self._clock())

    async def monitor(self) -> None:
        """Health-check and scrape every backend forever (cancelled at shutdown)."""
        while True:
            async with anyio.create_task_group() as tg:
                for state in self.backends:
                    tg.start_soon(self.check, state)
            await anyio.sleep(self.config.health_interval_s)

    async def check(self, state: BackendState) -> None:
        assert self._probe is not None
        now = self._clock()
        circuit.refresh(state, now)
        try:
            resp = await self._probe.get(state.url + "/health")
            healthy = resp.status_code == 200
        except httpx.HTTPError:
            healthy = False
        if healthy != state.healthy:
            log.warning("backend %s %s", self.backend_id(state), "healthy" if healthy else "unhealthy")
        state.healthy = healthy
        if healthy:
            await self._scrape(state)

    async def _scrape(self, state: BackendState) -> None:
        assert self._probe is not None
        try:
            if state.max_total_tokens is None:
                info = await self._probe.get(state.url + "/get_server_info")
                if info.status_code == 200:
                    apply_server_info(state, orjson.loads(info.content))
            resp = await self._probe.get(state.url + "/metrics")
            if resp.status_code == 200:
                apply_metrics_text(state, resp.text)
                state.last_scrape = self._clock()
        except (httpx.HTTPError, orjson.JSONDecodeError, ValueError) as e:
            log.debug("scrape of %s failed: %s", self.backend_id(state), e)
