"""The demo's workload: open-loop Poisson arrivals over the configured streams, bounded in time, count and
in flight. It reuses the load-test harness (request factory, synthetic media, streaming client) rather
than a second client."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

from pydantic import ValidationError

from gateway.settings.schema import describe
from loadtest.arrivals import constant_shape, schedule
from loadtest.client import send
from loadtest.http import HttpPool
from loadtest.media import MediaCache
from loadtest.records import RequestRecord
from loadtest.workload import RequestFactory, Workload
from omnigate.demo.plan import DemoError, DemoSettings


class Load:
    def __init__(self, settings: DemoSettings, url: str, seed: int = 0) -> None:
        self.settings = settings
        self.url = url
        self.rng = random.Random(seed)
        self.records: list[RequestRecord] = []
        self.skipped = 0
        self.factories: list[RequestFactory] = []
        media = MediaCache(seed=seed)
        for i, stream in enumerate(settings.streams):
            try:
                w = Workload.model_validate({"model": settings.model, **stream.workload})
            except ValidationError as e:
                raise DemoError(describe(e, f"demo.streams.{i}.workload")) from None
            self.factories.append(RequestFactory(w, media, worker=i))
        self.shares = [s.share for s in settings.streams]

    def prewarm(self) -> None:
        """Render the synthetic images up front so no send waits on Pillow."""
        for f in self.factories:
            f.prewarm()

    async def run(self, start: float, window_s: float, stop: asyncio.Event) -> None:
        s = self.settings
        offsets = schedule(constant_shape(s.rate), duration=window_s, count=int(s.rate * window_s) + 1)
        pool = HttpPool(self.url)
        tasks: set[asyncio.Task[RequestRecord]] = set()
        try:
            for offset in offsets:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), start + offset - time.perf_counter())
                if stop.is_set():
                    break
                if len(tasks) >= s.max_in_flight:
                    self.skipped += 1
                    continue
                req = self.rng.choices(self.factories, weights=self.shares)[0].next()
                rec = RequestRecord()
                self.records.append(rec)
                task = asyncio.create_task(send(pool, req, rec, start, s.request_timeout_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            stopper = asyncio.ensure_future(stop.wait())
            deadline = time.perf_counter() + s.drain_s
            while tasks and not stop.is_set() and (left := deadline - time.perf_counter()) > 0:
                await asyncio.wait({*tasks, stopper}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
        finally:
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await pool.aclose()
