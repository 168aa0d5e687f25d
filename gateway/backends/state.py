"""Live state of one backend: what health checks, scrapes and the dispatcher read and write.

Plain data; the dispatcher (admission) and the backend monitor (backends) both work on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class BackendState:
    url: str
    pool: str
    name: str = ""  # the backend's one name (`<pool>-<n>`; its URL if none is given): metric label,
    # response header, alert field, log lines
    healthy: bool = True
    circuit: str = "closed"  # closed | open | half_open
    consecutive_failures: int = 0
    circuit_opened_at: float = 0.0
    # gateway-side accounting
    active: int = 0
    outstanding_tokens: int = 0
    reserved_kv_tokens: int = 0
    bucket_active: dict[str, int] = field(default_factory=dict)
    concurrency_limit: int = 64
    # scraped from the backend (its kind reads them: gateway/backends/kinds/); None until the first scrape
    max_total_tokens: int | None = None
    max_running_requests: int | None = None
    used_tokens: int | None = None
    token_usage: float | None = None
    running_reqs: int | None = None
    queue_reqs: int | None = None
    detached_reqs: int | None = None  # requests it runs for which no client waits any more (sglang-omni)
    last_scrape: float = 0.0

    def __post_init__(self) -> None:
        self.name = self.name or self.url

    @property
    def available(self) -> bool:
        """Eligible for new work: healthy and circuit not open."""
        return self.healthy and self.circuit != "open"
