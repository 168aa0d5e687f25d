"""A request whose client leaves keeps its capacity charged while the sglang-omni server runs it on, until
the server's /health shows it finished; a server that aborts it gets the capacity back at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.gateway.test_omni_backends import MODEL, backends, omni_gateway
from tests.support.processes import Processes
from tests.support.servers import ServerThread
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e

# the snapshot runs every answer through the talker and code2wav: ~12 s of audio for 40 tokens, a few
# seconds of wall time at 5x, while the text is out within the first second
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 40}


def _leave_a_stream(gw: str) -> None:
    """Start a stream, read its first event, hang up."""
    with httpx.stream("POST", f"{gw}/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        assert next(r.iter_raw()).startswith(b'data: {"id": "chatcmpl-')


def _leave_a_whole_answer(gw: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gw}/v1/chat/completions", json=CHAT, timeout=httpx.Timeout(30, read=0.5))


def _tracked(sim_url: str) -> dict[str, Any]:
    info: dict[str, Any] = httpx.get(sim_url + "/health").json()
    return info


def _sample(gw: str, sim_url: str, until: float) -> tuple[list[tuple[int, int, int]], float]:
    """(requests the server tracks, the gateway's active, held) — the server read first in each sample —
    and the seconds from the first sample to the first one where the server tracks nothing."""
    out: list[tuple[int, int, int]] = []
    start = time.monotonic()
    ran_for = 0.0
    while time.monotonic() < until:
        tracked = _tracked(sim_url)["total_requests"]
        if not tracked and not ran_for:
            ran_for = time.monotonic() - start
        entry = backends(gw)[0]
        out.append((tracked, entry["active"], entry["held"]))
        if out[-1] == (0, 0, 0):
            break
        time.sleep(0.05)
    return out, ran_for


@pytest.mark.parametrize("leave", [_leave_a_stream, _leave_a_whole_answer], ids=["stream", "whole"])
def test_the_snapshot_keeps_the_slot_charged_until_the_server_is_done(
    tmp_path, start_gateway: Callable[..., ServerThread], leave: Callable[[str], None]
) -> None:
    procs = Processes(tmp_path)
    try:
        sim = procs.sim("--api", "sglang-omni", "--time-scale", "5", "--model", MODEL, "--seed", "5")
        gw = omni_gateway(start_gateway, [sim.url])
        assert wait_for(lambda: backends(gw)[0]["running"] is not None)
        leave(gw)
        samples, ran_for = _sample(gw, sim.url, time.monotonic() + 30)
        assert samples[-1] == (0, 0, 0), samples
        assert samples[0] == (1, 1, 1), samples  # left, still running there, still charged here: held
        running = [s for s in samples if s[0] == 1]
        assert ran_for >= 0.25, ran_for  # the server ran it on for a while (seconds of talker work)
        assert all(active == 1 for _, active, _ in running), samples  # and all the while, still charged
    finally:
        procs.close()


def test_a_later_server_aborts_a_stream_and_the_slot_is_free_at_once(tmp_path, start_gateway) -> None:
    procs = Processes(tmp_path)
    try:
        sim = procs.sim(
            "--api", "sglang-omni", "--omni-release", "later", "--time-scale", "5", "--model", MODEL
        )
        gw = omni_gateway(start_gateway, [sim.url], version="later")
        assert wait_for(lambda: backends(gw)[0]["running"] is not None)
        _leave_a_stream(gw)
        assert wait_for(lambda: backends(gw)[0]["active"] == 0, timeout=2.0)
        assert backends(gw)[0]["held"] == 0
        assert wait_for(lambda: _tracked(sim.url)["total_requests"] == 0, timeout=2.0)
    finally:
        procs.close()
