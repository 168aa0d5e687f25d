"""Two sglang-omni servers for the contract suite: 0.1.9's own app (with the stand-in coordinator) and the
simulator (`omnigate sim --api sglang-omni --omni-release later`), started once per session, and the way to
make each answer in a given shape: a marker in the prompt for the real app, an injected fault for the
simulator."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.omni_real import realapp
from tests.support.processes import Processes

SIM_TIME_SCALE = 20.0
SHAPES: dict[str, tuple[str, dict[str, object]]] = {
    # shape: (the real app's prompt marker, the simulator's faults)
    "overload": ("[overload]", {"error_rate": 1.0, "error_status": 503}),
    "overload-mid": (
        "[overload-mid]",
        {"disconnect_rate": 1.0, "disconnect_after_tokens": 2, "error_status": 503},
    ),
    "fail": ("[fail]", {"error_rate": 1.0, "error_status": 500}),
    "fail-mid": ("[fail-mid]", {"disconnect_rate": 1.0, "disconnect_after_tokens": 2, "error_status": 500}),
    "slow": ("[slow]", {"stall_rate": 1.0, "stall_s": 200.0}),  # a chat stream pauses after its first chunk
}
LONG_ANSWER = " Please read this out slowly." * 60  # the simulator's slow shape: a long speech
NO_FAULTS = {
    "error_rate": 0.0,
    "disconnect_rate": 0.0,
    "error_status": 500,
    "health_failing": False,
    "stall_rate": 0.0,
    "stall_s": 0.0,
}


@dataclass
class Omni:
    """One server under the contract: its URL, and how to make it answer in a shape."""

    kind: str  # "real" | "sim"
    url: str

    @contextlib.contextmanager
    def shape(self, name: str) -> Iterator[str]:
        """Within the block, requests whose prompt carries the yielded text answer in shape `name`."""
        marker, faults = SHAPES[name]
        if self.kind == "real":
            yield f" {marker}"
            return
        self._faults(faults)
        try:
            yield LONG_ANSWER if name == "slow" else ""
        finally:
            self._faults(NO_FAULTS)

    @contextlib.contextmanager
    def unhealthy(self) -> Iterator[None]:
        if self.kind == "real":
            realapp.set_running(self.url, False)
        else:
            self._faults({"health_failing": True})
        try:
            yield
        finally:
            if self.kind == "real":
                realapp.set_running(self.url, True)
            else:
                self._faults(NO_FAULTS)

    def aborts(self) -> int:
        """Requests the server aborted so far (an id aborted twice counts once)."""
        if self.kind == "real":
            return len(set(realapp.aborted(self.url)))
        totals = httpx.get(self.url + "/sim/omni/accounting?limit=0", trust_env=False).json()["totals"]
        return int(totals["aborted"])

    def _faults(self, faults: dict[str, object]) -> None:
        httpx.post(self.url + "/admin/faults", json=faults, trust_env=False).raise_for_status()


@pytest.fixture(scope="session")
def omni_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processes]:
    group = Processes(tmp_path_factory.mktemp("omni-real"))
    try:
        yield group
    finally:
        group.close()


@pytest.fixture(scope="session")
def real_omni(omni_processes: Processes) -> Omni:
    return Omni("real", realapp.start(omni_processes).url)


@pytest.fixture(scope="session")
def sim_omni(omni_processes: Processes) -> Omni:
    child = omni_processes.sim(
        "--api", "sglang-omni", "--omni-release", "later", "--model", realapp.MODEL,
        "--time-scale", str(SIM_TIME_SCALE), name="omni-sim",
    )  # fmt: skip
    return Omni("sim", child.url)


@pytest.fixture(params=["real", "sim"])
def omni(request: pytest.FixtureRequest) -> Omni:
    server = request.getfixturevalue(f"{request.param}_omni")
    assert isinstance(server, Omni)
    return server
