"""Live progress on stderr (rich): phase, counts, recent throughput and P99s while a run is going."""

from __future__ import annotations

import asyncio
import contextlib
import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from loadtest.metrics import percentile, tpot
from loadtest.records import RequestRecord

WINDOW = 2000  # recent records the live P99s look at; keeps each refresh cheap at 500+ req/s


def render(records: list[RequestRecord], start: float, expected: float, time_scale: float) -> Table:
    elapsed = time.perf_counter() - start
    recent = records[-WINDOW:]
    done = [r for r in recent if r.e2e is not None]
    ok = [r for r in done if r.ok]
    horizon = min(elapsed, 5.0)
    finished_5s = [r for r in ok if r.sent + (r.e2e or 0.0) >= elapsed - horizon]
    ttft = [r.ttft * 1000 * time_scale for r in ok if r.ttft is not None]
    tpots = [t * 1000 * time_scale for r in ok if (t := tpot(r)) is not None]
    lags = [r.send_lag * 1000 for r in recent]
    phase = records[-1].phase if records else "starting"
    in_flight = sum(r.e2e is None for r in recent)
    table = Table(title=f"omnigate loadtest — {phase}", show_header=False, box=None)
    rows = [
        ("elapsed", f"{elapsed:6.1f} s / ~{expected:.0f} s"),
        ("sent / in flight", f"{len(records)} / {in_flight}"),
        ("failed (recent)", str(len(done) - len(ok))),
        ("throughput (5 s)", f"{len(finished_5s) / horizon / time_scale:.1f} req/s" if horizon > 0 else "-"),
        ("TTFT P99", f"{percentile(ttft, 99):.0f} ms" if ttft else "-"),
        ("TPOT P99", f"{percentile(tpots, 99):.1f} ms" if tpots else "-"),
        ("send lag P99", f"{percentile(lags, 99):.2f} ms" if lags else "-"),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


async def show(
    records: list[RequestRecord], start: float, expected: float, time_scale: float, stop: asyncio.Event
) -> None:
    """Refresh twice a second until `stop` is set."""
    with Live(console=Console(stderr=True), refresh_per_second=2, transient=True) as live:
        while not stop.is_set():
            live.update(render(records, start, expected, time_scale))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)
