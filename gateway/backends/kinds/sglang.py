"""The plain SGLang server (`kind: sglang`): OpenAI routes, `sglang:*` metrics, one batching engine.

Probes: `/health` every tick; when healthy, the load every tick — `/v1/loads` (running, waiting, KV in use,
the caps; one JSON document, no `--enable-metrics` needed), or on a server without that route (404, asked
again after a restart) the `sglang:*` gauges of `/metrics`, combined over data-parallel ranks — and the
server's settings (`/server_info`, or `/get_server_info` on servers older than 0.5.9) once per healthy spell.

Shaping: the body goes as the client sent it, except `priority`, which is the gateway's to set — the
dispatch's engine priority on a pool whose engines schedule by priority (`priority_scheduling`), removed
otherwise (a client's own would bypass the gateway's caps) — and sglang-omni's top-level media lists, which
SGLang does not read: their items become content parts (`shapes.py`).
Errors: SGLang answers a bad request with a 4xx; a 5xx is the server's own failure, so another backend may
serve the request and the circuit counts it; 429 and 503 are overload answers. Closing the connection
aborts the request in the engine (SGLang's handler watches for the disconnect), so a lease can end with it.
Ending: each chat or completion attempt carries a `rid` of the gateway's (the response's `id` is it);
`POST /abort_request {"rid"}` ends it: a stream finishes with `finish_reason: "abort"` and the usage the
engine counted (SGLang 0.5.23: ~20 ms later), a whole answer comes back as a 200 with it — what a departed
client is charged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from gateway.backends.kinds.base import (
    PROBE_TIMEOUT,
    BackendKind,
    Capacity,
    Stage,
    StageUnit,
    Verdict,
    exchange_failed,
    get_health,
)
from gateway.backends.kinds.errors import upstream_error
from gateway.backends.kinds.sglang_scrape import (
    INFO_ROUTES,
    apply_loads,
    apply_metrics_text,
    apply_server_info,
)
from gateway.backends.kinds.shapes import to_content_parts
from gateway.backends.state import BackendState
from gateway.relay.proxy import UpstreamError, UpstreamStatusError
from gateway.relay.upstream import Upstream, UpstreamIOError
from gateway.request.ticket import Ticket
from gateway.settings.config import PoolConfig

log = logging.getLogger("omnigate.backends")

RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
OVERLOAD_STATUS = frozenset({429, 503})
ENGINE = "engine"
_ENGINE_ONLY = (ENGINE,)
_RID_PREFIX = {"chat": "chatcmpl-", "completions": "cmpl-"}  # as SGLang names its own responses
_END_CONNECT_S = 0.5
# a random UUID's version (4) and variant (RFC 4122) bits, set on 16 random bytes as uuid.uuid4() does
_UUID4_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_UUID4_SET = (0x8000 << 48) | (4 << 76)


def _uuid4_hex() -> str:
    """`uuid.uuid4().hex` without building a `UUID` (its checks were about 5 µs of every request)."""
    return f"{int.from_bytes(os.urandom(16), 'big') & _UUID4_CLEAR | _UUID4_SET:032x}"


class SGLang(BackendKind):
    name = "sglang"
    routes = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})  # embedding models too

    def __init__(self, config: PoolConfig) -> None:
        self.priority_scheduling = config.priority_scheduling
        self._informed: set[str] = set()  # backends whose /server_info was read since they became healthy
        self._without_loads: set[str] = (
            set()
        )  # backends that answered /v1/loads 404 since they became healthy

    def payload(self, body: dict[str, Any], engine_priority: int) -> bytes:
        to_content_parts(body)
        if self.priority_scheduling:
            body["priority"] = engine_priority
        else:
            body.pop("priority", None)
        return orjson.dumps(body)

    async def probe(
        self, session: aiohttp.ClientSession, state: BackendState, clock: Callable[[], float]
    ) -> bool:
        healthy, _ = await get_health(session, state.url)
        if not healthy:
            self._informed.discard(state.url)  # a server that comes back may have been restarted
            self._without_loads.discard(state.url)
            return False
        await self._scrape(session, state, clock)
        return True

    async def _scrape(
        self, session: aiohttp.ClientSession, state: BackendState, clock: Callable[[], float]
    ) -> None:
        try:
            if state.url not in self._informed:
                await self._server_info(session, state)
            if state.url not in self._without_loads and await self._loads(session, state):
                state.last_scrape = clock()
                return
            async with session.get(state.url + "/metrics", timeout=PROBE_TIMEOUT) as resp:
                if resp.status == 200:
                    apply_metrics_text(state, (await resp.read()).decode("utf-8", "replace"))
                    state.last_scrape = clock()
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError, ValueError) as e:
            log.debug("scrape of %s failed: %s", state.name, e)

    async def _loads(self, session: aiohttp.ClientSession, state: BackendState) -> bool:
        """True when `/v1/loads` answered a load the state now holds; a 404 marks the server as one
        without the route (read from /metrics until it restarts)."""
        async with session.get(state.url + "/v1/loads", timeout=PROBE_TIMEOUT) as resp:
            if resp.status == 404:
                self._without_loads.add(state.url)
                return False
            return resp.status == 200 and apply_loads(state, orjson.loads(await resp.read()))

    async def _server_info(self, session: aiohttp.ClientSession, state: BackendState) -> None:
        """Read the server's settings once per healthy spell (they change only with a restart), from the
        first of `INFO_ROUTES` the server has."""
        for route in INFO_ROUTES:
            async with session.get(state.url + route, timeout=PROBE_TIMEOUT) as resp:
                if resp.status == 404:
                    continue
                if resp.status != 200:
                    return  # asked again next tick
                apply_server_info(state, orjson.loads(await resp.read()))
                break
        self._informed.add(state.url)

    def judge(self, error: UpstreamError, backend: BackendState) -> Verdict:
        if isinstance(error, UpstreamStatusError):
            status = error.status
            return Verdict(
                error=upstream_error(status, error.body),
                retry=status in RETRYABLE_STATUS,
                backend_fault=status >= 500 and status not in OVERLOAD_STATUS,
                overloaded=status in OVERLOAD_STATUS,
                client_fault=400 <= status < 500 and status != 429,
            )
        return exchange_failed(error)

    def name_request(self, body: dict[str, Any], ticket: Ticket) -> str | None:
        prefix = _RID_PREFIX.get(ticket.endpoint)
        if prefix is None:
            body.pop("rid", None)  # the gateway's to set: a client's own could end another's request
            return None
        rid = body["rid"] = prefix + _uuid4_hex()
        return rid

    async def end(self, client: Upstream, url: str, rid: str) -> None:
        try:
            response = await client.post(
                url + "/abort_request",
                orjson.dumps({"rid": rid}),
                {"content-type": "application/json"},
                connect_timeout=_END_CONNECT_S,
            )
            try:
                await response.read()
            finally:
                response.close()
        except (UpstreamIOError, TimeoutError) as e:
            log.debug("abort_request %s on %s failed: %s", rid, url, e)

    def runs_on(self, ticket: Ticket) -> bool:
        return False  # the handler aborts the request in the engine when the connection closes

    def capacity(self, state: BackendState) -> Capacity:
        return Capacity((Stage(ENGINE, StageUnit.REQUESTS, state.max_running_requests),))

    def stages_of(self, ticket: Ticket) -> tuple[str, ...]:
        return _ENGINE_ONLY
