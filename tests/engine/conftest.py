"""The engine tier's servers: one real SGLang 0.5.23 for the session (tests/support/engine.py) and one
simulator started with the same flags and the `tiny-llama-cpu` profile (the engine's model, limits and
context). `server` runs a test against each; `engine` is the real one alone.

Each server's /metrics is read once right after start, before any test sends it work, so a test can check
what a fresh server exports (SGLang adds some series only when the first event of their kind happens).

`OMNIGATE_ENGINE_URL=http://…` runs the tier against an SGLang already running (started with the flags of
tests/support/engine.py, fresh) instead of starting one: a quicker loop while writing tests, or a GPU server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.support.engine import ENGINE_FLAGS, SERVED_MODEL, EngineProcess
from tests.support.processes import Processes


@dataclass(frozen=True)
class Server:
    name: str  # "sglang" (the real engine) or "sim"
    url: str
    fresh_metrics: str  # /metrics before the first request

    @property
    def real(self) -> bool:
        return self.name == "sglang"


def _metrics(url: str) -> str:
    return httpx.get(url + "/metrics", timeout=10.0, trust_env=False).text


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    url = os.environ.get("OMNIGATE_ENGINE_URL")
    if url:
        yield Server("sglang", url.rstrip("/"), _metrics(url.rstrip("/")))
        return
    proc = EngineProcess(tmp_path_factory.mktemp("sglang") / "sglang.log")
    try:
        proc.start()
        yield Server("sglang", proc.url, _metrics(proc.url))
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def simulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    group = Processes(tmp_path_factory.mktemp("sim"))
    try:
        flags = ("--profile", "tiny-llama-cpu", "--model", SERVED_MODEL, "--radix-cache", *ENGINE_FLAGS)
        sim = group.sim(*flags)  # the radix cache SGLang runs by default
        yield Server("sim", sim.url, _metrics(sim.url))
    finally:
        group.close()


@pytest.fixture(scope="session", params=["sglang", "sim"])
def server(request: pytest.FixtureRequest) -> Server:
    return request.getfixturevalue("engine" if request.param == "sglang" else "simulator")  # type: ignore[no-any-return]
