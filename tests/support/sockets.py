"""Sockets that misbehave on purpose, for tests of what the gateway does when a peer does not answer."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def silent_url() -> Iterator[str]:
    """A socket that accepts connections (kernel backlog) and never answers a byte: a hung sink."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    finally:
        sock.close()
