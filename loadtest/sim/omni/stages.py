"""The two kinds of GPU stage in the pipeline model, each stepped on its own virtual clock.

`ARStage` wraps the plain simulator's continuous-batching `Engine` (thinker, talker). `BatchStage` is a FIFO
server that runs up to `max_batch` queued items per forward: the encoders (32) and code2wav (1: its GPU lock).
Both answer `next_start()` (when their next step could begin, None when idle) and `run()` (do that step).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from loadtest.sim.engine import Engine, StepResult


@dataclass(frozen=True, slots=True)
class Work:
    """One request's item at a batch stage: `sizes` feed the cost (tokens per image or clip, frames per
    vocoder window); `new_frames` is the audio a vocoder window adds."""

    rid: str
    sizes: tuple[int, ...]
    arrival: float
    new_frames: int = 0


@dataclass(frozen=True, slots=True)
class BatchStep:
    start: float
    end: float
    items: list[Work]


class BatchStage:
    def __init__(self, name: str, cost: Callable[[list[int]], float], max_batch: int, start: float) -> None:
        self.name = name
        self.cost = cost
        self.max_batch = max_batch
        self.free_at = start
        self.queue: deque[Work] = deque()
        self.in_flight: list[Work] = []
        self.busy_s = 0.0

    def submit(self, work: Work) -> None:
        self.queue.append(work)

    def drop(self, rid: str) -> None:
        self.queue = deque(w for w in self.queue if w.rid != rid)

    def next_start(self) -> float | None:
        return max(self.free_at, self.queue[0].arrival) if self.queue else None

    def run(self) -> BatchStep:
        start = max(self.free_at, self.queue[0].arrival)
        batch: list[Work] = []
        while self.queue and len(batch) < self.max_batch and self.queue[0].arrival <= start:
            batch.append(self.queue.popleft())
        self.free_at = start + self.cost([n for w in batch for n in w.sizes])
        self.busy_s += self.free_at - start
        self.in_flight = batch
        return BatchStep(start, self.free_at, batch)

    def in_flight_at(self, t: float) -> int:
        """Items of the batch that is still computing at virtual time t."""
        return len(self.in_flight) if t < self.free_at else 0


class ARStage:
    """An engine plus the bookkeeping the pipeline needs: a request the engine cannot place right now
    (`step()` returned nothing) waits for the next submit or abort instead of spinning."""

    def __init__(self, name: str, engine: Engine) -> None:
        self.name = name
        self.engine = engine
        self.stalled = False
        self.busy_s = 0.0

    def next_start(self) -> float | None:
        if self.stalled:
            return None
        t = self.engine.next_event_time()
        return None if t is None else max(t, self.engine.now)

    def run(self) -> StepResult | None:
        t = self.next_start()
        assert t is not None, "run() on an idle stage"
        self.engine.advance_to(t)
        result = self.engine.step()
        if result is None:
            self.stalled = True
        else:
            self.busy_s += result.end - result.start
        return result

    def touched(self) -> None:
        self.stalled = False
