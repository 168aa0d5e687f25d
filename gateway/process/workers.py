"""`omnigate serve --workers N`: N gateway processes on one port, each a replica of the shared budgets.

The kernel spreads connections between the processes (SO_REUSEPORT: each binds the same port itself), so
no process forwards another's traffic. They are replicas like those on other hosts: one Redis store
shares the tenants, quotas and the engines' budgets (gateway/coordination/), which is why more than one
worker needs a Redis store. The parent only supervises: it starts the workers, passes SIGTERM / SIGINT on
(each drains, gateway/process/drain.py), and ends with the first non-zero exit code; a worker that dies is not
restarted: the others are stopped and the supervisor exits, for the orchestrator to restart the whole
pod. Workers die with the supervisor, even when it is killed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from types import FrameType

from gateway.settings.config import GatewayConfig

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def refusal(config: GatewayConfig, workers: int, port: int) -> str | None:
    """Why `workers` processes cannot serve `config` (None: they can)."""
    if workers <= 1:
        return None
    if config.store.kind != "redis" or not config.store.redis_url:
        return (
            f"--workers {workers} needs a shared Redis store (store.kind: redis with store.redis_url): "
            "without one each worker would give every engine its whole budget again"
        )
    if port == 0:
        return f"--workers {workers} needs a fixed port (listen.port or --port), not 0"
    return None


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other processes may bind too (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _die_with_parent() -> None:
    """In the worker before it runs: on Linux, a SIGTERM when the supervisor dies (even by kill -9), so no
    worker outlives it; elsewhere nothing."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def supervise(argv: list[str], workers: int) -> int:
    """Run `argv` (a single-worker `serve` with --reuse-port) `workers` times; forward stop signals; wait
    for all of them. The exit code: the first non-zero one, else 0."""
    env = {**os.environ, "OMNIGATE_COORDINATION__REPLICAS_HINT": str(workers)}
    children = [subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent) for _ in range(workers)]

    def forward(sig: int, frame: FrameType | None) -> None:
        for child in children:
            if child.poll() is None:
                child.send_signal(sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = 0
    pending = list(children)
    while pending:
        for child in list(pending):
            rc = child.poll()
            if rc is None:
                continue
            pending.remove(child)
            if rc != 0 and code == 0:
                code = rc
                print(f"omnigate: worker {child.pid} exited with {rc}; stopping the others", file=sys.stderr)
                forward(signal.SIGTERM, None)
        time.sleep(0.1)
    return code
