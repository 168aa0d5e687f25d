"""Building blocks for the observability end-to-end tests: simulators, a real gateway, dead sinks, probes.

Everything runs in-process on loopback (uvicorn in threads). Metrics live on one process-wide registry,
so each test gives its pool, traffic class, tenant and sinks names no other test uses: then the counters
it reads are exactly the ones its own requests moved.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import httpx
import yaml
from starlette.applications import Starlette

from gateway.http.app import create_app
from gateway.settings.config import parse_config
from loadtest.sim.config import SimConfig
from loadtest.sim.server import create_app as create_sim
from tests.support.servers import ServerThread, serve

ADMIN = "obs-e2e-admin"
MODEL = "sim-omni"


def text_body(text: str = "Tell me about the harbour.", **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], **extra}


def gateway_app(
    tmp_path: Path,
    *,
    pool: str,
    traffic_class: str,
    backends: list[str],
    tenant: dict[str, Any],
    policy_alerts: dict[str, Any],
    alerts: dict[str, Any],
    circuit: dict[str, Any] | None = None,
) -> Starlette:
    """A gateway with one pool serving one class, one tenant, the given alert thresholds and sinks, and
    the given circuit breaker settings."""
    policy = {
        "version": 1,
        "pool_defaults": {
            "media_urls": {"allow": ["example.invalid"]},  # forwarded, for the sim to refuse
            "circuit": circuit or {},
        },
        "queue": {"classes": {traffic_class: {"pool": pool}}},
        "tenant_defaults": {"default_class": traffic_class},
        "alerts": policy_alerts,
    }
    policy_path = tmp_path / f"{pool}-policy.yaml"
    policy_path.write_text(yaml.safe_dump(policy), encoding="utf-8")
    config = parse_config(
        {
            "policy_path": str(policy_path),
            "watch_policy": False,
            "admin": {"token": ADMIN},
            "store": {"kind": "memory"},
            "access_log": False,
            "pools": [{"name": pool, "models": [MODEL], "backends": backends, "health_interval_s": 0.05}],
            "tenants": [tenant],
            "alerts": {"evaluation_interval_s": 0.05, **alerts},
        },
        environ={},
    )
    return create_app(config)


def start_sims(stack: ExitStack, *configs: SimConfig) -> list[ServerThread]:
    return [stack.enter_context(serve(create_sim(c))) for c in configs]


async def until(probe: Callable[[], Awaitable[bool]], limit_s: float = 10.0) -> None:
    """Poll an async condition (a server in another thread makes it true); fail, not hang, past the limit."""
    with anyio.fail_after(limit_s):
        while not await probe():  # noqa: ASYNC110 - the state lives in another thread: nothing to await
            await anyio.sleep(0.02)


async def wait_scraped(client: httpx.AsyncClient, gateway: ServerThread) -> None:
    """Until every backend is healthy and scraped once, so failures carry a real KV watermark."""

    async def scraped() -> bool:
        r = await client.get(gateway.url + "/admin/state", headers={"authorization": f"Bearer {ADMIN}"})
        r.raise_for_status()
        backends = [b for pool in r.json()["pools"].values() for b in pool["backends"]]
        return all(b["healthy"] and b["token_usage"] is not None for b in backends)

    await until(scraped)


async def set_faults(client: httpx.AsyncClient, sim: ServerThread, **faults: Any) -> None:
    r = await client.post(sim.url + "/admin/faults", json=faults)
    assert r.status_code == 200, r.text


async def scrape(client: httpx.AsyncClient, gateway: ServerThread) -> str:
    r = await client.get(gateway.url + "/metrics")
    assert r.status_code == 200
    return r.text


async def scrape_when(
    client: httpx.AsyncClient, gateway: ServerThread, ready: Callable[[str], bool], limit_s: float = 10.0
) -> str:
    """/metrics once `ready(text)` holds (alert delivery lands after the responses), or the last one read
    when `limit_s` runs out, so the test's exact assertions report what was there instead of a timeout."""
    with anyio.move_on_after(limit_s):
        while not ready(text := await scrape(client, gateway)):  # noqa: ASYNC110 - polling another thread
            await anyio.sleep(0.02)
        return text
    return await scrape(client, gateway)
