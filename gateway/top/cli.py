"""`omnigate top`: watch a running gateway in the terminal (or print one view with `--once`).

    omnigate top --url http://127.0.0.1:8080 --token "$OMNIGATE_ADMIN_TOKEN" [--interval 2] [--once]

Exit codes: 0 ok (Ctrl-C ends the live view), 2 the gateway could not be read at all.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import httpx
from rich.console import Console
from rich.live import Live

from gateway.top.scrape import Sample, read, rows
from gateway.top.view import render


async def once(console: Console, url: str, token: str | None, interval: float, max_tenants: int) -> int:
    """Two reads `interval` apart (the rates need both), one view printed; 2 when nothing could be read."""
    url = url.rstrip("/")
    async with httpx.AsyncClient(timeout=max(2.0, interval), trust_env=False) as client:
        before = await read(client, url, token, max_tenants)
        await asyncio.sleep(interval)
        now = await read(client, url, token, max_tenants)
    console.print(render(url, rows(now, before)))
    return 2 if not now.state and not now.metrics else 0


async def watch(
    console: Console, url: str, token: str | None, interval: float, max_tenants: int, reads: int | None = None
) -> None:
    """Read every `interval` seconds and redraw in place; `reads` bounds the run (None: until Ctrl-C)."""
    url = url.rstrip("/")
    before: Sample | None = None
    async with httpx.AsyncClient(timeout=max(2.0, interval), trust_env=False) as client:
        with Live(console=console, auto_refresh=False, screen=console.is_terminal) as live:
            done = 0
            while reads is None or done < reads:
                now = await read(client, url, token, max_tenants)
                live.update(render(url, rows(now, before)), refresh=True)
                before, done = now, done + 1
                if reads is None or done < reads:
                    await asyncio.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="omnigate top", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway (default %(default)s)")
    parser.add_argument(
        "--token",
        default=os.environ.get("OMNIGATE_ADMIN_TOKEN"),
        help="the admin token (default: $OMNIGATE_ADMIN_TOKEN)",
    )
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between reads (default 2)")
    parser.add_argument(
        "--once", action="store_true", help="print one view (rates over one interval) and exit"
    )
    parser.add_argument("--tenants", type=int, default=12, help="tenants shown, busiest first (default 12)")
    args = parser.parse_args(argv)
    if args.interval <= 0 or args.tenants < 0:
        parser.error("--interval must be positive and --tenants not negative")
    console = Console()
    try:
        if args.once:
            return asyncio.run(once(console, args.url, args.token, args.interval, args.tenants))
        asyncio.run(watch(console, args.url, args.token, args.interval, args.tenants))
        return 0
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
