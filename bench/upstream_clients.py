"""CPU per request of candidate upstream HTTP clients, alone, against the zero-latency backend.

Why the gateway's upstream client is aiohttp: this measures each client used the way a proxy uses it
(keep-alive pool, POST, whole body or raw streamed bytes) at a fixed concurrency, in one process on uvloop,
and prints the process CPU per request. httpx is measured at both of its layers: the `AsyncClient`
(cookies, redirects, auth) and the bare `httpcore.AsyncConnectionPool` under it.

    .venv/bin/python -m bench.upstream_clients [--requests 3000] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import httpcore
import httpx
import orjson
import uvloop

from bench.common.servers import MODEL, STREAM_BODY, STREAM_CHUNKS, WHOLE_BODY, Procs, start_backend
from gateway.relay.upstream import Upstream

Fetch = Callable[[bytes], Awaitable[bytes]]
HEADERS = {"content-type": "application/json", "accept-encoding": "identity"}


def _payload(stream: bool) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": STREAM_CHUNKS}
    return orjson.dumps({**body, "stream": stream})


async def _httpx(url: str, limit: int) -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=limit), trust_env=False)

    async def fetch(payload: bytes) -> bytes:
        request = client.build_request("POST", url, content=payload, headers=HEADERS)
        response = await client.send(request, stream=True)
        try:
            return b"".join([chunk async for chunk in response.aiter_raw()])
        finally:
            await response.aclose()

    return fetch, client.aclose


async def _httpcore(url: str, limit: int) -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    pool = httpcore.AsyncConnectionPool(max_connections=limit)
    headers = [(k.encode(), v.encode()) for k, v in HEADERS.items()]

    async def fetch(payload: bytes) -> bytes:
        async with pool.stream("POST", url, headers=headers, content=payload) as response:
            return b"".join([chunk async for chunk in response.aiter_stream()])

    return fetch, pool.aclose


async def _aiohttp(url: str, limit: int) -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("User-Agent",),
    )

    async def fetch(payload: bytes) -> bytes:
        async with session.post(url, data=payload, headers=HEADERS) as response:
            return b"".join([chunk async for chunk in response.content.iter_any()])

    return fetch, session.close


async def _upstream(url: str, limit: int) -> tuple[Fetch, Callable[[], Awaitable[None]]]:
    client = Upstream(max_connections=limit, max_keepalive=limit)

    async def fetch(payload: bytes) -> bytes:
        response = await client.post(url, payload, HEADERS, connect_timeout=2.0)
        try:
            return b"".join([chunk async for chunk in response.iter_any()])
        finally:
            response.close()

    return fetch, client.close


CLIENTS = {
    "httpx.AsyncClient": _httpx,
    "httpcore pool": _httpcore,
    "aiohttp": _aiohttp,
    "gateway.relay.upstream (httptools)": _upstream,
}


async def _measure(fetch: Fetch, payload: bytes, expected: bytes, count: int, concurrency: int) -> float:
    """CPU µs per request over `count` requests from `concurrency` workers (after a short warm-up)."""
    for _ in range(concurrency):
        assert await fetch(payload) == expected

    async def worker(n: int) -> None:
        for _ in range(n):
            await fetch(payload)

    cpu = time.process_time()
    await asyncio.gather(*(worker(count // concurrency) for _ in range(concurrency)))
    return (time.process_time() - cpu) / (count // concurrency * concurrency) * 1e6


async def _run(port: int, count: int, concurrency: int) -> None:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    print("| client | whole µs/req | stream µs/req |\n|---|---:|---:|")
    for name, make in CLIENTS.items():
        fetch, close = await make(url, concurrency)
        try:
            whole = await _measure(fetch, _payload(False), WHOLE_BODY, count, concurrency)
            stream = await _measure(fetch, _payload(True), STREAM_BODY, count // 4, concurrency)
        finally:
            await close()
        print(f"| {name} | {whole:.0f} | {stream:.0f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="whole requests per client (streams: 1/4)")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    if not 1 <= args.concurrency <= args.requests // 4 or args.requests > 100_000:
        parser.error("need 1 ≤ concurrency ≤ requests/4 and requests ≤ 100000")
    with tempfile.TemporaryDirectory(prefix="omnigate-clients-") as tmp:
        procs = Procs(Path(tmp))
        try:
            port = start_backend(procs)
            uvloop.run(_run(port, args.requests, args.concurrency))
        finally:
            procs.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
