"""What the gateway asks of one kind of inference server: the backend-kind interface.

The pipeline and admission never branch on a pool's `kind`; they ask its adapter, one object per pool built
from the pool's config (`gateway.backends.kinds.adapter_for`). An adapter owns what differs between servers:

- request shaping (`payload`): the validated, priced client body as this server takes it;
- load signals (`probe`): health and scrapes, written onto the `BackendState` the dispatcher reads; the
  signals a backend has not given are named (`missing_signals`, shown on `/admin/state`);
- error mapping (`judge`): what an upstream failure means — try another backend? the backend's fault (the
  circuit breaker counts it)? an overload answer? the client's fault? — and the OpenAI error the client gets;
- cancellation (`runs_on`): whether the server stops a request when its connection closes; ending one
  cleanly (`name_request`, `end`): a server that can end a request by an id the gateway gave it finishes its
  stream with the usage so far, so a departed client is charged the engine's own count;
- capacity (`capacity`, `stages_of`): the stages a backend's work passes through, each with its limit and
  unit, and which of them one request holds while it runs. Plain SGLang is one stage, `engine`; a staged
  server (SGLang-Omni) lists e.g. `encoder`, `thinker`, `talker`, `code2wav` in pipeline order, so
  admission can budget each stage without knowing which server it talks to.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any, ClassVar

import aiohttp

from gateway.backends.state import BackendState
from gateway.relay.proxy import UpstreamError
from gateway.relay.upstream import Upstream
from gateway.request.errors import ApiError, ErrorCode
from gateway.request.ticket import Ticket

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)
"""Every health check and scrape: a backend too slow to answer one in time counts as unhealthy."""


async def get_health(session: aiohttp.ClientSession, url: str) -> tuple[bool, bytes]:
    """`GET /health`: healthy on a 200 in time, and the body (empty when it failed)."""
    try:
        async with session.get(url + "/health", timeout=PROBE_TIMEOUT) as resp:
            return resp.status == 200, await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        return False, b""


class StageUnit(StrEnum):
    """What a stage's limit counts."""

    REQUESTS = "requests"  # requests running in it at once (a continuous-batching engine's cap)
    AUDIO_SECONDS_PER_S = "audio_seconds_per_s"  # audio it produces per wall second (a serial vocoder)
    ITEMS_PER_BATCH = "items_per_batch"  # media items it encodes in one batch (an encoder)


class Signal(StrEnum):
    """A load signal admission reads from a backend when its kind provides it."""

    KV_CAPACITY = "kv_capacity"  # the KV pool's size
    KV_USAGE = "kv_usage"  # KV in use, all clients
    RUNNING = "running"  # requests the backend runs, all clients
    QUEUED = "queued"  # requests waiting inside the backend


WITHOUT: dict[Signal, str] = {
    Signal.KV_CAPACITY: "the KV watermark is off",
    Signal.KV_USAGE: "KV in use counts only the gateway's own reservations",
    Signal.RUNNING: "other clients' requests are not seen",
    Signal.QUEUED: "the backend's own queue is not seen",
}
"""What admission does without each signal: it runs on its own accounting."""


def present(state: BackendState) -> dict[Signal, bool]:
    return {
        Signal.KV_CAPACITY: state.max_total_tokens is not None,
        Signal.KV_USAGE: state.used_tokens is not None or state.token_usage is not None,
        Signal.RUNNING: state.running_reqs is not None,
        Signal.QUEUED: state.queue_reqs is not None,
    }


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a backend's engine and its limit: the server's own setting as the backend reported it
    or as the server's defaults set it; None while unknown (then admission's own limits decide)."""

    name: str
    unit: StageUnit
    limit: float | None


@dataclass(frozen=True, slots=True)
class Capacity:
    """A backend's capacity model: its stages, in pipeline order."""

    stages: tuple[Stage, ...]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one upstream failure means, as the backend's kind reads it.

    `error` is what the client gets when nothing else is tried; `retry`: another backend may serve the
    request (nothing reached the client); `backend_fault`: it counts toward the backend's circuit breaker;
    `overloaded`: the backend refused for load (a drop for the concurrency limit, never a request's end);
    `client_fault`: the request's own content is at fault (its outcome is `client_error`).
    """

    error: ApiError
    retry: bool
    backend_fault: bool
    overloaded: bool
    client_fault: bool


class BackendKind(abc.ABC):
    """One adapter per pool; `name` is the pool config's `kind`, `routes` the generation routes its servers
    have, `unavailable` the signals they never give, and why."""

    name: str
    routes: ClassVar[frozenset[str]]  # the gateway's generation routes this kind of server has
    staged: ClassVar[bool] = False  # its stages have budgets of their own (admission/engine_stages.py)
    unavailable: ClassVar[Mapping[Signal, str]] = MappingProxyType({})

    def check_route(self, path: str, model: str) -> None:
        """Refuse (404) a route the model's servers lack, before anything is sent to them."""
        if path not in self.routes:
            raise ApiError(
                404,
                f"Model '{model}' is served by {self.name} backends, which have no {path}; they serve "
                f"{', '.join(sorted(self.routes))}.",
                code=ErrorCode.ROUTE_NOT_SERVED,
            )

    def missing_signals(self, state: BackendState) -> dict[str, str]:
        """Each load signal the backend has not given, with why and what admission does without it."""
        why = self.unavailable
        return {
            signal.value: f"{why.get(signal, 'not read from the backend yet')}: {WITHOUT[signal]}"
            for signal, known in present(state).items()
            if not known
        }

    @abc.abstractmethod
    def payload(self, body: dict[str, Any], engine_priority: int) -> bytes:
        """The request body as this server takes it, serialised (once per attempt; may shape `body` in
        place). `engine_priority` is the dispatch's engine priority, for servers that schedule by one."""

    @abc.abstractmethod
    async def probe(
        self, session: aiohttp.ClientSession, state: BackendState, clock: Callable[[], float]
    ) -> bool:
        """Check the backend's health and, when healthy, read its load signals onto `state`; True if
        healthy. Never raises for a failed scrape: a missing signal stays as it was."""

    @abc.abstractmethod
    def judge(self, error: UpstreamError, backend: BackendState) -> Verdict:
        """What an upstream failure (before or during the relay) on `backend` means for this server."""

    def judge_event(self, error: dict[str, Any], backend: BackendState) -> Verdict:
        """What an error event inside a started 200 stream means (nothing can be retried: bytes reached the
        client): by its `code`, overload (429/503) is the backend's load, another 4xx the request's own,
        anything else the backend's failure."""
        code = error.get("code")
        status = code if isinstance(code, int) and 400 <= code < 600 else 502
        message = str(error.get("message") or "The backend reported an error mid-stream.")
        api = ApiError(status, message, code=ErrorCode.UPSTREAM_ERROR)
        if status in (429, 503):
            return Verdict(api, retry=False, backend_fault=False, overloaded=True, client_fault=False)
        client = status < 500
        return Verdict(api, retry=False, backend_fault=not client, overloaded=False, client_fault=client)

    async def stream_usage(
        self, session: aiohttp.ClientSession, state: BackendState, headers: Mapping[str, str]
    ) -> tuple[int, int] | None:
        """(prompt, completion) tokens of a finished raw-audio stream, which carries no usage in its body;
        None where the server does not tell it."""
        return None

    @abc.abstractmethod
    def runs_on(self, ticket: Ticket) -> bool:
        """Whether the server goes on running this request after the gateway closes its connection (a
        client that left, a deadline): then its capacity stays charged (`gateway/backends/holds.py`)."""

    def name_request(self, body: dict[str, Any], ticket: Ticket) -> str | None:
        """Give this attempt an id the server can `end` it by (set in `body`), or None: it has no such way
        for this request, and closing the connection is how it is stopped."""
        return None

    async def end(self, client: Upstream, url: str, rid: str) -> None:
        """Ask the server at `url` to end request `rid` now; its stream then finishes with the usage so far.
        Never raises for a failed call: the stream's deadline still bounds the wait. Called only for an id
        `name_request` gave."""
        raise NotImplementedError(f"{self.name} backends cannot end a request by its id")

    def ends_with_text(self, ticket: Ticket) -> bool:
        """Whether the request's work on the server ends with its last text token, so that its stream's
        pace predicts its end; not when a stage runs on after the text (a talker speaking it)."""
        return True

    @abc.abstractmethod
    def capacity(self, state: BackendState) -> Capacity:
        """The backend's stages and their limits, as far as its probes have told them."""

    @abc.abstractmethod
    def stages_of(self, ticket: Ticket) -> tuple[str, ...]:
        """The names of the stages that this priced request holds while it runs, in pipeline order. A
        stage a backend lacks (absent from its `capacity`, e.g. the talker of a text-only pipeline) is
        not held there."""


def exchange_failed(error: UpstreamError) -> Verdict:
    """A failed exchange (no connection, a deadline, a broken or cut stream) is the backend's fault: another
    backend may serve the request while nothing has reached the client."""
    return Verdict(
        error=ApiError(error.status, error.message, code=error.code),
        retry=error.retryable,
        backend_fault=True,
        overloaded=False,
        client_fault=False,
    )
