"""The load generator: a raw-socket HTTP/1.1 keep-alive client in its own process, on uvloop.

It is cheaper per request than any of the servers it measures (no HTTP library, precomputed requests, an
incremental response parser), and it reports its own CPU use and — in open loop — how late it sent each
request against the schedule, so a reader can see when the client itself was the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import resource
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

from bench.common.servers import die_with_parent

DRAIN_S = 3.0
"""Open loop: how long answers to the last arrivals are awaited before they count as unfinished."""


@dataclass(frozen=True, slots=True)
class Load:
    """One measurement: closed loop (`rate` None: `concurrency` connections back to back) or open loop."""

    port: int
    request: bytes
    concurrency: int
    duration: float
    rate: float | None = None
    poisson: bool = True
    seed: int = 1


def http_request(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items()).encode()
    return (
        b"POST %s HTTP/1.1\r\nhost: 127.0.0.1:%d\r\ncontent-type: application/json\r\n%s"
        b"content-length: %d\r\n\r\n%s" % (path.encode(), port, extra, len(body), body)
    )


class _Client(asyncio.Protocol):
    """One keep-alive connection; `request()` resolves with (status, body or b"") at the response's end."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.keep = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.length = -1  # -1: still in the head; -2: chunked body
        self.pos = 0
        self.parts: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed mid-response"))

    def request(self, raw: bytes, keep_body: bool = False) -> asyncio.Future[tuple[int, bytes]]:
        if self.transport is None:
            raise ConnectionError("connection closed")
        self.keep = keep_body
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self.waiter

    def data_received(self, data: bytes) -> None:
        self.buf += data
        buf = self.buf
        if self.length == -1:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            self.status = int(head[9:12])
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                self.length = int(head[at + 17 : stop if stop > 0 else None])
            else:
                self.length = -2
            self.pos = end + 4
        if self.length >= 0:
            if len(buf) - self.pos >= self.length:
                self._done(bytes(buf[self.pos : self.pos + self.length]), self.pos + self.length)
            return
        while True:  # chunked: size line, data, CRLF; a zero-size chunk then CRLF ends it (no trailers)
            eol = buf.find(b"\r\n", self.pos)
            if eol < 0:
                return
            size = int(buf[self.pos : eol].split(b";", 1)[0], 16)
            if len(buf) < eol + 2 + size + 2:
                return
            if size == 0:
                self._done(b"".join(self.parts), eol + 4)
                return
            if self.keep:
                self.parts.append(bytes(buf[eol + 2 : eol + 2 + size]))
            self.pos = eol + 2 + size + 2

    def _done(self, body: bytes, end: int) -> None:
        del self.buf[:end]
        status = self.status
        self._reset()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((status, body if self.keep else b""))


async def _connect(port: int) -> _Client:
    _, proto = await asyncio.get_running_loop().create_connection(_Client, "127.0.0.1", port)
    return proto


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class _Recorder:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.lags: list[float] = []
        self.errors = 0
        self.unfinished = 0
        self.statuses: dict[int, int] = {}

    def record(self, status: int, seconds: float, lag: float | None = None) -> None:
        if status != 200:
            self.errors += 1
            self.statuses[status] = self.statuses.get(status, 0) + 1
            return
        self.latencies.append(seconds)
        if lag is not None:
            self.lags.append(lag)


async def _closed(load: Load, rec: _Recorder, end: float) -> None:
    async def loop_one() -> None:
        conn = await _connect(load.port)
        clock = time.perf_counter
        try:
            while clock() < end:
                t0 = clock()
                try:
                    status, _ = await conn.request(load.request)
                except ConnectionError:
                    rec.record(0, 0.0)
                    conn = await _connect(load.port)
                    continue
                rec.record(status, clock() - t0)
        finally:
            if conn.transport is not None:
                conn.transport.close()

    await asyncio.gather(*(loop_one() for _ in range(load.concurrency)))


async def _open(load: Load, rec: _Recorder, end: float) -> None:
    """Arrivals on a schedule; a free keep-alive connection per request, a new one when none is free.

    Requests still unanswered `DRAIN_S` after the last arrival count as unfinished; every connection
    is closed at the end, so an overloaded target does not carry a backlog into the next measurement.
    """
    assert load.rate is not None
    conns = [await _connect(load.port) for _ in range(load.concurrency)]
    idle = list(conns)
    tasks: set[asyncio.Task[None]] = set()
    clock = time.perf_counter
    rng = random.Random(load.seed)

    async def one(scheduled: float) -> None:
        if idle:
            conn = idle.pop()
        else:
            conn = await _connect(load.port)
            conns.append(conn)
        t0 = clock()
        try:
            status, _ = await conn.request(load.request)
        except ConnectionError:
            rec.record(0, 0.0)
            return
        rec.record(status, clock() - t0, t0 - scheduled)
        idle.append(conn)

    at = clock() + rng.expovariate(load.rate) if load.poisson else clock()
    while at < end:
        delay = at - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        at += rng.expovariate(load.rate) if load.poisson else 1.0 / load.rate
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=DRAIN_S)
        rec.unfinished = len(pending)
        for task in pending:
            task.cancel()
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()


async def _run(load: Load) -> dict[str, Any]:
    rec = _Recorder()
    runner = _closed if load.rate is None else _open
    start, cpu_start = time.perf_counter(), _cpu()
    await runner(load, rec, start + load.duration)
    elapsed = time.perf_counter() - start
    lat = sorted(rec.latencies)
    lags = sorted(rec.lags)
    return {
        "count": len(lat),
        "errors": rec.errors + rec.unfinished,
        "error_statuses": {**rec.statuses, **({"unfinished": rec.unfinished} if rec.unfinished else {})},
        "elapsed": elapsed,
        "rps": len(lat) / elapsed if elapsed > 0 else 0.0,
        "p50": _percentile(lat, 0.50),
        "p90": _percentile(lat, 0.90),
        "p99": _percentile(lat, 0.99),
        "lag_p50": _percentile(lags, 0.50),
        "lag_p99": _percentile(lags, 0.99),
        "client_cpu": (_cpu() - cpu_start) / elapsed if elapsed > 0 else 0.0,
    }


async def _fetch(port: int, request: bytes) -> tuple[int, bytes]:
    conn = await _connect(port)
    try:
        return await asyncio.wait_for(conn.request(request, keep_body=True), 10)
    finally:
        if conn.transport is not None:
            conn.transport.close()


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _worker(pipe: Connection, parent_end: Connection) -> None:
    """Serve ("run", Load) and ("fetch", port, request) commands until ("stop",) or the pipe closes."""
    parent_end.close()  # forked copy: without closing it, the parent's death would never reach us as EOF
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # undo the parent's handler, inherited by fork
    die_with_parent()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    while True:
        try:
            cmd = pipe.recv()
        except EOFError:
            return
        try:
            if cmd[0] == "run":
                pipe.send(("ok", asyncio.run(_run(cmd[1]))))
            elif cmd[0] == "fetch":
                pipe.send(("ok", asyncio.run(_fetch(cmd[1], cmd[2]))))
            else:
                return
        except Exception as e:  # reported to the parent, which stops the benchmark with it
            pipe.send(("error", f"{type(e).__name__}: {e}"))


class LoadClient:
    """Handle on the load-generator process."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("fork")
        self._pipe, child = ctx.Pipe()
        self._proc = ctx.Process(target=_worker, args=(child, self._pipe), daemon=True, name="bench-load")
        self._proc.start()
        child.close()

    def _call(self, *cmd: Any, timeout: float) -> Any:
        self._pipe.send(cmd)
        if not self._pipe.poll(timeout):
            raise TimeoutError(f"load client did not answer {cmd[0]!r} within {timeout:g} s")
        kind, value = self._pipe.recv()
        if kind == "error":
            raise RuntimeError(f"load client: {value}")
        return value

    def run(self, load: Load) -> dict[str, Any]:
        return dict(self._call("run", load, timeout=load.duration + 30))

    def fetch(self, port: int, request: bytes) -> tuple[int, bytes]:
        status, body = self._call("fetch", port, request, timeout=30)
        return int(status), bytes(body)

    def close(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(OSError):
                self._pipe.send(("stop",))
            self._proc.join(2)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(2)
        self._pipe.close()
