"""A TCP proxy on loopback, run as a process of its own, that holds every reply from upstream for the
number of seconds written in a file before it passes it on (requests go through at once): a store that
answers, slowly. `python -m tests.support.delay_proxy --port P --upstream-port U --delay-file F`; an
absent or empty file means no delay. A process of its own, so that the test's client threads do not
slow it down (and make the store look slow) by holding the test process's interpreter."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path


class DelayProxy:
    def __init__(self, upstream_port: int, delay_file: Path) -> None:
        self.upstream_port = upstream_port
        self.delay_file = delay_file

    def delay(self) -> float:
        try:
            return float(self.delay_file.read_text() or 0)
        except (OSError, ValueError):
            return 0.0

    async def serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(self.pipe(client_r, up_w, False), self.pipe(up_r, client_w, True))

    async def pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, held: bool) -> None:
        try:
            while chunk := await reader.read(65536):
                if held and (delay := self.delay()):
                    await asyncio.sleep(delay)
                writer.write(chunk)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()


async def main(port: int, upstream_port: int, delay_file: Path) -> None:
    proxy = DelayProxy(upstream_port, delay_file)
    server = await asyncio.start_server(proxy.serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--delay-file", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(main(args.port, args.upstream_port, args.delay_file))
