"""Fixtures: fake SGLang backends and a real gateway, each a real uvicorn server on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from gateway.http.app import create_app
from gateway.http.edge import edge_protocol
from gateway.settings.config import GatewayConfig, parse_config
from tests.support.fake_sglang import Behaviour, Record, make_app
from tests.support.servers import ServerThread, free_port, serve

ADMIN = "test-admin-token"


class Backend:
    def __init__(self, server: ServerThread, behaviour: Behaviour, record: Record) -> None:
        self.server = server
        self.behaviour = behaviour
        self.record = record

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as s:
        yield s


@pytest.fixture
def start_backend(stack: ExitStack) -> Callable[..., Backend]:
    def start(**kwargs: Any) -> Backend:
        app, behaviour, record = make_app(Behaviour(**kwargs))
        server = stack.enter_context(serve(app))
        return Backend(server, behaviour, record)

    return start


def gateway_config(backends: list[str], policy_path: Path, **overrides: Any) -> GatewayConfig:
    data: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": 0},
        "policy_path": str(policy_path),
        "admin": {"token": ADMIN},
        "auth": {"required": False},
        "store": {"kind": "memory"},
        "pools": [
            {"name": "interactive", "models": ["test-model"], "backends": backends, "health_interval_s": 0.2}
        ],
    }
    data.update(overrides)
    return parse_config(data, environ={})


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(
        "version: 1\npool_defaults:\n  timeouts: {connect: 1.0, first_byte: 5.0, idle: 5.0, total: 30}\n"
    )
    return path


@pytest.fixture
def start_gateway(stack: ExitStack, policy_file: Path) -> Callable[..., ServerThread]:
    def start(backends: list[str], *, edge: bool = False, **overrides: Any) -> ServerThread:
        """`edge`: under `omnigate serve`'s own protocol (gateway/http/edge.py), not uvicorn's."""
        config = gateway_config(backends, policy_file, **overrides)
        server = {"http": edge_protocol(config.limits)} if edge else {}
        return stack.enter_context(serve(create_app(config), **server))

    return start


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}"
