"""Poll a condition with a bound: for effects that land just after a response (metrics, aborts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float = 5.0, interval: float = 0.02) -> T:
    """Return the first truthy value of probe(), or its last value once the timeout passes."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value and time.monotonic() < deadline:
        time.sleep(interval)
        value = probe()
    return value
