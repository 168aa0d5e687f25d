"""Hostile connections against the edge limits: memory and `/healthz` under two attacks, with the limits
off (the baseline: as uvicorn alone behaves) and with the gateway's defaults, in the same run.

- **unfinished headers**: `--attackers` connections (8), no key, each sending `--header-mb` (50) MB of one
  header that never ends, as fast as loopback takes it, then holding the connection `--hold-s`;
- **slow headers**: `--slow` connections (2,000), each sending a request line then one header byte every
  second, for `--slow-s` (20) seconds.

For each, the gateway's resident memory (peak during, and after the attackers are gone) is read from
/proc, `/healthz` is probed every 50 ms on its own kept-alive connection (p50 / p99 / max), and for the slow
attack, how many connections the gateway still held at the end. Everything is on 127.0.0.1, bounded in
bytes and time. Usage:

    .venv/bin/python -m bench.edge                 # ~2 min
    .venv/bin/python -m bench.edge --slow 500 --slow-s 12 --header-mb 10
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.common.servers import Procs, start_backend, start_omnigate

LIMITS_OFF = {"max_header_bytes": 1 << 30, "header_timeout_s": 3600, "max_connections": 1_000_000}
PROBE_EVERY_S = 0.05


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Sample:
    """What the monitor saw during one phase."""

    rss: list[float] = field(default_factory=list)
    healthz_ms: list[float] = field(default_factory=list)
    failed_probes: int = 0

    def pct(self, q: float) -> float:
        values = sorted(self.healthz_ms)
        return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def _healthz(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    assert head.startswith(b"HTTP/1.1 200"), head


async def monitor(port: int, pid: int, stop: asyncio.Event, sample: Sample) -> None:
    """Probe /healthz and read the RSS until `stop`."""
    conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
    while not stop.is_set():
        sample.rss.append(rss_mb(pid))
        start = time.perf_counter()
        try:
            if conn is None:
                conn = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.wait_for(_healthz(*conn), 5.0)
            sample.healthz_ms.append((time.perf_counter() - start) * 1000)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, AssertionError):
            sample.failed_probes += 1
            if conn is not None:
                conn[1].close()
            conn = None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PROBE_EVERY_S)
    if conn is not None:
        conn[1].close()


async def unfinished_headers(port: int, megabytes: int, hold_s: float) -> int:
    """One attacker: a header that never ends. Returns the bytes the gateway took before it closed."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = 0
    chunk = b"a" * 65536
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\nX-Endless: ")
        while sent < megabytes * 1_000_000:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
        await asyncio.sleep(hold_s)
    except OSError:
        pass  # cut by the gateway
    finally:
        writer.close()
    return sent


async def slow_headers(port: int, seconds: float, still_open: list[int]) -> None:
    """One slow client: a request line, then a header byte a second. Counts itself if never cut."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            await asyncio.sleep(1.0)
            if reader.at_eof():
                return
            writer.write(b"a")
            await writer.drain()
        if not reader.at_eof():
            still_open.append(1)
    except OSError:
        pass
    finally:
        writer.close()


async def phase(port: int, pid: int, attack: Callable[[], Awaitable[object]]) -> tuple[Sample, float, object]:
    """Run `attack` under the monitor; returns the sample, the RSS once the attackers are gone, and what
    the attack returned."""
    sample, stop = Sample(), asyncio.Event()
    watcher = asyncio.create_task(monitor(port, pid, stop, sample))
    result = await attack()
    await asyncio.sleep(1.0)
    after = rss_mb(pid)
    stop.set()
    await watcher
    return sample, after, result


async def measure(name: str, port: int, pid: int, args: argparse.Namespace) -> dict[str, str]:
    idle, _, _ = await phase(port, pid, lambda: asyncio.sleep(2.0))

    async def flood() -> list[int]:
        return await asyncio.gather(
            *(unfinished_headers(port, args.header_mb, args.hold_s) for _ in range(args.attackers))
        )

    big, big_after, sent = await phase(port, pid, flood)

    async def slow() -> int:
        still_open: list[int] = []
        await asyncio.gather(*(slow_headers(port, args.slow_s, still_open) for _ in range(args.slow)))
        return len(still_open)

    slow_sample, slow_after, held = await phase(port, pid, slow)
    accepted = statistics.mean(sent) / 1e6 if isinstance(sent, list) else float("nan")
    print(f"  {name}: done", flush=True)
    return {
        "RSS idle (MB)": f"{statistics.median(idle.rss):.0f}",
        "/healthz p50 / p99 idle (ms)": f"{idle.pct(0.5):.1f} / {idle.pct(0.99):.1f}",
        f"MB each of {args.attackers} attackers got sent": f"{accepted:.1f} of {args.header_mb}",
        "RSS peak / after, unfinished headers (MB)": f"{max(big.rss):.0f} / {big_after:.0f}",
        "/healthz p50 / p99, unfinished headers (ms)": f"{big.pct(0.5):.1f} / {big.pct(0.99):.1f}",
        f"of {args.slow} slow connections still open after {args.slow_s:g} s": str(held),
        "RSS peak / after, slow headers (MB)": f"{max(slow_sample.rss):.0f} / {slow_after:.0f}",
        "/healthz p50 / p99, slow headers (ms)": f"{slow_sample.pct(0.5):.1f} / {slow_sample.pct(0.99):.1f}",
        "/healthz probes failed": str(idle.failed_probes + big.failed_probes + slow_sample.failed_probes),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attackers", type=int, default=8)
    p.add_argument("--header-mb", type=int, default=50)
    p.add_argument("--hold-s", type=float, default=2.0)
    p.add_argument("--slow", type=int, default=2000)
    p.add_argument("--slow-s", type=float, default=20.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="omnigate-edge-") as tmp:
        procs = Procs(Path(tmp))
        try:
            backend = start_backend(procs)
            rows: dict[str, dict[str, str]] = {}
            for name, limits in (("limits off", LIMITS_OFF), ("defaults", None)):
                port = start_omnigate(procs, name, backend, access_log=False, limits=limits)
                print(f"{name}: attacking 127.0.0.1:{port}", flush=True)
                rows[name] = asyncio.run(measure(name, port, procs.procs[name].pid, args))
                procs.procs[name].terminate()
        finally:
            procs.close()
    names = list(rows)
    print(f"\n| | {' | '.join(names)} |\n|---|{'---:|' * len(names)}")
    for key in rows[names[0]]:
        print(f"| {key} | {' | '.join(rows[n][key] for n in names)} |")


if __name__ == "__main__":
    main()
