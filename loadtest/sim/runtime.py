"""The async shell around the pure engine: one loop task per app that runs steps in virtual time and
sleeps the scaled wall time of each, and per-request handles that wake waiting HTTP handlers.

Virtual time is anchored to wall time at start (v = (wall − w0)·K). Arrivals are stamped with that
clock; the engine runs steps back to back while it has work and the loop sleeps until each step's end
in wall time. If the CPU falls behind, the engine lags but its numbers stay those of the schedule.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from loadtest.sim.engine import Engine, SimRequest, StepResult
from loadtest.sim.metrics import SimMetrics


class VirtualClock:
    def __init__(self, time_scale: float) -> None:
        self.scale = time_scale
        self._wall0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._wall0) * self.scale

    def wall_delay(self, virtual_t: float) -> float:
        return max(0.0, virtual_t / self.scale - (time.monotonic() - self._wall0))

    async def sleep(self, virtual_s: float) -> None:
        await asyncio.sleep(virtual_s / self.scale)


class Handle:
    """What an HTTP handler waits on: the engine's request plus a wake-up event."""

    def __init__(self, req: SimRequest) -> None:
        self.req = req
        self.changed = asyncio.Event()

    @property
    def finished(self) -> bool:
        return self.req.finished_at is not None

    async def progress(self) -> AsyncIterator[int]:
        """Yield the total number of tokens generated each time it grows; ends when the request ends,
        after yielding what was made while the reader was away (a slow client, a stream whose headers
        wait for its first event), so the last tokens are never dropped."""
        seen = 0
        while True:
            await self.changed.wait()
            self.changed.clear()
            if self.req.generated > seen:
                seen = self.req.generated
                yield seen
            if self.finished:
                if self.req.generated > seen:
                    yield self.req.generated
                return


class EngineRunner:
    def __init__(self, engine: Engine, clock: VirtualClock, metrics: SimMetrics) -> None:
        self.engine = engine
        self.clock = clock
        self.metrics = metrics
        self.handles: dict[str, Handle] = {}
        self.peak_requests = 0  # most requests in the engine at once (waiting or running), since start
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def sync_idle_clock(self) -> None:
        if not self.engine.has_work():
            self.engine.advance_to(self.clock.now())

    def submit(self, req: SimRequest) -> Handle:
        """Queue a request stamped with the current virtual time; raises EngineError when refused.
        A waiting request it evicts (priority scheduling, full queue) ends at once with its error."""
        self.sync_idle_clock()
        req.arrival = self.clock.now()
        evicted = self.engine.submit(req)
        if evicted is not None:
            self._ended(evicted)
        handle = self.handles[req.rid] = Handle(req)
        engine = self.engine
        self.peak_requests = max(self.peak_requests, len(engine.waiting) + engine.num_running)
        self._wake.set()
        return handle

    def abort(self, rid: str) -> bool:
        handle = self.handles.pop(rid, None)
        req = self.engine.abort(rid)
        if req is None:
            return False
        self.metrics.on_left(req)
        if handle is not None:
            handle.changed.set()
        return True

    def _ended(self, req: SimRequest) -> None:
        """A request the engine ended outside a step (evicted from a full queue): count it, wake it."""
        self.metrics.on_aborted(req)
        handle = self.handles.get(req.rid)
        if handle is not None:
            handle.changed.set()

    def release(self, handle: Handle) -> None:
        self.handles.pop(handle.req.rid, None)

    async def _run(self) -> None:
        while True:
            self.sync_idle_clock()
            t_next = self.engine.next_event_time()
            if t_next is None or self.engine.is_crashed():
                await self._idle(self.engine.crashed_until if self.engine.is_crashed() else None)
                continue
            if t_next > self.engine.now:
                self.engine.advance_to(t_next)
            result = self.engine.step()
            if result is None:
                await self._idle(None)
                continue
            delay = self.clock.wall_delay(result.end)
            await asyncio.sleep(delay)  # sleep(0) when lagging still yields to the handlers
            self._publish(result)

    async def _idle(self, until: float | None) -> None:
        self._wake.clear()
        timeout = None if until is None else self.clock.wall_delay(until) + 1e-3
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _publish(self, result: StepResult) -> None:
        self.metrics.on_step(result)
        for req in (*result.emitted, *result.failed):
            handle = self.handles.get(req.rid)
            if handle is not None:
                handle.changed.set()
