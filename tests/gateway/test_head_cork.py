"""HeadCork: a response's header block leaves with the first body bytes of the same loop turn."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http.edge import HeadCork

pytestmark = pytest.mark.unit


class Wire:
    """A transport that records each write as one send."""

    def __init__(self) -> None:
        self.sends: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sends.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else None


class Cycle:
    """What owns the transport (uvicorn's request cycle): the cork hands it back once the head is out."""

    transport: Any


def cork(wire: Wire, cycle: Cycle | None = None) -> HeadCork:
    return HeadCork(cycle or Cycle(), wire)  # type: ignore[arg-type]


async def test_a_whole_response_leaves_in_one_send_and_the_cycle_gets_its_transport_back() -> None:
    wire, cycle = Wire(), Cycle()
    t = cork(wire, cycle)
    assert cycle.transport is t
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert wire.sends == []
    t.write(b"{}")
    assert wire.sends == [b"HTTP/1.1 200 OK\r\n\r\n{}"] and cycle.transport is wire
    await asyncio.sleep(0)  # the turn's flush finds nothing held
    assert wire.sends == [b"HTTP/1.1 200 OK\r\n\r\n{}"]


async def test_a_head_alone_leaves_at_the_end_of_the_turn() -> None:
    wire, cycle = Wire(), Cycle()
    t = cork(wire, cycle)
    t.write(b"head")
    await asyncio.sleep(0)
    assert wire.sends == [b"head"] and cycle.transport is wire


async def test_a_large_body_is_not_copied_onto_the_head() -> None:
    wire = Wire()
    t = cork(wire)
    body = b"x" * 70_000
    t.write(b"head")
    t.write(body)
    assert wire.sends == [b"head", body]


async def test_close_sends_what_is_held_and_a_closed_peer_gets_nothing() -> None:
    wire = Wire()
    t = cork(wire)
    t.write(b"head")
    t.close()
    assert wire.sends == [b"head"] and wire.closed and t.is_closing()
    gone = Wire()
    g = cork(gone)
    g.write(b"head")
    gone.closed = True
    await asyncio.sleep(0)
    assert gone.sends == []
    assert g.get_extra_info("peername") == ("127.0.0.1", 1)  # everything else passes through
