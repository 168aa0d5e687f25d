"""`omnigate demo` (what `make demo` runs): simulated backends, the gateway, a mixed workload and a view."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.livepolicy.policy import PolicyError, load_policy
from omnigate.demo.load import Load
from omnigate.demo.plan import DEFAULT_PORT, DemoError, Plan, build_plan, choose_port, default_config
from omnigate.demo.processes import ChildFailed, Children, wait_ready
from omnigate.demo.view import (
    BackendView,
    Objective,
    Snapshot,
    objectives,
    observe,
    plain_line,
    render,
    summary_line,
    verdict,
)

LOAD_WINDOW_WHEN_UNBOUNDED_S = 60.0  # --duration 0: drive load this long, then keep serving until Ctrl-C


def backends_of(plan: Plan) -> list[BackendView]:
    return [BackendView(s.name, s.pool, s.url) for s in plan.sims]


def print_banner(plan: Plan) -> None:
    key = next(iter(plan.keys), "<api key>")
    lines = [
        "",
        f"omnigate demo is up: {plan.base_url}/v1",
        "  demo API keys: " + ", ".join(f"{k} ({t})" for k, t in plan.keys.items()),
        f"  admin token:   {plan.admin_token}" if plan.admin_token else "",
        f"  live policy:   {plan.policy_path} (edit it while the demo runs: the gateway reloads it)",
        "",
        "Try it from another terminal while the demo runs:",
        "  from openai import OpenAI",
        f'  client = OpenAI(base_url="{plan.base_url}/v1", api_key="{key}")',
        f'  r = client.chat.completions.create(model="{plan.settings.model}",',
        '      messages=[{"role": "user", "content": "Hello!"}],',
        '      extra_headers={"x-omnigate-class": "interactive"})',
        "  print(r.choices[0].message.content)",
        "",
    ]
    print("\n".join(lines), flush=True)


async def run(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    with tempfile.TemporaryDirectory(prefix="omnigate-demo-") as tmp:
        run_dir = Path(tmp)
        policy = Path(args.policy) if args.policy else None
        plan = build_plan(Path(args.config), choose_port(args.port), args.time_scale, run_dir, policy=policy)
        load = None if args.no_load else Load(plan.settings, plan.base_url, args.seed)
        children = Children(run_dir)
        try:
            return await _run_with(args, plan, load, children, stop)
        except ChildFailed as e:
            raise DemoError(str(e)) from None
        finally:
            if any(c.proc.poll() is None for c in children.items):
                print("stopping the gateway and simulators…", flush=True)
            try:
                await children.stop()
            finally:
                children.kill_remaining()
            if children.items:
                print(f"stopped {len(children.items)} processes: {children.endings()}", flush=True)


async def _run_with(
    args: argparse.Namespace, plan: Plan, load: Load | None, children: Children, stop: asyncio.Event
) -> int:
    config_path = children.workdir / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(plan.gateway_doc, sort_keys=False), encoding="utf-8")
    py = sys.executable
    sims = [
        children.start(
            s.name, s.url, [py, "-m", "loadtest.sim", "--host", "127.0.0.1", "--port", str(s.port), *s.args]
        )
        for s in plan.sims
    ]
    prewarm = asyncio.create_task(asyncio.to_thread(load.prewarm)) if load else None
    async with httpx.AsyncClient(trust_env=False) as client:
        for child, spec in zip(sims, plan.sims, strict=True):  # they start in parallel; wait in turn
            await wait_ready(client, child, spec.url + "/health", stop)
        if stop.is_set():
            return 0
        gw_argv = [py, "-m", "gateway.cli", "serve", "--config", str(config_path)]
        gw = children.start("gateway", plan.base_url, gw_argv)
        await wait_ready(client, gw, plan.base_url + "/readyz", stop)
        if prewarm is not None:
            await prewarm
        if stop.is_set():
            return 0
        print_banner(plan)
        return await _show(args, plan, load, client, stop)


async def _show(
    args: argparse.Namespace, plan: Plan, load: Load | None, client: httpx.AsyncClient, stop: asyncio.Event
) -> int:
    start = time.perf_counter()
    window = args.duration if args.duration > 0 else LOAD_WINDOW_WHEN_UNBOUNDED_S
    load_task = asyncio.create_task(load.run(start, window, stop)) if load else None
    live = sys.stdout.isatty() and not args.plain
    ctx: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if live:
        from rich.live import Live

        ctx = Live(refresh_per_second=2, redirect_stdout=False)

    goals: dict[str, Objective] = {}

    async def snapshot(phase: str) -> Snapshot:
        nonlocal goals
        gateway, backends = await observe(client, plan.base_url, plan.admin_token, backends_of(plan))
        records, skipped = (load.records, load.skipped) if load else ([], 0)
        elapsed = time.perf_counter() - start
        with contextlib.suppress(PolicyError):  # the policy as it is now (edited live: the last good one)
            goals = objectives(load_policy(plan.policy_path))
        return Snapshot(
            plan.base_url,
            elapsed,
            phase,
            args.time_scale,
            records,
            skipped,
            plan.keys,
            goals,
            gateway,
            backends,
        )

    with ctx as view:
        while not stop.is_set():
            elapsed = time.perf_counter() - start
            busy = load_task is not None and not load_task.done()
            if args.duration > 0 and elapsed >= args.duration and not busy:
                break
            phase = ("load" if elapsed < window else "drain") if busy else "serving (Ctrl-C to stop)"
            snap = await snapshot(phase)
            if view is not None:
                view.update(render(snap))
            else:
                print(plain_line(snap), flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5 if live else args.print_every)
        if load_task is not None:
            stop.set()  # Ctrl-C: cut the load short (its records say `unfinished`)
            await load_task
        snap = await snapshot("finished")
        if view is not None:
            view.update(render(snap))
        else:
            print(plain_line(snap), flush=True)
            print("\n".join(line.plain for line in verdict(snap)), flush=True)
    print(summary_line(snap.records, snap.skipped), flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omnigate demo", description=__doc__.splitlines()[0] if __doc__ else None
    )
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load and view; 0 = until Ctrl-C")
    p.add_argument(
        "--port", type=int, help=f"gateway port (default {DEFAULT_PORT}, else a free one; 0 = any)"
    )
    p.add_argument("--no-load", action="store_true", help="start everything but send no demo traffic")
    p.add_argument(
        "--time-scale", type=float, default=1.0, help="simulated engines run this many times faster"
    )
    p.add_argument("--config", default=str(default_config()), help="demo config (gateway config + `demo:`)")
    p.add_argument(
        "--policy", help="policy file to run and watch (default: a copy of the shipped demo policy)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plain", action="store_true", help="plain summary lines even on a terminal")
    p.add_argument("--print-every", type=float, default=5.0, help="seconds between plain summary lines")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.duration < 0 or args.time_scale <= 0 or args.print_every <= 0:
        print("omnigate demo: --duration must be >= 0, --time-scale and --print-every > 0", file=sys.stderr)
        return 2
    try:
        return asyncio.run(run(args))
    except DemoError as e:
        print(f"omnigate demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
