"""How much of a request's decode its engine spent on prefill: the prompt tokens the gateway sent that
backend between the request's first byte and its end, over the engine's measured prefill rate.

SGLang runs a prefill batch before the next decode step, so every prompt sent while a request decodes
stretches its token gaps. Its TPOT = decode step / (1 − that share); the target limit recovers the step
from both and derives the prefill duty from it (limits/target.py). Sent is not yet run, but over a decode
of seconds the prompts sent just before it and those still queued at its end even out.
"""

from __future__ import annotations

from gateway.admission.decision import Decision
from gateway.admission.families import Ask
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket


class PrefillSeen:
    """Per backend, the prompt tokens sent so far; per started request, that count and the time when
    its first byte came. A `Tally` and a `FirstByte` listener (families.py)."""

    def __init__(self) -> None:
        self._sent: dict[str, int] = {}
        self._marks: dict[int, tuple[str, float, int]] = {}  # id(ticket) → (backend, first byte, sent)

    def commit(self, ask: Ask, backend: BackendState, ctx: Decision) -> None:
        self.sent(backend.url, ask.ticket.cost.prefill_tokens)

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """Nothing held: what was sent stays sent; the share is read once at the end (`share`)."""

    def sent(self, url: str, prompt_tokens: int) -> None:
        self._sent[url] = self._sent.get(url, 0) + prompt_tokens

    def started(self, ticket: Ticket, url: str, now: float) -> None:
        self._marks[id(ticket)] = (url, now, self._sent.get(url, 0))

    def share(self, ticket: Ticket, now: float, rate: float) -> float | None:
        """The share of the ticket's decode (first byte → now) its backend spent on the prompts sent
        meanwhile at `rate` tokens/s, in [0, 1]; None when it never started or decoded for no time.
        Forgets the ticket: call it once, when the request ends."""
        mark = self._marks.pop(id(ticket), None)
        if mark is None or now <= mark[1] or rate <= 0:
            return None
        url, start, before = mark
        return min(1.0, (self._sent.get(url, 0) - before) / rate / (now - start))
