"""What the replica shows of its state rather than of events: the gauges refreshed every second (and on
each scrape), the inputs of the alert rules, and the `/admin/state` document."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.admission.scheduler import PoolScheduler
from gateway.backends.pool import Pool
from gateway.livepolicy.reloader import PolicyHolder
from gateway.observability import record
from gateway.observability.rolling import SloTracker
from gateway.observability.rules import AlertInputs
from gateway.stages.measure import Measure


class LiveState:
    def __init__(
        self,
        policy: PolicyHolder,
        pools: Mapping[str, Pool],
        schedulers: Mapping[str, PoolScheduler],
        slo: SloTracker,
        measure: Measure,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.pools = pools
        self.schedulers = schedulers
        self.slo = slo
        self.measure = measure
        self.clock = clock

    def alert_inputs(self) -> AlertInputs:
        policy = self.policy.current
        targets = {c: (s.ttft_p99_s, s.tpot_p99_s) for c, s in policy.queue.classes.items()}
        return AlertInputs.build(
            queue_depth={name: len(s.queue) for name, s in self.schedulers.items()},
            backends=[b for pool in self.pools.values() for b in pool.backends],
            slo_stats=self.slo.snapshot(self.clock()).values(),
            slo_targets=targets,
            answered_total=self.measure.answered,
            rejected_total=self.measure.rejected,
        )

    def export_gauges(self) -> None:
        """Refresh the gauges that describe state rather than events."""
        policy = self.policy.current
        levels = policy.queue.priorities
        for name, sched in self.schedulers.items():
            snap = sched.snapshot()
            depth = dict.fromkeys(levels.levels, 0)
            oldest = dict.fromkeys(levels.levels, 0.0)
            for priority, n in snap["queue_by_priority"].items():  # one band holds every priority in it
                band = levels.band(int(priority))
                depth[band] = depth.get(band, 0) + int(n)
                oldest[band] = max(oldest.get(band, 0.0), snap["oldest_wait_by_priority"].get(priority, 0.0))
            for band, n in depth.items():
                record.record_queue(name, band, n, oldest[band])
            record.record_window(name, snap["window_s"])
        record.record_backends(b for pool in self.pools.values() for b in pool.backends)
        targets = {c: (s.ttft_p99_s, s.tpot_p99_s) for c, s in policy.queue.classes.items()}
        record.record_slo(self.slo.snapshot(self.clock()).values(), targets)

    def kv_usage(self, backend: str | None) -> float | None:
        """The scraped KV use of the backend of that name (any pool: it may have been lent)."""
        for pool in self.pools.values():
            for b in pool.backends:
                if b.name == backend:
                    return b.token_usage
        return None

    def admin_state(self) -> dict[str, Any]:
        """`/admin/state`: per pool its kind and its scheduler's snapshot, each backend with its health,
        scrape, the load signals it has not given (and what admission does without them) and capacity
        model (its stages and their limits, as its kind reads them)."""
        out: dict[str, Any] = {"pools": {}}
        for name, pool in self.pools.items():
            sched = self.schedulers[name]
            snap = sched.snapshot()
            book = sched.stages
            head = next(sched.queue.ordered(), None)
            for entry, b in zip(snap["backends"], pool.backends, strict=True):
                entry.update(
                    backend=b.name,
                    healthy=b.healthy,
                    circuit=b.circuit,
                    token_usage=b.token_usage,
                    running=b.running_reqs,
                    queued=b.queue_reqs,
                    missing_signals=pool.kind.missing_signals(b),
                    held=pool.holds.count(b.url),
                    audio={"gateway": b.audio.snapshot(), "server": b.server_audio},
                    stages=[
                        {"stage": s.name, "unit": s.unit, "limit": s.limit}
                        for s in pool.kind.capacity(b).stages
                    ]
                    if book is None
                    else book.snapshot(b, None if head is None else head.ticket),
                )
            out["pools"][name] = {"kind": pool.kind.name, **snap}
        return out
