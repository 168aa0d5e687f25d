"""Watchdog on its own: which waits count against the idle gap, and which deadline is reported."""

from __future__ import annotations

import time

import anyio

from gateway.relay.proxy import IdleTimeout, TotalTimeout, Watchdog


async def test_relaying_never_counts_as_an_idle_gap():
    with anyio.CancelScope() as scope:
        dog = Watchdog(scope, gap=0.02, deadline=time.monotonic() + 60)
        await anyio.sleep(0.2)  # ten gaps spent relaying (a slow client), none waiting for the backend
        dog.stop()
    assert dog.expired is None and not scope.cancelled_caught


async def test_waiting_for_the_backend_past_the_gap_is_an_idle_timeout():
    with anyio.CancelScope() as scope:
        dog = Watchdog(scope, gap=0.02, deadline=time.monotonic() + 60)
        dog.reading()
        await anyio.sleep(30)
    assert dog.expired is IdleTimeout and scope.cancelled_caught


async def test_steady_chunks_within_the_gap_keep_the_relay_alive():
    with anyio.CancelScope() as scope:
        dog = Watchdog(scope, gap=0.5, deadline=time.monotonic() + 60)
        for _ in range(20):  # 20 waits of 0.01 s: together well past one gap, each far inside it
            dog.reading()
            await anyio.sleep(0.01)
            dog.relaying()
        dog.stop()
    assert dog.expired is None and not scope.cancelled_caught


async def test_total_deadline_applies_even_while_relaying():
    with anyio.CancelScope() as scope:
        dog = Watchdog(scope, gap=60, deadline=time.monotonic() + 0.02)
        await anyio.sleep(30)
    assert dog.expired is TotalTimeout and scope.cancelled_caught
