"""The Ticket: the one record a request carries through every stage of the gateway.

Stages read it; few write it, each its own fields. What is settled once is a frozen part: the engine's
`Usage`, its predicted `Prefill`, the relay's one result (`Relayed`: how it ended, what it delivered, the
usage it saw, its timings — set by the pipeline at the attempt's end) and the request's `Ending` (set by
the finish stage alone); the ticket reads their fields through properties. Times are monotonic seconds
from the gateway's clock.
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
    """What admission reads of a streaming answer's audio (the stage budgets,
    gateway/admission/engine_stages.py)."""

    def speed(self, now: float) -> float | None:
        """Audio seconds per wall second the stream gets now; None before it shows one."""


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Ending:
    """How a request ended. PENDING: nothing judged it (the finish stage reads an answer sent as OK, one
    whose client left as CANCELLED)."""

    outcome: Outcome = Outcome.PENDING
    error: str | None = None  # what went wrong with the answer, for the access log and failure alerts
    error_status: int | None = None  # the failure's status when the client already got 200 (mid-stream)
    error_code: str | None = None
    overloaded: bool = False  # the backend refused it for load inside a started stream (a drop)


class Relayed:
    """One relay's result: how it ended, the usage the engine told (None: it did not), the answer tokens
    relayed (what an inferred charge counts), and its timings and audio on the gateway's clock. Read-only
    by contract; a plain slotted class, one per request, where a frozen dataclass would set each of its
    ten fields through `object.__setattr__`."""

    __slots__ = (
        "answer_tokens",
        "audio_seconds",
        "audio_stalls",
        "ending",
        "finished_at",
        "first_audio_at",
        "first_token_at",
        "last_token_at",
        "rtf",
        "usage",
    )

    def __init__(
        self,
        ending: Ending | None = None,
        usage: Usage | None = None,
        answer_tokens: int = 0,
        first_token_at: float | None = None,
        last_token_at: float | None = None,
        first_audio_at: float | None = None,
        audio_seconds: float = 0.0,
        rtf: float | None = None,
        audio_stalls: int = 0,
        finished_at: float | None = None,
    ) -> None:
        self.ending = Ending() if ending is None else ending
        self.usage = usage
        self.answer_tokens = answer_tokens
        self.first_token_at = first_token_at
        self.last_token_at = last_token_at
        self.first_audio_at = first_audio_at
        self.audio_seconds = audio_seconds
        self.rtf = rtf
        self.audio_stalls = audio_stalls
        self.finished_at = finished_at


_NOT_RELAYED = Relayed()


@dataclass(slots=True)
class Ticket:
    id: str
    model: str
    stream: bool
    arrival: float
    tenant: str = "anonymous"
    endpoint: str = "chat"  # the route's endpoint (gateway/request/openai_api.py: Endpoint)
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
    relayed: Relayed | None = None  # the relay's result (pipeline: the attempt's end); None: none ran
    speech: StreamSpeed | None = None  # while its answer streams: its meter (gateway/speech/meter.py)
    finished_at: float | None = None
    usage: Usage | None = None  # the engine's own count, else what gateway/tenants/charge.py infers
    usage_inferred: str | None = None  # why `usage` was inferred (charge.py's reasons); None: the engine's
    reached_engine: bool = False  # the last attempt may have run on the engine (it is charged)
    prefill: Prefill | None = None  # the engine's predicted prefill of the last attempt (progress.py)
    engine_rid: str | None = None  # the id the engine can end the last attempt by (its kind's `end`)
    ending: Ending = field(default_factory=Ending)  # how it ended (the finish stage); PENDING until then
    rate_limits: dict[str, str] | None = None  # the tenant's x-ratelimit-* headers after admission
    max_queued: int | None = None  # the tenant's requests that may wait in a pool's queue (its quota)
    predicted_first_token: float | None = None  # what admission judged its deadline by (QueueGuard.admit)

    @property
    def first_token_at(self) -> float | None:
        return (self.relayed or _NOT_RELAYED).first_token_at

    @property
    def last_token_at(self) -> float | None:
        return (self.relayed or _NOT_RELAYED).last_token_at

    @property
    def first_audio_at(self) -> float | None:
        return (self.relayed or _NOT_RELAYED).first_audio_at

    @property
    def audio_seconds(self) -> float:
        """Audio the answer delivered (read from its WAV headers or its stream)."""
        return (self.relayed or _NOT_RELAYED).audio_seconds

    @property
    def rtf(self) -> float | None:
        """A stream's real-time factor (gateway/speech/meter.py)."""
        return (self.relayed or _NOT_RELAYED).rtf

    @property
    def audio_stalls(self) -> int:
        return (self.relayed or _NOT_RELAYED).audio_stalls

    @property
    def outcome(self) -> Outcome:
        return self.ending.outcome

    @property
    def error(self) -> str | None:
        """What went wrong, for the access log and failure alerts."""
        return self.ending.error

    @property
    def error_status(self) -> int | None:
        return self.ending.error_status

    @property
    def error_code(self) -> str | None:
        return self.ending.error_code

    @property
    def backend_overloaded(self) -> bool:
        return self.ending.overloaded

    @property
    def queue_seconds(self) -> float:
        return (self.dispatched_at - self.arrival) if self.dispatched_at is not None else 0.0
