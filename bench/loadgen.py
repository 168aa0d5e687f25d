"""Can one load-generator process drive ≥ 500 streaming req/s without being the bottleneck?

Starts a zero-latency SSE server (raw asyncio, in its own process so it does not share the client's
core), runs the harness' open-loop client against it at a Poisson rate, and prints the achieved rate
and the client's send-lag P99 (actual − scheduled send). Target: achieved ≈ offered, lag P99 < 5 ms.

    .venv/bin/python -m bench.loadgen [--rate 500] [--duration 10] [--workers 1] [--tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

from loadtest.ports import free_port
from loadtest.results import build_result
from loadtest.runner import RunOptions, execute
from loadtest.workload import load_workload


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def serve_forever(port: int, tokens: int) -> None:
    """HTTP/1.1 keep-alive server answering every POST with one chunked SSE stream of `tokens` tokens."""
    events = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    events += b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n' * tokens
    events += b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":%d}}\n\n' % tokens
    events += b"data: [DONE]\n\n"
    response = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    response += _chunk(events) + b"0\r\n\r\n"

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                writer.write(response)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=500.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--tokens", type=int, default=8)
    args = p.parse_args()
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(
        target=serve_forever, args=(port, args.tokens), daemon=True
    )
    server.start()
    time.sleep(1.0)
    w = load_workload(
        None,
        {"mix": {"text": 1}, "arrivals.rate": args.rate, "duration": args.duration, "warmup.duration": 1,
         "warmup.rate": 50, "prompt_tokens": {"dist": "fixed", "value": 64},
         "output_tokens": {"dist": "fixed", "value": args.tokens}, "seed": 1},
    )  # fmt: skip
    try:
        with tempfile.TemporaryDirectory() as cache:
            opts = RunOptions(
                url=f"http://127.0.0.1:{port}", workload=w, workers=args.workers, cache_dir=Path(cache)
            )
            records, samples = asyncio.run(execute(opts))
            res = build_result(records, samples, opts)
    finally:
        server.terminate()
        server.join(5)
    s, c = res["summary"], res["client"]
    lag = c["send_lag_ms"]
    print(
        f"offered {args.rate:.0f} req/s × {args.duration:.0f} s, {args.workers} worker(s), "
        f"{args.tokens} tokens/stream"
    )
    print(f"sent {c['sent']}  completed {s['completed']}  errors {s['errors']}")
    print(
        f"achieved send rate {c['offered_rate_wall']:.1f} req/s, "
        f"completion rate {s['request_throughput']:.1f} req/s"
    )
    print(f"send lag  P50 {lag['p50']:.2f} ms  P99 {lag['p99']:.2f} ms  max {lag['max']:.2f} ms")
    ok = lag["p99"] < 5.0 and c["offered_rate_wall"] >= 0.95 * args.rate and s["errors"] == 0
    print("PASS" if ok else "FAIL", "(target: achieved ≥ 95 % of offered, lag P99 < 5 ms, no errors)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
