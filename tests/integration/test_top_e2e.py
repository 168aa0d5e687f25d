"""`omnigate top` against a live gateway in front of the simulator: what it renders is what the gateway
did (rich's recording console, no terminal), and the command's `--once` and bounded live runs."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import httpx
import pytest
from rich.console import Console

from gateway.top import cli
from gateway.top.scrape import read, rows
from gateway.top.view import render
from tests.integration.conftest import ADMIN_TOKEN, chat, write_config
from tests.support.processes import ManagedProcess, Processes

pytestmark = pytest.mark.e2e

ALICE = "og-top-alice-0123456789abcdef"
TENANTS = [
    {"id": "alice", "keys": [ALICE], "quotas": {"rpm": 4}},
    {"id": "idle-bob", "keys": ["og-top-bob-0123456789abcdef"], "quotas": {"max_concurrent": 3}},
]


def _console() -> Console:
    return Console(record=True, width=200, file=io.StringIO())


async def _two_reads(url: str, traffic: int) -> tuple[str, float]:
    """A read, `traffic` requests as alice, a second read: the view of both as plain text, and the
    seconds between the reads."""
    async with httpx.AsyncClient(timeout=10, trust_env=False) as client:
        before = await read(client, url, ADMIN_TOKEN, 12)
        for _ in range(traffic):
            await asyncio.to_thread(chat, url, ALICE, 5)
        now = await read(client, url, ADMIN_TOKEN, 12)
    console = _console()
    console.print(render(url, rows(now, before)))
    return console.export_text(), now.at - before.at


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is `first`."""
    for line in text.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == first or cells[0].startswith(first + " "):
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


@pytest.fixture
def gateway(sim: ManagedProcess, procs: Processes, tmp_path: Path) -> ManagedProcess:
    return procs.gateway(write_config(tmp_path / "gateway.yaml", sim.url, {"kind": "memory"}, TENANTS))


def test_top_shows_what_the_gateway_did(gateway: ManagedProcess, sim: ManagedProcess) -> None:
    """Six requests from a tenant allowed four a minute: four answered, two refused for its quota."""
    text, seconds = asyncio.run(_two_reads(gateway.url, 6))
    assert text.startswith(f"omnigate top {gateway.url}  ·  rates over {seconds:.1f} s\n")
    assert "could not read" not in text
    pool = _row(text, "interactive")
    assert pool[:2] == ["interactive", "sglang"]
    assert pool[2:4] == ["high 0, low 0, normal 0", "0 ms"]  # nothing queued at the second read
    assert pool[5:] == ["0", f"{4 / seconds:.1f}", f"{2 / seconds:.1f}", "none"]
    refusals = text.split("rejections by traffic class and reason", 1)[1]
    assert _row(refusals, "interactive") == ["interactive", "quota", "2", f"{2 / seconds:.1f}"]
    backend = _row(text, "interactive-0")
    assert backend[0] == f"interactive-0 {sim.url}"
    assert backend[1] == "0/32" and backend[-1] == "up, closed"
    alice = _row(text, "alice")
    assert alice[:3] == ["alice", "6", f"{6 / seconds:.1f}"]
    minute = re.fullmatch(r"rpm ([\d.]+)/4 \((\d+) %\)", alice[4])
    assert minute is not None, alice[4]
    used, share = float(minute[1]), int(minute[2])
    # all four taken, refilling at 4 a minute since (shown to one decimal)
    assert 4 - 4 / 60 * (seconds + 0.1) - 0.05 <= used <= 4
    assert abs(share - used / 4 * 100) <= 2  # the share of the unrounded use
    assert alice[5:] == ["0/∞", "64/∞"]  # 4 answers × (11 prompt + 5 output) tokens today
    assert _row(text, "idle-bob") == ["idle-bob", "0", "0.0", "0", "-", "0/3 (0 %)", "0/∞"]


def test_once_and_a_bounded_live_run(gateway: ManagedProcess) -> None:
    console = _console()
    code = asyncio.run(cli.once(console, gateway.url, ADMIN_TOKEN, 0.2, 12))
    text = console.export_text()
    assert code == 0 and text.startswith(f"omnigate top {gateway.url}  ·  rates over 0.")
    assert _row(text, "idle-bob")[0] == "idle-bob"
    live = _console()
    asyncio.run(cli.watch(live, gateway.url, ADMIN_TOKEN, 0.1, 12, reads=2))
    frames = live.export_text()  # off a terminal, Live prints its last frame only: the second read's
    assert (
        frames.startswith(f"omnigate top {gateway.url}  ·  rates over 0.")
        and frames.count("omnigate top") == 1
    )


def test_a_gateway_that_cannot_be_read(procs: Processes, tmp_path: Path, gateway: ManagedProcess) -> None:
    """A wrong token: the view says what it could not read; nothing at all readable exits 2."""
    console = _console()
    assert asyncio.run(cli.once(console, gateway.url, "not-the-token", 0.1, 12)) == 0  # /metrics is public
    text = console.export_text()
    assert "could not read: /admin/state: HTTP 403; /admin/tenants: HTTP 403" in text
    nowhere = _console()
    assert asyncio.run(cli.once(nowhere, "http://127.0.0.1:9", ADMIN_TOKEN, 0.1, 12)) == 2
    assert "could not read: /metrics: ConnectError" in nowhere.export_text()
