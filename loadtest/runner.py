"""Drive one run: warm-up, then the measured phase, open loop or closed loop, in one or N processes.

Open loop means the send schedule is fixed before the run and never waits for responses: each send is
its own task, so a slow server shows up as latency, not as a lower offered rate. The client measures
its own send lag (actual − scheduled send time) so a saturated load generator is visible in results.

`max_in_flight` adds an outer admission layer in the harness itself: the schedule stays open loop, but at
most that many requests are at the server at once; the rest wait in the client, in arrival order. The
time each request is held is recorded as its `outer_wait` (never as send lag, never hidden). A request
still held when a duration-bounded measured phase ends (or, for a count-bounded one, when the drain
window closes) is recorded as shed by that layer (408, `outer_queue_timeout`), as a gateway's queue
timeout would answer it: the layer starts no new work once the offered load has stopped, and what is
already at the server gets the drain window to finish.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from loadtest.arrivals import constant_shape, schedule
from loadtest.client import PreparedRequest, send
from loadtest.http import HttpPool
from loadtest.media import MediaCache
from loadtest.progress import show
from loadtest.records import RequestRecord
from loadtest.scrape import Sample, Scraper
from loadtest.trace import load_trace
from loadtest.workload import RequestFactory, Workload


@dataclass(slots=True)
class RunOptions:
    url: str
    workload: Workload
    workers: int = 1
    scrape_targets: list[str] = field(default_factory=list)
    scrape_interval: float = 0.5
    gpus: float = 0.0
    progress: bool = False
    cache_dir: Path | None = None
    max_in_flight: int | None = None  # outer admission layer: at most this many at the server at once
    # extra headers for measured requests by their index in the phase (one worker): a replay that
    # changes how one request is handled, not which requests are sent (bench/family.py's counterfactual)
    headers_at: dict[int, dict[str, str]] = field(default_factory=dict)


@dataclass(slots=True)
class Plan:
    """One worker's share of a phase: send offsets with their requests, or a closed-loop user count."""

    phase: str
    offsets: list[float]
    requests: list[PreparedRequest] | None = None
    concurrency: int = 0
    duration: float = 0.0
    count: int | None = None


def _share(total: int, worker: int, workers: int) -> int:
    return total // workers + (1 if worker < total % workers else 0)


def plan_worker(w: Workload, worker: int, workers: int) -> list[Plan]:
    """Warm-up and measured plans for one worker, in wall time (compressed by the workload's time scale)."""
    s = w.time_scale
    plans = []
    if w.warmup.duration > 0 and (w.warmup.count is None or w.warmup.count > 0):
        warm = constant_shape(w.warmup.rate).compressed(s)
        offsets = schedule(
            warm,
            duration=w.warmup.duration / s,
            count=w.warmup.count,
            seed=w.seed + 1,
            worker=worker,
            workers=workers,
        )
        plans.append(Plan("warmup", offsets, duration=w.warmup.duration / s, count=w.warmup.count))
    if w.trace:
        rows = load_trace(w.trace, w.trace_speed * s)[worker::workers]
        rows = [r for r in rows if r[0] < w.duration / s][: w.count]
        plans.append(
            Plan("measured", [t for t, _ in rows], [req for _, req in rows], duration=w.duration / s)
        )
    elif w.arrivals.concurrency:
        users = _share(w.arrivals.concurrency, worker, workers)
        count = None if w.count is None else _share(w.count, worker, workers)
        plans.append(Plan("measured", [], concurrency=users, duration=w.duration / s, count=count))
    else:
        shape = w.arrivals.build(w.duration).compressed(s)
        offsets = schedule(
            shape,
            duration=w.duration / s,
            count=w.count,
            process=w.arrivals.process,
            burstiness=w.arrivals.burstiness,
            seed=w.seed,
            worker=worker,
            workers=workers,
        )
        plans.append(Plan("measured", offsets, duration=w.duration / s, count=w.count))
    return plans


class Worker:
    """Executes plans against one URL from one event loop, appending records as requests are sent."""

    def __init__(self, opts: RunOptions, worker: int, start: float, media: MediaCache | None = None) -> None:
        self.opts = opts
        self.worker = worker
        self.start = start
        self.pool = HttpPool(opts.url)
        media = media or MediaCache(opts.cache_dir, opts.workload.seed)
        self.factory = RequestFactory(opts.workload, media, worker)
        self.records: list[RequestRecord] = []
        self._tasks: set[asyncio.Task[RequestRecord]] = set()
        self._held: set[asyncio.Task[RequestRecord]] = set()  # waiting for the outer cap
        cap = opts.max_in_flight
        self._gate = None if cap is None else asyncio.Semaphore(max(1, _share(cap, worker, opts.workers)))

    def _launch(self, req: PreparedRequest, phase: str, scheduled: float) -> asyncio.Task[RequestRecord]:
        rec = RequestRecord(phase=phase, worker=self.worker, scheduled=scheduled)
        self.records.append(rec)
        w = self.opts.workload
        deadline = w.timeout / w.time_scale
        gate = self._gate
        coro = (
            send(self.pool, req, rec, self.start, deadline) if gate is None else self._gated(gate, req, rec)
        )
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if gate is not None:
            self._held.add(task)
            task.add_done_callback(self._held.discard)
        return task

    async def _gated(
        self, gate: asyncio.Semaphore, req: PreparedRequest, rec: RequestRecord
    ) -> RequestRecord:
        """Send once the outer in-flight cap has room; the time held is the record's outer wait."""
        w = self.opts.workload
        held = time.perf_counter()
        try:
            await gate.acquire()
        except asyncio.CancelledError:
            now = time.perf_counter()
            rec.sent, rec.outer_wait, rec.e2e = now - self.start, now - held, 0.0
            rec.status, rec.error = 408, "outer_queue_timeout"
            raise
        task = asyncio.current_task()
        if task is not None:
            self._held.discard(task)
        try:
            rec.outer_wait = time.perf_counter() - held
            return await send(self.pool, req, rec, self.start, w.timeout / w.time_scale)
        finally:
            gate.release()

    async def open_loop(self, plan: Plan, origin: float) -> None:
        reqs = plan.requests
        extra = self.opts.headers_at if plan.phase == "measured" else {}
        for i, off in enumerate(plan.offsets):
            req = reqs[i] if reqs is not None else self.factory.next()  # built before the wait: no lag
            if i in extra:
                req = replace(req, headers={**req.headers, **extra[i]})
            due = origin + off
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            self._launch(req, plan.phase, due - self.start)

    async def closed_loop(self, plan: Plan, origin: float) -> None:
        end = origin + plan.duration
        issued = 0

        async def user() -> None:
            nonlocal issued
            while time.perf_counter() < end and (plan.count is None or issued < plan.count):
                issued += 1
                req = self.factory.next()
                await self._launch(req, plan.phase, time.perf_counter() - self.start)

        await asyncio.gather(*(user() for _ in range(plan.concurrency)))

    async def run(self, plans: list[Plan]) -> list[RequestRecord]:
        origin = self.start
        scale = self.opts.workload.time_scale
        for plan in plans:
            if plan.concurrency:
                await self.closed_loop(plan, origin)
            else:
                await self.open_loop(plan, origin)
                # A duration-bounded phase lasts its full duration even if its last send came early.
                if plan.count is None:
                    await asyncio.sleep(max(0.0, origin + plan.duration - time.perf_counter()))
            origin = time.perf_counter()
        if plans and not plans[-1].concurrency and plans[-1].count is None:
            for task in list(self._held):  # the load has stopped: the outer layer sheds what it holds
                task.cancel()
        drain = self.opts.workload.drain
        if self._tasks:
            _, pending = await asyncio.wait(
                set(self._tasks), timeout=None if drain is None else drain / scale
            )
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.pool.aclose()
        return self.records


def expected_wall(w: Workload) -> float:
    return (w.warmup.duration + w.duration) / w.time_scale


def _worker_main(opts: RunOptions, worker: int, workers: int, start_wall: float) -> list[RequestRecord]:
    """Entry point of one worker process; all workers share the same wall-clock start."""
    plans = plan_worker(opts.workload, worker, workers)

    async def go() -> list[RequestRecord]:
        start = time.perf_counter() + (start_wall - time.time())
        runner = Worker(opts, worker, start)
        runner.factory.prewarm()  # reads the parent's disk cache: fast
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        return await runner.run(plans)

    return asyncio.run(go())


async def _run_processes(opts: RunOptions, start: float) -> list[RequestRecord]:
    """N spawned worker processes, each with its own seed stream and 1/N of the rate."""
    n = opts.workers
    start_wall = time.time() + (start - time.perf_counter())
    ctx = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    with ctx.Pool(n) as pool:
        pending = [pool.apply_async(_worker_main, (opts, k, n, start_wall)) for k in range(n)]
        results = await asyncio.gather(*(loop.run_in_executor(None, p.get) for p in pending))
    return [r for part in results for r in part]


async def execute(opts: RunOptions) -> tuple[list[RequestRecord], list[Sample]]:
    """Run warm-up and measured phases while scraping backend metrics; returns raw records and samples."""
    w = opts.workload
    media = MediaCache(opts.cache_dir, w.seed)
    RequestFactory(w, media).prewarm()
    # Spawned workers need time to import before the common start; one worker starts almost at once.
    start = time.perf_counter() + (0.05 if opts.workers == 1 else 1.0 + 0.5 * opts.workers)
    stop = asyncio.Event()
    scraper = Scraper(opts.scrape_targets, start, opts.scrape_interval)
    background = [asyncio.create_task(scraper.run(stop))] if opts.scrape_targets else []
    try:
        if opts.workers == 1:
            worker = Worker(opts, 0, start, media)
            if opts.progress:
                background.append(
                    asyncio.create_task(show(worker.records, start, expected_wall(w), w.time_scale, stop))
                )
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            records = await worker.run(plan_worker(w, 0, 1))
        else:
            records = await _run_processes(opts, start)
    finally:
        stop.set()
        await asyncio.gather(*background)
    return records, scraper.samples
