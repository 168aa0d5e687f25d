"""Staged capacity: per backend, a budget per stage of its engine, and what each admitted request holds.

A staged server (sglang-omni) runs a request through stages with their own limits (the backend's kind
lists them: `BackendKind.capacity`, and which of them a request holds: `stages_of`). The dispatcher asks
`StageBook.miss` before it places a request and tells it `commit`, `started` and `release`:

- **requests** stages (thinker, talker): a request holds one place from dispatch to release. Budget: the
  server's cap (or the policy's), and for the talker an adaptive budget (below).
- **audio seconds per second** (code2wav, the serial vocoder): a request that speaks holds one real-time
  stream — it needs one audio second per wall second to play without stutter — so the budget is the
  vocoder's audio seconds per second: how many streams it keeps in real time. Unknown until configured;
  then it follows the talker's adaptive budget.
- **items per batch** (the media encoders): a request's media items are held from dispatch until its first
  byte (its encoding is done by then); the items waiting must fit one batch, and a request with more items
  than a batch goes alone.

Adaptive: the thinker's budget is the server's cap; the backend's adaptive concurrency limit (which follows
TTFT: limits.py) counts the requests that do not speak — a speaking request holds a talker place for as
long as it speaks, seconds after its text is done, and would starve text of slots. The speaking stages
follow the real-time factor of the streams that end: a stream slower than `rtf_target` shrinks the talker's
and code2wav's budgets toward the number of streams that would have met it (those speaking × target / its
RTF), by at most `decrease` per stream and never below `min_speaking`; one well inside it (below
`rtf_target × grow_below`) while a budget had no room for another grows them by one, up to their limits.
A speech request that does not fit the talker or code2wav is passed over (text behind it goes); one that
does not fit the thinker or the encoder blocks the head like any shared budget. The stage's name is the
reason `/admin/state` shows (`stage_talker`, …).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.admission.settings import StagePolicy
from gateway.backends.kinds.base import BackendKind, Stage, StageUnit
from gateway.backends.state import BackendState
from gateway.ticket import Ticket

SPEAKING = ("talker", "code2wav")  # the stages whose pace is the stream's real-time factor
PASSABLE = frozenset(f"stage_{name}" for name in SPEAKING)
"""Misses that do not block the requests behind: text-only requests never wait for the talker."""


@dataclass(slots=True)
class _Backend:
    use: dict[str, float] = field(default_factory=dict)  # stage → what admitted requests hold
    adaptive: dict[str, float] = field(default_factory=dict)  # stage → adaptive budget (speaking stages)
    held: dict[int, tuple[tuple[str, float], ...]] = field(default_factory=dict)  # id(ticket) → holds
    encoding: dict[int, float] = field(default_factory=dict)  # id(ticket) → items until its first byte


class StageBook:
    """The stage budgets of one pool's backends (one kind), and what the requests on them hold."""

    def __init__(self, kind: BackendKind, policy: Callable[[], StagePolicy]) -> None:
        self.kind = kind
        self.policy = policy
        self._backends: dict[str, _Backend] = {}

    def _book(self, url: str) -> _Backend:
        book = self._backends.get(url)
        if book is None:
            book = self._backends[url] = _Backend()
        return book

    def _stages(self, ticket: Ticket, backend: BackendState) -> list[Stage]:
        capacity = {s.name: s for s in self.kind.capacity(backend).stages}
        return [capacity[name] for name in self.kind.stages_of(ticket) if name in capacity]

    def _hold(self, ticket: Ticket, stage: Stage) -> float:
        """What `ticket` holds of `stage`, in the stage's unit."""
        if stage.unit == StageUnit.ITEMS_PER_BATCH:
            cost = ticket.cost
            return float(cost.images + cost.audios + cost.videos)
        return 1.0  # a place in a requests stage, or one real-time stream of the vocoder

    def budget(self, backend: BackendState, stage: Stage) -> float | None:
        """The stage's budget on `backend` now; None: unlimited (an unknown limit)."""
        p = self.policy()
        limit = p.limit(stage.name, stage.limit)
        if stage.name in SPEAKING and p.adaptive:
            adaptive = self._book(backend.url).adaptive.get(stage.name)
            if adaptive is not None:
                return adaptive if limit is None else min(limit, adaptive)
        return limit

    def speaking(self, backend: BackendState) -> int:
        """Requests on `backend` that hold the talker: they are bounded by its budget, so the backend's
        concurrency limit — the thinker's, adapted to TTFT — counts the others only."""
        return round(self._book(backend.url).use.get("talker", 0.0))

    def miss(self, ticket: Ticket, backend: BackendState) -> str | None:
        """The first stage `ticket` does not fit on `backend` (`stage_<name>`), None when all fit. A stage
        with nothing held takes any request: the one that exceeds its budget alone still runs."""
        book = self._book(backend.url)
        for stage in self._stages(ticket, backend):
            budget = self.budget(backend, stage)
            use = book.use.get(stage.name, 0.0)
            if budget is not None and use > 0 and use + self._hold(ticket, stage) > budget:
                return f"stage_{stage.name}"
        return None

    def commit(self, ticket: Ticket, backend: BackendState) -> None:
        book = self._book(backend.url)
        holds = tuple((s.name, self._hold(ticket, s)) for s in self._stages(ticket, backend))
        for name, amount in holds:
            book.use[name] = book.use.get(name, 0.0) + amount
            if name == "encoder":
                book.encoding[id(ticket)] = amount
        book.held[id(ticket)] = holds

    def started(self, ticket: Ticket, url: str) -> None:
        """The first byte came: the request's media are encoded (it leaves the encoder's batch)."""
        book = self._book(url)
        items = book.encoding.pop(id(ticket), None)
        if items is not None:
            book.use["encoder"] = book.use.get("encoder", 0.0) - items

    def release(self, ticket: Ticket, backend: BackendState) -> None:
        """Undo `commit`, and learn the speaking stages' budgets from the stream's real-time factor."""
        self.started(ticket, backend.url)
        book = self._book(backend.url)
        holds = book.held.pop(id(ticket), ())
        capacity = {s.name: s for s in self.kind.capacity(backend).stages}
        full = False  # a speaking stage was at its budget: a good stream then says the budget may grow
        speaking = 0.0  # streams speaking on the backend while this one ended, itself included
        for name, amount in holds:
            if name == "encoder":
                continue
            if name in SPEAKING and name in capacity:
                budget = self.budget(backend, capacity[name])
                full = full or (budget is not None and book.use.get(name, 0.0) + 1 > budget)
                speaking = max(speaking, book.use.get(name, 0.0))
            book.use[name] = book.use.get(name, 0.0) - amount
        if ticket.rtf is not None and speaking:
            self._adapt(backend, book, ticket.rtf, full, speaking)

    def _adapt(self, backend: BackendState, book: _Backend, rtf: float, full: bool, speaking: float) -> None:
        """A stream slower than the target: toward the streams that shared the vocoder with it, scaled by
        how far it missed (they all got 1/rtf of real time: target/rtf of them would have met the target),
        by at most `decrease` per stream; a fast one while a budget had no room left: one more."""
        p = self.policy()
        if not p.adaptive:
            return
        capacity = {s.name: s for s in self.kind.capacity(backend).stages}
        talker = capacity.get("talker")
        ceiling = None if talker is None else p.limit("talker", talker.limit)
        for name in SPEAKING:
            stage = capacity.get(name)
            if stage is None:
                continue
            limit = p.limit(name, stage.limit) or ceiling
            if limit is None:
                continue
            current = book.adaptive.get(name, float(limit))
            if rtf > p.rtf_target:
                fit = speaking * p.rtf_target / rtf
                current = max(float(p.min_speaking), min(current, max(fit, current * p.decrease)))
            elif full and rtf < p.rtf_target * p.grow_below:
                current = min(float(limit), current + 1.0)
            book.adaptive[name] = current

    def snapshot(self, backend: BackendState, head: Ticket | None) -> list[dict[str, Any]]:
        """Each stage's budget and use on `backend`, and whether it blocks the head request there."""
        book = self._book(backend.url)
        wanted = set() if head is None else {s.name for s in self._stages(head, backend)}
        out = []
        for stage in self.kind.capacity(backend).stages:
            budget = self.budget(backend, stage)
            use = book.use.get(stage.name, 0.0)
            blocks = (
                head is not None
                and stage.name in wanted
                and budget is not None
                and use > 0
                and use + self._hold(head, stage) > budget
            )
            out.append(
                {
                    "stage": stage.name,
                    "unit": stage.unit.value,
                    "limit": stage.limit,
                    "budget": None if budget is None or math.isinf(budget) else round(budget, 3),
                    "use": round(use, 3),
                    "blocks_head": blocks,
                }
            )
        return out
