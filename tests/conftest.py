"""Suite-wide rules: what a unit test may touch, and the one private redis-server every Redis test uses.

Markers (`pyproject.toml`): a test module that starts servers or processes says so with
`pytestmark = pytest.mark.e2e`; every other test is a `unit` test (`make test-fast` runs only those). A unit
test runs on a fake clock or pure values: it may not open a network socket nor start a process, and the
guard below fails it if it does, so the marker cannot lie.

Redis: the first test that asks for `redis_url` starts `redis-server` (the system binary) on a free
loopback port with a private data directory and no persistence; it serves the whole session and is
stopped at its end. Nothing touches a Redis the machine may already run (6379 or any other).

The engine tier (tests/engine/, a real SGLang) is collected only with `--engine` (`make test-engine`).
"""

from __future__ import annotations

import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.support.processes import ManagedProcess, Processes

ENGINE_TESTS = Path(__file__).parent / "engine"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--engine", action="store_true", help="collect tests/engine/ (a real SGLang: `make test-engine`)"
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/engine/ needs a prepared SGLang and minutes of CPU: out of `make test`, in `make test-engine`."""
    if collection_path == ENGINE_TESTS and not config.getoption("--engine"):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.unit)


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(
            f"a unit test {what}; mark its module `pytestmark = pytest.mark.e2e` (see tests/conftest.py)"
        )

    return refuse


@pytest.fixture(autouse=True)
def _unit_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests get no network sockets and no child processes (socketpairs, as event loops use, pass)."""
    if request.node.get_closest_marker("e2e") is not None:
        return
    for name in ("bind", "connect", "connect_ex"):
        monkeypatch.setattr(socket.socket, name, _refuse(f"opened a socket ({name})"))
    monkeypatch.setattr(subprocess.Popen, "__init__", _refuse("started a process"))


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    """One private redis-server for the session (see the module docstring)."""
    group = Processes(tmp_path_factory.mktemp("redis"))
    try:
        yield group.redis(group.log_dir / "data", "--appendonly", "no")
    finally:
        group.close()


@pytest.fixture(scope="session")
def redis_url(redis_server: ManagedProcess) -> str:
    return f"redis://127.0.0.1:{redis_server.port}/0"


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted afterwards."""
    prefix = f"omnigate-test:{uuid.uuid4().hex}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
