"""The async shell around the pure pipeline: one loop task that runs each stage step once the virtual clock
reaches its start, and releases the step's events to the waiting HTTP handlers when the clock reaches their
time (a step's outputs exist only at its end).

A step is never started ahead of the clock, so a request that arrives while a stage is idle can still join its
next batch, exactly as on the real server. If the CPU falls behind, steps start late in wall time but keep the
virtual times the schedule gives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import deque
from collections.abc import AsyncIterator

from loadtest.sim.omni.pipeline import Event, Job, OmniPipeline
from loadtest.sim.runtime import VirtualClock


class JobHandle:
    """What an HTTP handler reads: the job's events in time order. `attached` is the coordinator's completion
    future (pending_completions): true while a handler still waits for this request."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.events: deque[Event] = deque()
        self.changed = asyncio.Event()
        self.attached = True

    async def stream(self) -> AsyncIterator[Event]:
        """Every event until the request ends (its `done` or `failed` event is the last)."""
        while True:
            while self.events:
                event = self.events.popleft()
                yield event
                if event.kind in ("done", "failed"):
                    return
            self.changed.clear()
            await self.changed.wait()


class PipelineRunner:
    def __init__(self, pipeline: OmniPipeline, clock: VirtualClock) -> None:
        self.pipeline = pipeline
        self.clock = clock
        self.handles: dict[str, JobHandle] = {}
        self._pending: list[tuple[float, int, Event]] = []
        self._ending = 0  # end events computed but not yet due: those requests are still tracked
        self._seq = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="omni-sim-pipeline")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, job: Job) -> JobHandle:
        """Stamp the job with the current virtual time and enter it; raises SubmitRefused."""
        job.arrival = self.clock.now()
        self.pipeline.submit(job)
        handle = self.handles[job.rid] = JobHandle(job)
        self._wake.set()
        return handle

    def abort(self, rid: str) -> None:
        self.pipeline.abort(rid, self.clock.now())
        self.handles.pop(rid, None)
        self._wake.set()

    def detach(self, handle: JobHandle) -> None:
        """The handler stopped waiting (response sent or client gone); the job itself runs on."""
        handle.attached = False
        if handle.job.finished_at is not None:
            self.handles.pop(handle.job.rid, None)

    @property
    def pending_completions(self) -> int:
        return sum(1 for h in self.handles.values() if h.attached)

    @property
    def tracked(self) -> int:
        """Requests the coordinator still tracks at the current virtual time."""
        return len(self.pipeline.jobs) + self._ending

    async def _run(self) -> None:
        while True:
            now = self.clock.now()
            self._publish(now)
            t_next = self.pipeline.next_time()
            if t_next is not None and t_next <= now:
                record = self.pipeline.step()
                for event in record.events if record else []:
                    heapq.heappush(self._pending, (event.time, next(self._seq), event))
                    self._ending += event.kind in ("done", "failed")
                await asyncio.sleep(0)  # let handlers run between steps when the clock is behind
                continue
            head = self._pending[0][0] if self._pending else None
            due = min((t for t in (t_next, head) if t is not None), default=None)
            self._wake.clear()
            timeout = None if due is None else self.clock.wall_delay(due) + 1e-4
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    def _publish(self, now: float) -> None:
        while self._pending and self._pending[0][0] <= now:
            _, _, event = heapq.heappop(self._pending)
            self._ending -= event.kind in ("done", "failed")
            handle = self.handles.get(event.rid)
            if handle is None:
                continue
            handle.events.append(event)
            handle.changed.set()
            if event.kind in ("done", "failed") and not handle.attached:
                self.handles.pop(event.rid, None)
