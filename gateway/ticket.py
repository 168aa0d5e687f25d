"""The Ticket: the one record a request carries through every stage of the gateway.

Stages read it; few write it. Times are monotonic seconds from the gateway's clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class Outcome(StrEnum):
    """How a request (or a lease on a backend) ended; the `outcome` label of `omnigate_requests_total`.

    PENDING until it ends. OVERLOADED (the backend answered 429/503) and REVOKED (taken back from a
    backend to queue again) end a lease only, never a request."""

    PENDING = "pending"
    OK = "ok"
    REJECTED = "rejected"
    CLIENT_ERROR = "client_error"
    CANCELLED = "cancelled"
    UPSTREAM_ERROR = "upstream_error"
    TIMEOUT = "timeout"
    INTERNAL_ERROR = "internal_error"
    OVERLOADED = "overloaded"
    REVOKED = "revoked"


FAILED_OUTCOMES = frozenset({Outcome.UPSTREAM_ERROR, Outcome.TIMEOUT, Outcome.INTERNAL_ERROR})
"""Outcomes that are the gateway's or the backend's failure: they alert and count against the SLO."""


@dataclass(slots=True)
class Cost:
    """Estimated token cost of a request, priced the way the backend will count it."""

    text_tokens: int = 0
    vision_tokens: int = 0
    audio_tokens: int = 0
    expected_output_tokens: int = 0
    max_output_tokens: int = 0
    images: int = 0
    audios: int = 0
    videos: int = 0
    remote_media: int = 0
    speech_seconds: float = 0.0  # audio the answer is expected to speak (gateway/speech/pricing.py)
    # the prompt's prefix the engine is expected to serve from its cache (gateway/backends/prefix_index.py):
    # the best backend's while the request waits, its backend's once placed
    cached_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        """Everything the backend prefills: text plus vision plus audio tokens."""
        return self.text_tokens + self.vision_tokens + self.audio_tokens

    @property
    def prefill_tokens(self) -> int:
        """What the engine is expected to compute of the prompt: all but its cached prefix."""
        return self.prompt_tokens - self.cached_tokens

    @property
    def total_tokens(self) -> int:
        """Prompt plus expected output: what quotas reserve at admission, and the KV footprint the request
        will occupy at its expected end."""
        return self.prompt_tokens + self.expected_output_tokens


class StreamSpeed(Protocol):
    """What admission reads of a streaming answer's audio (the stage budgets, gateway/admission/stages.py)."""

    def speed(self, now: float) -> float | None:
        """Audio seconds per wall second the stream gets now; None before it shows one."""


@dataclass(slots=True)
class Usage:
    """What the backend reported (or what we counted when a stream was cut short)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None  # of the prompt, served from the engine's prefix cache (None: not told)

    @property
    def computed_prompt_tokens(self) -> int:
        """The prompt the engine prefilled: all of it but what it served from its cache."""
        return self.prompt_tokens - (self.cached_tokens or 0)


@dataclass(frozen=True, slots=True)
class Prefill:
    """When an engine is predicted to prefill a request: in which of its batches, from when, for how long,
    and its prompt as that engine is predicted to count it."""

    batch: int
    at: float
    seconds: float
    tokens: int


@dataclass(frozen=True, slots=True)
class PrefixKey:
    """A prompt as the chain of chunks an engine's prefix cache would share (gateway/backends/prefix_key.py):
    `keys[i]` names the prompt up to the end of chunk `i`, `ends[i]` its priced tokens up to there;
    `session` names the conversation (the `x-session-id` header, else its first message after the system
    prompt)."""

    keys: tuple[bytes, ...]
    ends: tuple[int, ...]
    session: bytes | None = None

    @property
    def tokens(self) -> int:
        return self.ends[-1] if self.ends else 0


@dataclass(slots=True)
class Ticket:
    id: str
    model: str
    stream: bool
    arrival: float
    tenant: str = "anonymous"
    endpoint: str = "chat"  # the route's endpoint (gateway/openai_api.py: Endpoint)
    pool: str = ""
    traffic_class: str = "interactive"
    priority: int = 0
    band: str = ""  # the priority's level name (policy `queue.priorities.levels`): its metric label
    bucket: str = "text"
    voice: str | None = None  # the voice of the speech the answer holds; None for text only
    cost: Cost = field(default_factory=Cost)
    prefix: PrefixKey | None = None  # its prompt's chunk chain (prefix_key.py); None: not indexed
    deadline: float = float("inf")
    job_id: str | None = None
    backend: str | None = None
    dispatched_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    first_audio_at: float | None = None
    audio_seconds: float = 0.0  # audio the answer delivered, read from its WAV headers
    rtf: float | None = None  # a stream's real-time factor (gateway/speech/meter.py)
    audio_stalls: int = 0
    speech: StreamSpeed | None = None  # while its answer streams: its meter (gateway/speech/meter.py)
    finished_at: float | None = None
    usage: Usage | None = None  # the engine's own count, else what gateway/tenants/charge.py infers
    usage_inferred: str | None = None  # why `usage` was inferred (charge.py's reasons); None: the engine's
    reached_engine: bool = False  # the last attempt may have run on the engine (it is charged)
    prefill: Prefill | None = None  # the engine's predicted prefill of the last attempt (progress.py)
    engine_rid: str | None = None  # the id the engine can end the last attempt by (its kind's `end`)
    outcome: Outcome = Outcome.PENDING
    error_code: str | None = None
    error: str | None = None  # what went wrong, for the access log and failure alerts
    error_status: int | None = None  # the failure's status when the client already got 200 (mid-stream)
    backend_overloaded: bool = False  # the backend refused it for load inside a started stream (a drop)
    rate_limits: dict[str, str] | None = None  # the tenant's x-ratelimit-* headers after admission
    max_queued: int | None = None  # the tenant's requests that may wait in a pool's queue (its quota)
    predicted_first_token: float | None = None  # what admission judged its deadline by (QueueGuard.admit)

    @property
    def queue_seconds(self) -> float:
        return (self.dispatched_at - self.arrival) if self.dispatched_at is not None else 0.0
