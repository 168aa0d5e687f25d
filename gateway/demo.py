"""`omnigate demo` (what `make demo` runs): simulated backends, the gateway, a mixed workload and a view.

Everything it starts is a child process it owns: started in its own session (Ctrl-C in the terminal reaches
only the demo, which then stops the gateway first and the simulators after it), with Linux's parent-death
signal set so that even `kill -9` of the demo leaves no server behind. The workload reuses the load-test
harness (request factory, synthetic media, streaming client) rather than a second client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.config import ConfigError, parse_config
from gateway.demo_view import (
    BackendView,
    Snapshot,
    observe,
    plain_line,
    render,
    summary_line,
)
from loadtest.arrivals import constant_shape, schedule
from loadtest.client import send
from loadtest.http import HttpPool
from loadtest.media import MediaCache
from loadtest.ports import free_port
from loadtest.records import RequestRecord
from loadtest.workload import RequestFactory, Workload

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "config" / "demo.yaml"
DEFAULT_PORT = 8080
LOAD_WINDOW_WHEN_UNBOUNDED_S = 60.0  # --duration 0: drive load this long, then keep serving until Ctrl-C
START_TIMEOUT_S = 60.0
GATEWAY_STOP_S = 12.0  # uvicorn's graceful shutdown in `omnigate serve` is 10 s
SIM_STOP_S = 5.0


class DemoError(RuntimeError):
    """The demo cannot start or run; the message says which part and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Stream(_Strict):
    share: float = Field(1.0, gt=0)
    workload: dict[str, Any] = Field(default_factory=dict, description="A loadtest workload (partial).")


class DemoSettings(_Strict):
    model: str = "qwen2.5-omni-7b"
    rate: float = Field(3.0, gt=0, description="Requests per wall-clock second across all streams.")
    max_in_flight: int = Field(48, ge=1)
    request_timeout_s: float = Field(60.0, gt=0)
    drain_s: float = Field(5.0, ge=0)
    sim_args: dict[str, list[str]] = Field(default_factory=dict)
    streams: list[Stream] = Field(default_factory=lambda: [Stream(share=1.0)], min_length=1)


@dataclass(slots=True)
class SimSpec:
    name: str
    pool: str
    port: int
    args: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(slots=True)
class Plan:
    """Everything decided before a process starts: ports, the runtime gateway config, the workload."""

    gateway_doc: dict[str, Any]
    settings: DemoSettings
    sims: list[SimSpec]
    port: int
    admin_token: str | None
    keys: dict[str, str]  # plaintext demo key → tenant id

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def choose_port(requested: int | None) -> int:
    """The requested port (an error if taken), else 8080, else any free port (0 also means any)."""
    if requested == 0:
        return free_port()
    if requested is not None:
        if not _port_free(requested):
            raise DemoError(f"port {requested} is in use; pick another with --port or use --port 0")
        return requested
    return DEFAULT_PORT if _port_free(DEFAULT_PORT) else free_port()


def build_plan(path: Path, port: int, time_scale: float) -> Plan:
    """Read config/demo.yaml, give every listed backend a simulator on a free port, validate it all."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise DemoError(f"{path}: {e}") from None
    if not isinstance(doc, dict):
        raise DemoError(f"{path}: top level must be a mapping")
    try:
        settings = DemoSettings.model_validate(doc.pop("demo", None) or {})
    except ValidationError as e:
        first = e.errors()[0]
        raise DemoError(f"{path}: demo.{'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    doc.setdefault("listen", {}).update(host="127.0.0.1", port=port)
    policy = Path(doc.get("policy_path", "policies/default.yaml"))
    doc["policy_path"] = str(policy if policy.is_absolute() else ROOT / policy)
    sims: list[SimSpec] = []
    for pool in doc.get("pools") or []:
        if not isinstance(pool, dict):
            continue
        extra = ["--time-scale", repr(time_scale), *settings.sim_args.get(pool.get("name", ""), [])]
        extra += ["--model", settings.model]
        urls = []
        for i, _ in enumerate(pool.get("backends") or []):
            spec = SimSpec(f"{pool.get('name')}-{i}", str(pool.get("name")), free_port(), extra)
            sims.append(spec)
            urls.append(spec.url)
        pool["backends"] = urls
    try:
        config = parse_config(doc, str(path))
    except ConfigError as e:
        raise DemoError(str(e)) from None
    keys = {k: str(t.get("id")) for t in config.tenants for k in t.get("keys", [])}
    return Plan(doc, settings, sims, port, config.admin.resolve_token(), keys)


# -- child processes -------------------------------------------------------------------------------------
def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: SIGTERM when the demo dies


@dataclass(slots=True)
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, limit: int = 2000) -> str:
        try:
            return self.log.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""


@dataclass(slots=True)
class Children:
    """The processes this demo started, stopped in reverse start order: the gateway before its backends."""

    logdir: Path
    items: list[Child] = field(default_factory=list)

    def start(self, name: str, url: str, argv: list[str]) -> Child:
        log = self.logdir / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        child = Child(name, proc, log)
        self.items.append(child)
        print(f"  started {name:<14} pid {proc.pid:<7} {url}", flush=True)
        return child

    async def stop(self) -> None:
        """SIGTERM, wait, SIGKILL after the timeout; the gateway first so it drains before backends go."""
        gateways = [c for c in self.items if c.name == "gateway"]
        await _stop_group(gateways, GATEWAY_STOP_S)
        await _stop_group([c for c in self.items if c not in gateways], SIM_STOP_S)

    def kill_remaining(self) -> None:
        """Last resort (the async stop was interrupted): nothing may outlive the demo."""
        for c in self.items:
            if c.proc.poll() is None:
                c.proc.kill()
                c.proc.wait()


async def _stop_group(children: list[Child], grace_s: float) -> None:
    for c in children:
        if c.proc.poll() is None:
            c.proc.terminate()
    deadline = time.monotonic() + grace_s
    for c in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(c.proc.wait, max(0.0, deadline - time.monotonic()))
        if c.proc.poll() is None:
            print(f"{c.name} (pid {c.proc.pid}) did not stop in {grace_s:.0f} s; killing it", flush=True)
            c.proc.kill()
            c.proc.wait()


def _ending(code: int | None) -> str:
    """uvicorn re-raises SIGTERM after its graceful shutdown, so -15 is the normal ending."""
    names = {-signal.SIGTERM: "terminated", -signal.SIGKILL: "killed", 0: "exited"}
    return names.get(code or 0, f"exit {code}")


async def wait_ready(client: httpx.AsyncClient, child: Child, url: str, stop: asyncio.Event) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not stop.is_set():
        if child.proc.poll() is not None:
            raise DemoError(f"{child.name} exited with code {child.proc.returncode}:\n{child.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(url, timeout=2.0)).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise DemoError(f"{child.name} not ready after {START_TIMEOUT_S:.0f} s ({url}):\n{child.tail()}")
        await asyncio.sleep(0.1)


# -- workload --------------------------------------------------------------------------------------------
class Load:
    """An open-loop Poisson workload over the configured streams, bounded in time, count and in-flight."""

    def __init__(self, settings: DemoSettings, url: str, seed: int = 0) -> None:
        self.settings = settings
        self.url = url
        self.rng = random.Random(seed)
        self.records: list[RequestRecord] = []
        self.skipped = 0
        self.factories: list[RequestFactory] = []
        media = MediaCache(seed=seed)
        for i, stream in enumerate(settings.streams):
            try:
                w = Workload.model_validate({"model": settings.model, **stream.workload})
            except ValidationError as e:
                raise DemoError(f"demo.streams[{i}].workload: {e.errors()[0]['msg']}") from None
            self.factories.append(RequestFactory(w, media, worker=i))
        self.shares = [s.share for s in settings.streams]

    def prewarm(self) -> None:
        """Render the synthetic images up front so no send waits on Pillow."""
        for f in self.factories:
            f.prewarm()

    async def run(self, start: float, window_s: float, stop: asyncio.Event) -> None:
        s = self.settings
        offsets = schedule(constant_shape(s.rate), duration=window_s, count=int(s.rate * window_s) + 1)
        pool = HttpPool(self.url)
        tasks: set[asyncio.Task[RequestRecord]] = set()
        try:
            for offset in offsets:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), start + offset - time.perf_counter())
                if stop.is_set():
                    break
                if len(tasks) >= s.max_in_flight:
                    self.skipped += 1
                    continue
                req = self.rng.choices(self.factories, weights=self.shares)[0].next()
                rec = RequestRecord()
                self.records.append(rec)
                task = asyncio.create_task(send(pool, req, rec, start, s.request_timeout_s))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            stopper = asyncio.ensure_future(stop.wait())
            deadline = time.perf_counter() + s.drain_s
            while tasks and not stop.is_set() and (left := deadline - time.perf_counter()) > 0:
                await asyncio.wait({*tasks, stopper}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
        finally:
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await pool.aclose()


def backends_of(plan: Plan) -> list[BackendView]:
    return [BackendView(s.name, s.pool, s.url) for s in plan.sims]


def print_banner(plan: Plan) -> None:
    key = next(iter(plan.keys), "<api key>")
    lines = [
        "",
        f"omnigate demo is up: {plan.base_url}/v1",
        "  demo API keys: " + ", ".join(f"{k} ({t})" for k, t in plan.keys.items()),
        f"  admin token:   {plan.admin_token}" if plan.admin_token else "",
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
    print("\n".join(line for line in lines if line is not None), flush=True)


async def run(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    plan = build_plan(Path(args.config), choose_port(args.port), args.time_scale)
    load = None if args.no_load else Load(plan.settings, plan.base_url, args.seed)
    with tempfile.TemporaryDirectory(prefix="omnigate-demo-") as tmp:
        children = Children(Path(tmp))
        try:
            return await _run_with(args, plan, load, children, Path(tmp), stop)
        finally:
            if any(c.proc.poll() is None for c in children.items):
                print("stopping the gateway and simulators…", flush=True)
            try:
                await children.stop()
            finally:
                children.kill_remaining()
            if children.items:
                ends = ", ".join(f"{c.name} {_ending(c.proc.returncode)}" for c in children.items)
                print(f"stopped {len(children.items)} processes: {ends}", flush=True)


async def _run_with(
    args: argparse.Namespace,
    plan: Plan,
    load: Load | None,
    children: Children,
    tmp: Path,
    stop: asyncio.Event,
) -> int:
    config_path = tmp / "gateway.yaml"
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

    async def snapshot(phase: str) -> Snapshot:
        gateway, backends = await observe(client, plan.base_url, plan.admin_token, backends_of(plan))
        records, skipped = (load.records, load.skipped) if load else ([], 0)
        elapsed = time.perf_counter() - start
        return Snapshot(
            plan.base_url, elapsed, phase, args.time_scale, records, skipped, plan.keys, gateway, backends
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
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="demo config (gateway config + `demo:`)")
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


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
