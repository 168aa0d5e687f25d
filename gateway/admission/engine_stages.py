"""Staged capacity: per backend, a budget per stage of its engine, and what each admitted request holds.

A staged server (sglang-omni) runs a request through stages with their own limits (the backend's kind
lists them: `BackendKind.capacity`, and which of them a request holds: `stages_of`). `StageBook` is a
`Budget` and a `FirstByte` listener (families.py): the dispatcher asks its `miss` before it places a
request and tells it `commit`, `started` and `release`:

- **requests** stages (thinker, talker): a request holds one place from dispatch to release. Budget: the
  server's cap (or the policy's), and for the talker an adaptive budget (below).
- **audio seconds per second** (code2wav, the serial vocoder, the end of the speaking side): a request
  that speaks holds one real-time stream — it needs one audio second per wall second to play without
  stutter — so the budget is the audio seconds per second the backend makes, in streams: a speaking
  request is admitted while the streams held, itself included, stay within the rate measured × `rtf_target`.
  The rate is measured, not assumed: the sum of the speeds its streams get now (each stream's audio over its
  last few chunks, gateway/speech/meter.py), whichever stage bounds it (the vocoder, or a talker and code
  predictor that make frames for every stream in turn); the last measured rate stands while no stream
  shows one; before any was, only the configured rate and the talker's budget bound the streams (a
  server whose streams never reach a client — text answers through the snapshot's talker — is never
  measured). The measured rate grows
  with the streams (a stage shared by more streams makes more in all, each less), so admission finds the
  real-time level from below, within a few chunks, instead of learning it from streams that have ended.
  A configured rate (policy or server) caps it.
- **items per batch** (the media encoders): a request's media items are held from dispatch until its first
  byte (its encoding is done by then); the items waiting must fit one batch, and a request with more items
  than a batch goes alone.

Adaptive: the thinker's budget is the server's cap; the backend's adaptive concurrency limit (limits/: by
default aimed at the classes' TPOT objective) counts the requests that do not speak — a speaking request
holds a talker place for as long as it speaks, seconds after its text is done, and would starve text of
slots. The talker's budget
follows the real-time factor of the streams that end: a stream slower than `rtf_target` shrinks it toward
the number of streams that would have met it (those speaking × target / its RTF), by at most `decrease`
per stream and never below `min_speaking`; one well inside it (below `rtf_target × grow_below`) while the
budget had no room for another grows it by one, up to its limit.
A speech request that does not fit the talker or code2wav is passed over (text behind it goes); one that
does not fit the thinker or the encoder blocks the head like any shared budget. Its time to first audio is
its time in the queue plus the time from dispatch to its first audio (the talker's prefill and one window
of frames: `first_audio_lag`, measured from the streams): the queue sheds it by a deadline that much
earlier, so none is dispatched too late to meet its SLO. The stage's name is the
reason `/admin/state` shows (`stage_talker`, …).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.admission.blocks import Block
from gateway.admission.decision import Decision
from gateway.admission.families import Ask
from gateway.admission.settings import StagePolicy
from gateway.backends.kinds.base import BackendKind, Stage, StageUnit
from gateway.backends.state import BackendState
from gateway.request.ticket import Ticket

TALKER, CODE2WAV = "talker", "code2wav"
LAG_WEIGHT = 0.2  # the EWMA weight of each stream's time from dispatch to first audio
SPEAKING = (TALKER, CODE2WAV)  # the stages whose pace is the stream's real-time factor


@dataclass(slots=True)
class _Backend:
    use: dict[str, float] = field(default_factory=dict)  # stage → what admitted requests hold
    adaptive: dict[str, float] = field(default_factory=dict)  # stage → adaptive budget (speaking stages)
    held: dict[int, tuple[tuple[str, float], ...]] = field(default_factory=dict)  # id(ticket) → holds
    encoding: dict[int, float] = field(default_factory=dict)  # id(ticket) → items until its first byte
    speakers: dict[int, Ticket] = field(default_factory=dict)  # id(ticket) → the tickets holding code2wav
    rate: float | None = None  # audio seconds per second last measured (None: never)


class StageBook:
    """The stage budgets of one pool's backends (one kind), and what the requests on them hold."""

    lasting = True

    def __init__(
        self,
        kind: BackendKind,
        policy: Callable[[], StagePolicy],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kind = kind
        self.policy = policy
        self.clock = clock
        self._backends: dict[str, _Backend] = {}
        self._lag: float | None = None  # seconds from dispatch to first audio, over the pool's streams

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

    def budget(self, backend: BackendState, stage: Stage, remember: bool = True) -> float | None:
        """The stage's budget on `backend` now; None: unlimited (an unknown limit). `remember`: see
        `measured_rate`."""
        p = self.policy()
        limit = p.limit(stage.name, stage.limit)
        if stage.name == CODE2WAV and p.adaptive:
            rate = self.measured_rate(backend, remember)
            if rate is None:
                return limit
            return rate * p.rtf_target if limit is None else min(limit, rate * p.rtf_target)
        if stage.name == TALKER and p.adaptive:
            adaptive = self._book(backend.url).adaptive.get(stage.name)
            if adaptive is not None:
                return adaptive if limit is None else min(limit, adaptive)
        return limit

    def measured_rate(self, backend: BackendState, remember: bool = True) -> float | None:
        """Audio seconds per second the backend makes for its streams now (the sum of their speeds), or
        the last rate measured while none shows one; None before any was. `remember=False`: a read that
        leaves the last rate as it was (`/admin/state`)."""
        book = self._book(backend.url)
        now = self.clock()
        speeds = [
            speed
            for ticket in book.speakers.values()
            if ticket.speech is not None and (speed := ticket.speech.speed(now)) is not None
        ]
        if not speeds:
            return book.rate
        if remember:
            book.rate = sum(speeds)
        return sum(speeds)

    def first_audio_lag(self, ticket: Ticket) -> float:
        """Seconds a request that speaks is expected to take from dispatch to its first audio (0 for one
        that does not, or before any stream was measured): how much earlier it must leave the queue."""
        if self._lag is None or CODE2WAV not in self.kind.stages_of(ticket):
            return 0.0
        return self._lag

    def speaking(self, backend: BackendState) -> int:
        """Requests on `backend` that hold the talker: they are bounded by its budget, so the backend's
        concurrency limit — the thinker's, adapted to the TPOT objective — counts the others only."""
        return round(self._book(backend.url).use.get("talker", 0.0))

    def miss(self, ask: Ask, backend: BackendState, ctx: Decision) -> Block | None:
        return self.full(ask.ticket, backend)

    def full(self, ticket: Ticket, backend: BackendState) -> Block | None:
        """The first stage `ticket` does not fit on `backend`, None when all fit. A stage
        with nothing held takes any request: the one that exceeds its budget alone still runs."""
        book = self._book(backend.url)
        for stage in self._stages(ticket, backend):
            budget = self.budget(backend, stage)
            use = book.use.get(stage.name, 0.0)
            if budget is not None and use > 0 and use + self._hold(ticket, stage) > budget:
                return Block.stage(stage.name)
        return None

    def commit(self, ask: Ask, backend: BackendState, ctx: Decision) -> None:
        ticket = ask.ticket
        book = self._book(backend.url)
        holds = tuple((s.name, self._hold(ticket, s)) for s in self._stages(ticket, backend))
        for name, amount in holds:
            book.use[name] = book.use.get(name, 0.0) + amount
            if name == "encoder":
                book.encoding[id(ticket)] = amount
            elif name == CODE2WAV:
                book.speakers[id(ticket)] = ticket
        book.held[id(ticket)] = holds

    def started(self, ticket: Ticket, url: str, now: float) -> None:
        """The first byte came: the request's media are encoded (it leaves the encoder's batch)."""
        book = self._book(url)
        items = book.encoding.pop(id(ticket), None)
        if items is not None:
            book.use["encoder"] = book.use.get("encoder", 0.0) - items

    def release(self, ticket: Ticket, backend: BackendState, now: float) -> None:
        """Undo `commit`, and learn the speaking stages' budgets from the stream's real-time factor."""
        self.started(ticket, backend.url, now)
        book = self._book(backend.url)
        holds = book.held.pop(id(ticket), ())
        if id(ticket) in book.speakers:
            self.measured_rate(backend)  # with this stream's last speed: the rate that stands after it
            del book.speakers[id(ticket)]
            if ticket.stream and ticket.first_audio_at is not None and ticket.dispatched_at is not None:
                lag = ticket.first_audio_at - ticket.dispatched_at
                self._lag = lag if self._lag is None else self._lag + LAG_WEIGHT * (lag - self._lag)
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
        """The talker's budget after a stream ended. Slower than the target: toward the streams that
        shared the talker with it, scaled by how far it missed (they all got 1/rtf of real time: target/rtf
        of them would have met the target), by at most `decrease` per stream; a fast one while the budget
        had no room left: one more."""
        p = self.policy()
        if not p.adaptive:
            return
        talker = {s.name: s for s in self.kind.capacity(backend).stages}.get(TALKER)
        limit = None if talker is None else p.limit(TALKER, talker.limit)
        if limit is None:
            return
        current = book.adaptive.get(TALKER, float(limit))
        if rtf > p.rtf_target:
            fit = speaking * p.rtf_target / rtf
            current = max(float(p.min_speaking), min(current, max(fit, current * p.decrease)))
        elif full and rtf < p.rtf_target * p.grow_below:
            current = min(float(limit), current + 1.0)
        book.adaptive[TALKER] = current

    def snapshot(self, backend: BackendState, head: Ticket | None) -> list[dict[str, Any]]:
        """Each stage's budget and use on `backend`, whether it blocks the head request there, and what was
        measured for it (code2wav: the audio seconds per second the backend's streams get; else None)."""
        book = self._book(backend.url)
        wanted = set() if head is None else {s.name for s in self._stages(head, backend)}
        out = []
        for stage in self.kind.capacity(backend).stages:
            budget = self.budget(backend, stage, remember=False)
            use = book.use.get(stage.name, 0.0)
            rate = self.measured_rate(backend, remember=False) if stage.name == CODE2WAV else None
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
                    "measured": None if rate is None else round(rate, 3),
                }
            )
        return out
