"""A real SGLang server for the engine tier (`make test-engine`): found where engines/sglang/setup.sh
prepared it, started on a free loopback port in a process group of its own, stopped with that group.

SGLang runs as three processes (HTTP + tokenizer, scheduler, detokenizer); signalling the group reaches
all of them, so a `kill()` is a real crash of the whole server and nothing outlives the session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.processes import ROOT
from tests.support.servers import free_port

SGLANG_VERSION = "0.5.23"
SERVED_MODEL = "tiny-llama"
SETUP = ROOT / "engines" / "sglang" / "setup.sh"
START_TIMEOUT_S = 240.0  # ~25 s on a quiet 2-core box; the CI shares its cores
# What every engine of the tier runs with (the simulator in the contract suite gets the same flags).
ENGINE_FLAGS = (
    "--max-total-tokens",
    "8192",
    "--max-running-requests",
    "2",
    "--max-queued-requests",
    "2",
    "--enable-priority-scheduling",
    "--enable-cache-report",  # usage's prompt_tokens_details.cached_tokens (the radix cache is on by default)
)


def engine_dir() -> Path:
    """Where setup.sh puts the venv and the model (same default, same override)."""
    cache = os.environ.get("OMNIGATE_ENGINE_CACHE") or str(Path.home() / ".cache" / "omnigate")
    return Path(cache) / f"sglang-{SGLANG_VERSION}"


def require_prepared() -> Path:
    """The prepared directory, or a loud failure (never a skip): the tier exists to run the engine."""
    d = engine_dir()
    if not (d / "ready").is_file() or not (d / "venv" / "bin" / "python").is_file():
        pytest.fail(
            f"no SGLang {SGLANG_VERSION} prepared in {d}: run `make test-engine` (it runs {SETUP} first)",
            pytrace=False,
        )
    return d


class EngineProcess:
    """`python -m sglang.launch_server` for the tiny model on the CPU; `extra` flags after the tier's."""

    def __init__(self, log_path: Path, *extra: str) -> None:
        self.dir = require_prepared()
        self.port = free_port()
        self.log_path = log_path
        self.argv = [
            str(self.dir / "venv" / "bin" / "python"),
            "-W",
            "ignore::UserWarning",
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(self.dir / "tiny-llama"),
            "--served-model-name",
            SERVED_MODEL,
            "--device",
            "cpu",
            "--attention-backend",
            "torch_native",
            "--sampling-backend",
            "pytorch",
            "--disable-overlap-schedule",
            "--dtype",
            "float32",
            "--enable-metrics",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *ENGINE_FLAGS,
            *extra,
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EngineProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMNIGATE_", "PYTHON"))}
        # one thread per core at most: the engine shares the machine with the tests and the gateway
        env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._healthy():
            if self.proc.poll() is not None:
                pytest.fail(f"SGLang exited with {self.proc.returncode} while starting:\n{self.tail()}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"SGLang not healthy after {START_TIMEOUT_S:.0f} s:\n{self.tail()}")
            time.sleep(0.5)
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2.0, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL to every process of the server: a crash, no shutdown code runs."""
        if self.proc is not None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the group, SIGKILL after `grace` seconds."""
        if self.proc is None:
            return
        self._signal_group(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(grace)
        self.kill()

    def tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
