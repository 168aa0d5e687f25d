"""The circuit breaker through a real gateway in front of a simulator that fails on command.

open → half-open → open (the probe fails too) → half-open → closed (the probe succeeds), each transition
seen in /admin/state, counted in /metrics and alerted to a real webhook receiver; while half-open, the one
probe goes alone and the next request waits for its verdict.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import yaml

from gateway.http.app import create_app
from gateway.settings.config import parse_config
from loadtest.sim.config import SimConfig
from loadtest.sim.server import create_app as create_sim
from tests.observability.conftest import Receiver, eventually
from tests.observability.conftest import _app as receiver_app
from tests.observability.exposition import sample_value
from tests.support.servers import ServerThread, serve

pytestmark = pytest.mark.e2e

ADMIN = "circuit-admin"
POOL = "e2e-circuit"
MODEL = "sim-omni"
BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rx = Receiver()
    with serve(receiver_app(rx)) as server:
        rx.url = server.url
        yield rx


def _gateway(tmp_path: Path, sim: ServerThread, hook: str) -> Any:
    policy = {
        "version": 1,
        "pool_defaults": {
            "retries": 0,
            "circuit": {
                "consecutive_failures": 2,
                "failure_ratio": None,
                "open_s": 0.5,
                "half_open_probes": 1,
            },
        },
        "queue": {"classes": {"interactive": {"pool": POOL}}},
    }
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    config = parse_config(
        {
            "policy_path": str(path),
            "watch_policy": False,
            "admin": {"token": ADMIN},
            "auth": {"required": False},
            "store": {"kind": "memory"},
            "access_log": False,
            "pools": [
                {
                    "name": POOL,
                    "traffic_class": "interactive",
                    "models": [MODEL],
                    "backends": [sim.url],
                    "health_interval_s": 0.05,
                }
            ],
            "alerts": {"sinks": [{"kind": "webhook", "name": "e2e-circuit-hook", "url": hook}]},
        },
        environ={},
    )
    return create_app(config)


async def _circuit(c: httpx.AsyncClient) -> str:
    r = await c.get("/admin/state", headers={"authorization": f"Bearer {ADMIN}"})
    return str(r.json()["pools"][POOL]["backends"][0]["circuit"])


async def _until_circuit(c: httpx.AsyncClient, state: str) -> None:
    with anyio.fail_after(10):
        while await _circuit(c) != state:  # noqa: ASYNC110 - the state lives in the server's thread
            await anyio.sleep(0.02)


async def test_open_half_open_open_then_half_open_closed_with_one_probe(
    tmp_path: Path, receiver: Receiver
) -> None:
    with ExitStack() as stack:
        sim = stack.enter_context(serve(create_sim(SimConfig(time_scale=10.0, seed=1))))
        gw = stack.enter_context(serve(_gateway(tmp_path, sim, receiver.url + "/circuit")))
        async with (
            httpx.AsyncClient(base_url=gw.url, timeout=20) as c,
            httpx.AsyncClient(base_url=sim.url) as s,
        ):
            await _until_circuit(c, "closed")
            assert (await s.post("/admin/faults", json={"error_rate": 1.0})).status_code == 200
            failed = [await c.post("/v1/chat/completions", json=BODY) for _ in range(2)]
            assert [r.status_code for r in failed] == [502, 502]
            assert await _circuit(c) == "open"
            refused = await c.post("/v1/chat/completions", json=BODY)
            assert (refused.status_code, refused.json()["error"]["code"]) == (503, "no_healthy_backend")

            await _until_circuit(c, "half_open")  # the sim's /health still passes: probing starts
            probe = await c.post("/v1/chat/completions", json=BODY)
            assert probe.status_code == 502 and await _circuit(c) == "open"

            # the backend recovers but answers slowly (0.5 s): the one probe goes alone, the next waits
            assert (
                await s.post("/admin/faults", json={"error_rate": 0.0, "latency_s": 5.0})
            ).status_code == 200
            await _until_circuit(c, "half_open")
            answers: list[httpx.Response] = []

            async def send(delay: float) -> None:
                await anyio.sleep(delay)
                answers.append(await c.post("/v1/chat/completions", json=BODY))

            async with anyio.create_task_group() as tg:
                tg.start_soon(send, 0.0)
                tg.start_soon(send, 0.1)
            assert [r.status_code for r in answers] == [200, 200]
            queued = [float(r.headers["x-omnigate-queue-ms"]) for r in answers]
            assert queued[0] < 100 and queued[1] > 300  # the second waited for the probe's verdict
            assert await _circuit(c) == "closed"
            metrics = (await c.get("/metrics")).text

        def circuit_alerts() -> list[dict[str, Any]]:  # the failed requests alert to the same hook
            return [m for m in receiver.bodies("/circuit") if m["rule"] == "circuit"]

        await eventually(lambda: len(circuit_alerts()) >= 5)
    hook = circuit_alerts()
    moves = [(m["fields"]["from"], m["title"], m["kind"]) for m in hook]
    backend = f"{POOL}-0"
    assert moves == [
        ("closed", f"Circuit open: {backend}", "firing"),
        ("open", f"Circuit half-open: probing {backend}", "firing"),
        ("half_open", f"Circuit open: {backend}", "firing"),
        ("open", f"Circuit half-open: probing {backend}", "firing"),
        ("half_open", f"Circuit closed: {backend}", "resolved"),
    ]
    assert [m["fields"]["reason"] for m in hook] == [
        "2 failures in a row",
        "cool-down of 0.5 s over",
        "a probe failed while half-open",
        "cool-down of 0.5 s over",
        "1 probe(s) succeeded",
    ]
    counts = {
        state: sample_value(
            metrics, "omnigate_circuit_transitions_total", pool=POOL, backend=backend, state=state
        )
        for state in ("open", "half_open", "closed")
    }
    assert counts == {"open": 2, "half_open": 2, "closed": 1}
