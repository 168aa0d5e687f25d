"""A free loopback TCP port for a server we are about to start (sims, gateways, test servers)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """Ask the kernel for an unused port on 127.0.0.1; the caller binds it soon after."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
