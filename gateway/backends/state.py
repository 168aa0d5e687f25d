"""Live state of one backend: what health checks, scrapes and the dispatcher read and write.

Plain data; the dispatcher (admission) and the backend monitor (backends) both work on it. Two fields
are properties: `active`, because each dispatch (the dispatcher raising it) is also a probe a half-open
circuit counts, and `circuit`, the breaker's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.backends.circuit import Breaker, CircuitState
from gateway.backends.prefix_index import PrefixIndex
from gateway.backends.progress import EngineProgress
from gateway.speech.tally import AudioTally


@dataclass(slots=True)
class _Fields:
    url: str
    pool: str
    name: str = ""  # the backend's one name (`<pool>-<n>`; its URL if none is given): metric label,
    # response header, alert field, log lines
    healthy: bool = True
    breaker: Breaker = field(default_factory=Breaker)
    # gateway-side accounting
    active_requests: int = 0
    outstanding_tokens: int = 0
    reserved_kv_tokens: int = 0
    bucket_active: dict[str, int] = field(default_factory=dict)
    # what the other replicas hold on it, as of the last lease refresh (gateway/coordination/)
    peer_active: int = 0
    peer_kv_tokens: int = 0
    concurrency_limit: int = 64
    # scraped from the backend (its kind reads them: gateway/backends/kinds/); None until the first scrape
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    used_tokens: int | None = None
    token_usage: float | None = None
    running_reqs: int | None = None
    queue_reqs: int | None = None
    detached_reqs: int | None = None  # requests it runs for which no client waits any more (sglang-omni)
    server_audio: dict[str, float] | None = None  # the server's own audio metrics (sglang-omni's, newer)
    audio: AudioTally = field(default_factory=AudioTally)  # its answers' audio as the gateway measured it
    last_scrape: float = 0.0
    progress: EngineProgress = field(default_factory=EngineProgress)  # its predicted work (the ledger's)
    prefix: PrefixIndex = field(default_factory=PrefixIndex)  # what its prefix cache is expected to hold

    def __post_init__(self) -> None:
        self.name = self.name or self.url


class BackendState(_Fields):
    __slots__ = ()

    def __init__(self, *args: Any, active: int = 0, circuit: str = "closed", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.active_requests = active
        self.breaker.state = CircuitState(circuit)

    @property
    def active(self) -> int:
        """Requests dispatched to the backend and not yet released."""
        return self.active_requests

    @active.setter
    def active(self, value: int) -> None:
        if value > self.active_requests:
            self.breaker.dispatched()
        elif value < self.active_requests:
            self.breaker.released(value)
        self.active_requests = value

    @property
    def circuit(self) -> CircuitState:
        return self.breaker.state

    @circuit.setter
    def circuit(self, value: str) -> None:
        self.breaker.state = CircuitState(value)

    @property
    def up(self) -> bool:
        """Serving, or about to: healthy and the circuit not open (a half-open one takes probes)."""
        return self.healthy and self.breaker.state != CircuitState.OPEN

    @property
    def available(self) -> bool:
        """Eligible for new work: healthy and the circuit lets a request through (closed, or a half-open
        circuit's probe)."""
        return self.healthy and self.breaker.allows()
