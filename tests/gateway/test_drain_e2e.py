"""Graceful drain on SIGTERM, with real processes: `omnigate serve` in front of the simulator.

A stream is in flight and a second request waits in the queue (the backend takes one request at a time)
when the gateway gets SIGTERM: `/readyz` turns 503 at once while the listener stays open, the queued
request and a new one get 503 `shutting_down` with `Retry-After`, the stream runs to `[DONE]`, and the
process exits 0 as soon as it ends. With a stream longer than `shutdown.drain_s`, the process exits 0
once `drain_s` is over.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from tests.support.processes import ManagedProcess, Processes

pytestmark = pytest.mark.e2e

MODEL = "drain-model"
ADMIN = "drain-admin"


def _body(tokens: int, stream: bool) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    return {**body, "stream_options": {"include_usage": True}} if stream else body


def _stack(tmp_path: Path, drain_s: float) -> tuple[Processes, ManagedProcess, ManagedProcess]:
    group = Processes(tmp_path)
    sim = group.sim("--model", MODEL, "--time-scale", "1", "--seed", "3")
    (tmp_path / "policy.yaml").write_text(
        yaml.safe_dump({"version": 1, "controller": {"algorithm": "fixed", "initial": 1, "min": 1, "max": 1}})
    )
    config = {
        "policy_path": str(tmp_path / "policy.yaml"),
        "watch_policy": False,
        "admin": {"token": ADMIN},
        "auth": {"required": False},
        "store": {"kind": "memory"},
        "access_log": False,
        "shutdown": {"drain_s": drain_s},
        "pools": [
            {"name": "interactive", "models": [MODEL], "backends": [sim.url], "health_interval_s": 0.2}
        ],
    }
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    return group, sim, group.gateway(tmp_path / "gateway.yaml")


async def _queued(c: httpx.AsyncClient) -> int:
    r = await c.get("/admin/state", headers={"authorization": f"Bearer {ADMIN}"})
    return int(r.json()["pools"]["interactive"]["queue_depth"])


async def _exit_code(gw: ManagedProcess, limit_s: float) -> int | None:
    assert gw.proc is not None
    with anyio.move_on_after(limit_s):
        while gw.proc.poll() is None:  # noqa: ASYNC110 - a child process: nothing to await
            await anyio.sleep(0.02)
    return gw.proc.poll()


async def test_sigterm_refuses_new_and_queued_work_finishes_the_stream_and_exits_0(tmp_path: Path) -> None:
    group, _, gw = _stack(tmp_path, drain_s=30)
    try:
        assert gw.proc is not None
        async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c, anyio.create_task_group() as tg:
            stream_body: list[bytes] = []
            first = anyio.Event()
            finished_at: list[float] = []

            async def stream() -> None:
                async with c.stream("POST", "/v1/chat/completions", json=_body(250, True)) as resp:
                    assert resp.status_code == 200
                    async for chunk in resp.aiter_raw():
                        stream_body.append(chunk)
                        first.set()
                finished_at.append(time.monotonic())

            queued: list[httpx.Response] = []

            async def wait_in_queue() -> None:
                queued.append(await c.post("/v1/chat/completions", json=_body(5, False)))

            tg.start_soon(stream)
            await first.wait()
            tg.start_soon(wait_in_queue)
            with anyio.fail_after(10):
                while await _queued(c) != 1:  # noqa: ASYNC110 - the queue lives in the gateway process
                    await anyio.sleep(0.02)

            gw.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            with anyio.fail_after(2):
                while (ready := await c.get("/readyz")).status_code != 503:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
            assert ready.json()["draining"] is True
            new = await c.post("/v1/chat/completions", json=_body(5, False))
            while not queued:  # noqa: ASYNC110 - answered by the drain at once
                await anyio.sleep(0.01)
            for refused in (queued[0], new):
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["code"] == "shutting_down"
            assert not finished_at  # the stream is still running

        text = b"".join(stream_body).decode()
        assert text.endswith("data: [DONE]\n\n") and '"finish_reason":"length"' in text
        assert '"completion_tokens":250' in text  # every token, nothing cut
        code = await _exit_code(gw, 10)
        assert code == 0
        assert finished_at[0] - signalled < 25  # well inside drain_s: it waited for the stream only
        assert "draining: 1 request(s) running, 1 queued" in gw.output()
    finally:
        group.close()


async def test_a_stream_longer_than_drain_s_is_cut_when_it_is_over_and_the_exit_is_0(tmp_path: Path) -> None:
    group, _, gw = _stack(tmp_path, drain_s=1.0)
    try:
        assert gw.proc is not None
        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=30) as c,
            c.stream("POST", "/v1/chat/completions", json=_body(3000, True)) as resp,
        ):
            chunks = resp.aiter_raw()
            await anext(chunks)
            gw.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            received = b""
            with pytest.raises(httpx.HTTPError):  # cut once drain_s is over
                async for chunk in chunks:
                    received += chunk
        code = await _exit_code(gw, 10)
        elapsed = time.monotonic() - signalled
        assert code == 0
        assert 1.0 <= elapsed < 5.0, elapsed
        assert not received.endswith(b"data: [DONE]\n\n")
        assert "drain: 1 s are over; 1 request(s) cut" in gw.output()
    finally:
        group.close()
