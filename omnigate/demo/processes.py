"""The demo's child processes: started in their own session, stopped gateway first, never left behind.

Each child runs in its own session (Ctrl-C in the terminal reaches only the demo, which then stops the
gateway first and the simulators after it), with Linux's parent-death signal set so that even `kill -9` of
the demo leaves no server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

START_TIMEOUT_S = 60.0
GATEWAY_STOP_S = 12.0  # the demo config's `shutdown.drain_s` (8 s), then the server's close
SIM_STOP_S = 5.0


class ChildFailed(RuntimeError):
    """A child exited or never became ready; the message names it and ends with its last output."""


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the demo dies


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, limit: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""


@dataclass(slots=True)
class Children:
    """The processes this demo started (logs and working directory in `workdir`), stopped in reverse
    order: the gateway before its backends."""

    workdir: Path
    items: list[Child] = field(default_factory=list)

    def start(self, name: str, url: str, argv: list[str]) -> Child:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        child = Child(name, proc, log)
        self.items.append(child)
        print(f"  started {name:<14} pid {proc.pid:<7} {url}", flush=True)
        return child

    async def stop(self) -> None:
        """SIGTERM, wait, SIGKILL after the timeout; the gateway first so it drains before backends go."""
        gateways = [c for c in self.items if c.name == "gateway"]
        await _stop_group(gateways, GATEWAY_STOP_S)
        await _stop_group([c for c in self.items if c not in gateways], SIM_STOP_S)

    def kill_remaining(self) -> None:
        """Last resort (the async stop was interrupted): nothing may outlive the demo."""
        for c in self.items:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()

    def endings(self) -> str:
        return ", ".join(f"{c.name} {_ending(c.proc.returncode)}" for c in self.items)


async def _stop_group(children: list[Child], grace_s: float) -> None:
    for c in children:
        if c.proc.poll() is None:
            c.proc.terminate()
    deadline = time.monotonic() + grace_s
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(c.proc.wait, max(0.0, deadline - time.monotonic()))
        if c.proc.poll() is None:
            print(f"{c.name} (pid {c.proc.pid}) did not stop in {grace_s:.0f} s; killing it", flush=True)
            c.proc.kill()
            c.proc.wait()


def _ending(code: int | None) -> str:
    """The gateway drains and exits 0 on SIGTERM; the simulators' uvicorn re-raises it (-15)."""
    names = {-signal.SIGTERM: "terminated", -signal.SIGKILL: "killed", 0: "exited"}
    return names.get(code or 0, f"exit {code}")


async def wait_ready(client: httpx.AsyncClient, child: Child, url: str, stop: asyncio.Event) -> None:
    """Poll `url` until it answers 200, the child exits (ChildFailed), or `stop` is set."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not stop.is_set():
        if child.proc.poll() is not None:
            raise ChildFailed(f"{child.name} exited with code {child.proc.returncode}:\n{child.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(url, timeout=2.0)).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise ChildFailed(
                f"{child.name} not ready after {START_TIMEOUT_S:.0f} s ({url}):\n{child.tail()}"
            )
        await asyncio.sleep(0.1)
