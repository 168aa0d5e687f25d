"""How a request's way ends, as values: the relay's one result, and the ending the finish stage records.

A relay (gateway/pipeline.py) hands over one frozen `Relayed` however it ends — answered, cut, judged a
failure, or left by its client — and the attempt's end sets the ticket's relay fields from it, charges the
usage it saw (or infers it) and feeds the learners before the lease goes back. The request's `Ending`
(from the relay, or from a refusal or failure before it) reaches the finish stage, the one writer of the
ticket's outcome and error fields (gateway/stages/finish.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.ticket import Outcome, Usage


@dataclass(frozen=True, slots=True)
class Ending:
    """How a request ended. PENDING: nothing judged it (the finish stage reads an answer sent as OK, one
    whose client left as CANCELLED)."""

    outcome: Outcome = Outcome.PENDING
    error: str | None = None  # what went wrong with the answer, for the access log and failure alerts
    error_status: int | None = None  # the failure's status when the client already got 200 (mid-stream)
    error_code: str | None = None
    overloaded: bool = False  # the backend refused it for load inside a started stream (a drop)


@dataclass(frozen=True, slots=True)
class Relayed:
    """One relay's result: how it ended, the usage the engine told (None: it did not), the answer tokens
    relayed (what an inferred charge counts), and its timings and audio on the gateway's clock."""

    ending: Ending = field(default_factory=Ending)
    usage: Usage | None = None
    answer_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None
    first_audio_at: float | None = None
    audio_seconds: float = 0.0
    rtf: float | None = None
    audio_stalls: int = 0
    finished_at: float | None = None
