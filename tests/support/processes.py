"""Real child processes for end-to-end tests: `omnigate serve`, the simulated backend, a private redis-server.

Each child gets a free loopback port, writes stdout and stderr to one log file (so a test can read what it
printed, and a chatty child never blocks on a full pipe), and is waited for until it answers. `stop()` sends
SIGTERM then SIGKILL; `kill()` is `kill -9` on demand; `start()` again reuses the same port (a restart).
`Processes` tracks everything a test started and stops it all at teardown, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import pytest

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
Probe = Callable[["ManagedProcess"], bool]
REDIS_MISSING = (
    "redis-server is not installed: the Redis tests start their own from the system binary. Install it "
    "(Debian/Ubuntu: apt-get install redis-server; .ci/run does) and run the tests again."
)


def http_probe(path: str) -> Probe:
    """Ready once GET `path` answers 200."""

    def probe(proc: ManagedProcess) -> bool:
        try:
            return httpx.get(proc.url + path, timeout=1.0, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    return probe


def redis_probe(proc: ManagedProcess) -> bool:
    """Ready once the port answers a Redis PING with +PONG."""
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=1.0) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test's environment without OMNIGATE_* overrides (children see only their config file)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIGATE_")}
    env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


class ManagedProcess:
    """One child on a fixed loopback port; `argv` may contain `{port}`, filled in at every start."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        probe: Probe,
        *,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.port = port or free_port()
        self.argv = [a.format(port=self.port) for a in argv]
        self.log_path = log_path
        self.probe = probe
        self.env = child_env(env)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30.0) -> ManagedProcess:
        """Spawn (appending to the log, so a restart keeps the earlier run's output) and wait until ready."""
        assert not self.running, f"{self.name} is already running"
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while not self.probe(self):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{self.name} not ready after {timeout} s:\n{self.tail()}")
            time.sleep(0.05)
        return self

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited after `grace` seconds; its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        return code

    def kill(self) -> None:
        """`kill -9`: no shutdown code runs in the child."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def output(self) -> str:
        """Everything the child (every run of it) printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.output().splitlines()[-lines:])


class Processes:
    """Starts children under one log directory and stops all of them at `close()` (reverse order)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[ManagedProcess] = []

    def _add(
        self,
        name: str,
        argv: Sequence[str],
        probe: Probe,
        port: int | None,
        env: dict[str, str] | None = None,
        start_timeout: float = 30.0,
    ) -> ManagedProcess:
        taken = {c.name for c in self.children}
        unique = name if name not in taken else f"{name}-{len(self.children)}"
        child = ManagedProcess(unique, argv, self.log_dir / f"{unique}.log", probe, port=port, env=env)
        self.children.append(child)
        return child.start(start_timeout)

    def gateway(
        self,
        config: Path,
        name: str = "gateway",
        port: int | None = None,
        env: dict[str, str] | None = None,
        ready_path: str = "/readyz",
        args: Sequence[str] = (),
        start_timeout: float = 30.0,
    ) -> ManagedProcess:
        """`omnigate serve --config config [args…]` on its own port; ready when /readyz says every pool is
        (or when `ready_path` answers 200, for a gateway whose backends are not meant to be up)."""
        argv = [
            sys.executable,
            "-m",
            "gateway.cli",
            "serve",
            "--config",
            str(config),
            "--port",
            "{port}",
            *args,
        ]
        return self._add(name, argv, http_probe(ready_path), port, env, start_timeout)

    def sim(self, *args: str, name: str = "sim", port: int | None = None) -> ManagedProcess:
        """`python -m loadtest.sim --port P args…`; ready when /health answers."""
        argv = [sys.executable, "-m", "loadtest.sim", "--port", "{port}", *args]
        return self._add(name, argv, http_probe("/health"), port)

    def redis(
        self, data_dir: Path, *args: str, name: str = "redis", port: int | None = None
    ) -> ManagedProcess:
        """A private `redis-server` on loopback, no RDB snapshots, extra `args` (e.g. --appendonly yes)."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(REDIS_MISSING, pytrace=False)
        data_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            binary,
            "--port",
            "{port}",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--dir",
            str(data_dir),
            *args,
        ]
        return self._add(name, argv, redis_probe, port)

    def delay_proxy(self, upstream: ManagedProcess, delay_file: Path) -> ManagedProcess:
        """tests/support/delay_proxy.py in front of the Redis `upstream`: its replies held for the seconds
        `delay_file` says; ready when a PING goes through."""
        argv = [
            sys.executable,
            "-m",
            "tests.support.delay_proxy",
            "--port",
            "{port}",
            "--upstream-port",
            str(upstream.port),
            "--delay-file",
            str(delay_file),
        ]
        return self._add("delay-proxy", argv, redis_probe, None)

    def close(self) -> None:
        for child in reversed(self.children):
            child.stop(grace=5.0)
