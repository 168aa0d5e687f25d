"""Sweeps: the same workload and seed at each value of one parameter, with warm-up per point.

How a value is applied is a small pluggable `PointTarget`: an async context manager factory that
prepares the system for one value and yields the URL to load plus the `/metrics` URLs to scrape.
Three ship here: a simulator subprocess per point (an engine flag such as --max-running-requests), a
simulator behind a real `omnigate serve` per point, and a live gateway policy change through the admin
API.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from loadtest.http import HttpError, HttpPool
from loadtest.knee import dig, find_knee, recommend
from loadtest.ports import free_port
from loadtest.results import build_result
from loadtest.runner import RunOptions, execute


@dataclass(slots=True)
class Endpoint:
    url: str
    scrape: list[str]


PointTarget = Callable[[str], AbstractAsyncContextManager[Endpoint]]


class SweepError(RuntimeError):
    """A point could not be prepared (simulator did not start, admin API refused the policy)."""


async def wait_healthy(
    url: str, timeout_s: float, proc: asyncio.subprocess.Process | None = None, path: str = "/health"
) -> None:
    pool = HttpPool(url)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc is not None and proc.returncode is not None:
                raise SweepError(f"process exited with code {proc.returncode} before {path} answered 200")
            with contextlib.suppress(HttpError):
                resp = await pool.request("GET", path)
                await resp.read()
                if resp.status == 200:
                    return
            await asyncio.sleep(0.1)
    finally:
        await pool.aclose()
    raise SweepError(f"{url}{path} not 200 after {timeout_s:.0f} s")


@contextlib.asynccontextmanager
async def child(argv: list[str], url: str, ready_path: str, timeout_s: float) -> AsyncIterator[None]:
    """`python argv…` on loopback, ready once GET `ready_path` answers 200; stopped (TERM, then KILL)
    on exit. Its output goes to a temporary file whose tail is shown if it never becomes ready."""
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(sys.executable, *argv, stdout=log, stderr=log)
        try:
            try:
                await wait_healthy(url, timeout_s, proc, ready_path)
            except SweepError as e:
                log.seek(0)
                tail = log.read()[-2000:].decode(errors="replace")
                raise SweepError(f"{e}: {' '.join(argv)}\n{tail}") from None
            yield
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


def sim_argv(port: int, time_scale: float, args: list[str]) -> list[str]:
    return [
        "-m",
        "loadtest.sim",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--time-scale",
        repr(time_scale),
        *args,
    ]


def sim_target(
    flag: str, base_args: list[str], time_scale: float, start_timeout: float = 30.0
) -> PointTarget:
    """One `python -m loadtest.sim` per point with `--<flag> <value>`, stopped after the point."""

    @contextlib.asynccontextmanager
    async def point(value: str) -> AsyncIterator[Endpoint]:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        async with child(
            sim_argv(port, time_scale, [*base_args, f"--{flag}", value]), url, "/health", start_timeout
        ):
            yield Endpoint(url, [url])

    return point


def gateway_target(
    policy: Path, sim_args: list[str], model: str, time_scale: float = 1.0, start_timeout: float = 60.0
) -> PointTarget:
    """Per point: a simulator at `--max-running-requests <value>` and a real `omnigate serve` running
    `policy` in front of it (one pool, `interactive`, no auth, in-memory store); the load goes to the
    gateway, the simulator's /metrics are scraped. The policy is used as written, so its seconds must be
    the engine's: keep `time_scale` 1 unless the policy was scaled to match."""
    policy_path = str(policy.resolve())

    @contextlib.asynccontextmanager
    async def point(value: str) -> AsyncIterator[Endpoint]:
        sim_port, gw_port = free_port(), free_port()
        sim_url, gw_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
        sim = sim_argv(sim_port, time_scale, [*sim_args, "--max-running-requests", value])
        with tempfile.TemporaryDirectory(prefix="omnigate-validate-") as work:
            config = Path(work) / "gateway.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "listen": {"host": "127.0.0.1", "port": gw_port},
                        "policy_path": policy_path,
                        "watch_policy": False,
                        "auth": {"required": False},
                        "store": {"kind": "memory"},
                        "access_log": False,
                        "pools": [{"name": "interactive", "models": [model], "backends": [sim_url]}],
                    }
                )
            )
            gateway = ["-m", "gateway.cli", "serve", "--config", str(config), "--log-level", "warning"]
            async with (
                child(sim, sim_url, "/health", start_timeout),
                child(gateway, gw_url, "/readyz", start_timeout),
            ):
                yield Endpoint(gw_url, [sim_url])

    return point


def set_dotted(doc: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    node = doc
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    return doc


def write_policy_value(policy_file: Path, key: str, value: str) -> None:
    """Set one dotted key in a YAML policy file; the value is parsed as YAML (numbers stay numbers)."""
    doc = yaml.safe_load(policy_file.read_text(encoding="utf-8")) or {}
    policy_file.write_text(yaml.safe_dump(set_dotted(doc, key, yaml.safe_load(value)), sort_keys=False))


def policy_target(
    url: str, admin_url: str, token: str, policy_file: Path, key: str, scrape: list[str] | None = None
) -> PointTarget:
    """Write `key: value` into the gateway's policy file, then `POST /admin/policy/reload`."""

    @contextlib.asynccontextmanager
    async def point(value: str) -> AsyncIterator[Endpoint]:
        await asyncio.to_thread(write_policy_value, policy_file, key, value)
        pool = HttpPool(admin_url)
        try:
            resp = await pool.request(
                "POST", "/admin/policy/reload", b"", {"authorization": f"Bearer {token}"}
            )
            body = await resp.read()
        except HttpError as e:
            raise SweepError(f"policy reload failed: {e}") from e
        finally:
            await pool.aclose()
        if resp.status != 200:
            raise SweepError(
                f"policy reload for {key}={value} refused ({resp.status}): {body.decode()[:300]}"
            )
        yield Endpoint(url, scrape or [])

    return point


async def run_sweep(
    opts: RunOptions,
    param: str,
    values: list[str],
    target: PointTarget,
    headroom: float = 0.1,
    knee_latency: str = "tpot_ms.p99",
    on_point: Callable[[str, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run every point and return the sweep document: points, knee, recommendation with reasons."""
    results: list[dict[str, Any]] = []
    for value in values:
        async with target(value) as endpoint:
            point_opts = replace(
                opts, url=endpoint.url, scrape_targets=endpoint.scrape or opts.scrape_targets
            )
            records, samples = await execute(point_opts)
            res = build_result(records, samples, point_opts)
        res["meta"]["param"] = param
        res["meta"]["value"] = value
        results.append(res)
        if on_point is not None:
            on_point(value, res)
    return analyse(param, values, results, opts.workload.slo.model_dump(), headroom, knee_latency)


def analyse(
    param: str,
    values: list[str],
    results: list[dict[str, Any]],
    slo: dict[str, Any],
    headroom: float = 0.1,
    knee_latency: str = "tpot_ms.p99",
) -> dict[str, Any]:
    """Knee and recommendation for finished points (pure: also used on saved sweep JSON)."""
    thr = [dig(r, "summary.output_throughput") or 0.0 for r in results]
    lat = [dig(r, f"summary.{knee_latency}") or 0.0 for r in results]
    knee = find_knee(thr, lat)
    rec = recommend(values, results, slo, headroom)
    return {
        "kind": "sweep",
        "param": param,
        "values": values,
        "slo": slo,
        "headroom": headroom,
        "knee_latency": knee_latency,
        "knee": None if knee is None else values[knee],
        "recommendation": None if rec.index is None else values[rec.index],
        "rejected": {values[i]: reason for i, reason in rec.reasons.items()},
        "points": results,
    }
