"""The per-request record every metric is computed from (times are seconds from the run's start)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.speech.meter import SpeechMeter

# Response headers the gateway sets; recorded verbatim when present (absent against bare SGLang).
GATEWAY_HEADERS = (
    "x-omnigate-queue-ms",
    "x-omnigate-backend",
    "x-omnigate-bucket",
    "x-omnigate-priority",
    "x-omnigate-predicted-ttft-ms",
    "x-omnigate-slack-ms",
)
SCALED_HEADERS = ("x-omnigate-queue-ms", "x-omnigate-predicted-ttft-ms", "x-omnigate-slack-ms")  # ms

# Statuses that mean "the server declined the work" rather than "the server broke".
REJECT_STATUSES = frozenset({408, 429, 503})


@dataclass(slots=True)
class RequestRecord:
    bucket: str = "text"
    tenant: str = ""
    priority: int | None = None
    traffic_class: str = ""
    phase: str = "measured"
    worker: int = 0
    scheduled: float = 0.0
    sent: float = 0.0
    outer_wait: float = 0.0  # held back by the harness's in-flight cap (RunOptions.max_in_flight)
    ttft: float | None = None  # the first output: a content token or audio
    ttfa: float | None = None  # the first audio (answers that speak)
    e2e: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    audio: list[tuple[float, float]] = field(default_factory=list)  # (arrival, audio seconds) per chunk
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # of the prompt, served from the engine's prefix cache (when reported)
    status: int = 0
    error: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None

    @property
    def rejected(self) -> bool:
        return self.status in REJECT_STATUSES

    @property
    def send_lag(self) -> float:
        """The load generator's own lateness; time deliberately held by the in-flight cap is not lag."""
        return self.sent - self.scheduled - self.outer_wait

    def header_ms(self, name: str) -> float | None:
        """A gateway header that holds milliseconds, as a number (None: absent or not a number)."""
        raw = self.headers.get(name)
        try:
            return float(raw) if raw is not None else None
        except ValueError:
            return None

    @property
    def queue_ms(self) -> float | None:
        return self.header_ms("x-omnigate-queue-ms")

    @property
    def predicted_ttft_ms(self) -> float | None:
        """The first token the gateway's early rejection predicted at admission, ms from arrival."""
        return self.header_ms("x-omnigate-predicted-ttft-ms")

    @property
    def slack_ms(self) -> float | None:
        """On a deadline refusal, the slack the gateway judged it by: negative, it could not have met its
        deadline even sent to the engine at once (gateway/admission/shedding.py, SLACK_HEADER)."""
        return self.header_ms("x-omnigate-slack-ms")

    @property
    def speech(self) -> SpeechMeter | None:
        """The answer's audio as a player would have heard it (gateway/speech/meter.py); None: no audio."""
        if not self.audio:
            return None
        meter = SpeechMeter()
        for at, seconds in self.audio:
            meter.add(at, seconds)
        return meter

    def scaled(self, factor: float) -> RequestRecord:
        """The record with every time multiplied by factor (undoing a time-scaled simulator)."""
        out = RequestRecord(**asdict(self))
        out.scheduled *= factor
        out.sent *= factor
        out.outer_wait *= factor
        out.ttft = None if self.ttft is None else self.ttft * factor
        out.ttfa = None if self.ttfa is None else self.ttfa * factor
        out.audio = [(at * factor, seconds) for at, seconds in self.audio]  # audio seconds are the clip's
        out.e2e = None if self.e2e is None else self.e2e * factor
        out.chunk_times = [c * factor for c in self.chunk_times]
        for name in SCALED_HEADERS:
            ms = self.header_ms(name)
            if ms is not None:
                out.headers[name] = repr(ms * factor)
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
