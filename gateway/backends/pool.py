"""A pool of SGLang backends: one shared aiohttp session, live backend state, health checks and scrapes."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import aiohttp
import anyio
import orjson

from gateway.backends import circuit
from gateway.backends.scrape import apply_metrics_text, apply_server_info
from gateway.backends.state import BackendState
from gateway.config import PoolConfig

log = logging.getLogger("omnigate.backends")

# Idle upstream connections close after this; below uvicorn's (SGLang's server) 5 s default so the gateway
# never sends a request on a connection the backend is closing.
KEEPALIVE_S = 4.0
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


class Pool:
    """Backends serving one traffic class; the dispatcher decides which of them gets each request."""

    def __init__(self, config: PoolConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.name = config.name
        self._clock = clock
        self.backends = [
            BackendState(url=url, pool=config.name, name=f"{config.name}-{i}")
            for i, url in enumerate(config.backends)
        ]
        self.client: aiohttp.ClientSession | None = None
        self._probe: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the sessions; timeouts come per request from the live policy (gateway/proxy.py)."""
        self.client = _session(self.config.max_connections)
        self._probe = _session(len(self.backends) * 2)

    async def close(self) -> None:
        for c in (self.client, self._probe):
            if c is not None:
                await c.close()

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
            async with self._probe.get(state.url + "/health", timeout=PROBE_TIMEOUT) as resp:
                healthy = resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            healthy = False
        if healthy != state.healthy:
            log.warning("backend %s %s", state.name, "healthy" if healthy else "unhealthy")
        state.healthy = healthy
        if healthy:
            await self._scrape(state)

    async def _scrape(self, state: BackendState) -> None:
        assert self._probe is not None
        try:
            if state.max_total_tokens is None:
                async with self._probe.get(state.url + "/get_server_info", timeout=PROBE_TIMEOUT) as info:
                    if info.status == 200:
                        apply_server_info(state, orjson.loads(await info.read()))
            async with self._probe.get(state.url + "/metrics", timeout=PROBE_TIMEOUT) as resp:
                if resp.status == 200:
                    apply_metrics_text(state, (await resp.read()).decode("utf-8", "replace"))
                    state.last_scrape = self._clock()
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, ValueError) as e:
            log.debug("scrape of %s failed: %s", state.name, e)


def _session(max_connections: int) -> aiohttp.ClientSession:
    """Bytes pass through as sent (no decompression), no cookies, no proxy settings from the environment."""
    connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        skip_auto_headers=("User-Agent",),
    )
