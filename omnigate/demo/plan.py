"""What a demo run is made of, decided before any process starts: ports, the gateway config, the workload.

The demo config is a gateway config plus a `demo:` section. Every URL listed under `pools[].backends` is a
placeholder that becomes a simulator on a free loopback port. A relative `policy_path` is resolved against
the config's own directory; the shipped policy (policy.yaml beside demo.yaml) is copied into the run
directory first, so the copy can be edited while the demo runs without touching the installed package.
"""

from __future__ import annotations

import shutil
import socket
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from gateway.settings.config import ConfigError, parse_config
from gateway.settings.schema import Frozen, FrozenDict, describe
from loadtest.ports import free_port

DEFAULT_PORT = 8080
SHIPPED = resources.files("omnigate.demo")


def default_config() -> Path:
    """demo.yaml as shipped in the package (a real file both in a checkout and in an installed wheel)."""
    return Path(str(SHIPPED.joinpath("demo.yaml")))


class DemoError(RuntimeError):
    """The demo cannot start or run; the message says which part and why."""


class Stream(Frozen):
    share: float = Field(1.0, gt=0)
    workload: FrozenDict[str, Any] = Field(default_factory=dict, description="A loadtest workload (partial).")


class DemoSettings(Frozen):
    model: str = "qwen2.5-omni-7b"
    rate: float = Field(3.0, gt=0, description="Requests per wall-clock second across all streams.")
    max_in_flight: int = Field(48, ge=1)
    request_timeout_s: float = Field(60.0, gt=0)
    drain_s: float = Field(5.0, ge=0)
    sim_args: FrozenDict[str, tuple[str, ...]] = Field(default_factory=dict)
    streams: tuple[Stream, ...] = Field(default_factory=lambda: (Stream(share=1.0),), min_length=1)


@dataclass(frozen=True, slots=True)
class SimSpec:
    name: str
    pool: str
    port: int
    args: tuple[str, ...]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything decided before a process starts: ports, the runtime gateway config, the workload."""

    gateway_doc: dict[str, Any]
    settings: DemoSettings
    sims: tuple[SimSpec, ...]
    port: int
    admin_token: str | None
    keys: dict[str, str]  # plaintext demo key → tenant id

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def policy_path(self) -> Path:
        return Path(self.gateway_doc["policy_path"])


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


def build_plan(
    path: Path,
    port: int,
    time_scale: float,
    run_dir: Path,
    *,
    policy: Path | None = None,
    ports: Callable[[], int] = free_port,
) -> Plan:
    """Read the demo config, give every listed backend a simulator on a port from `ports`, validate it all.

    `policy` replaces the config's `policy_path`; the shipped policy is copied into `run_dir`."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise DemoError(f"{path}: {e}") from None
    if not isinstance(doc, dict):
        raise DemoError(f"{path}: top level must be a mapping")
    try:
        settings = DemoSettings.model_validate(doc.pop("demo", None) or {})
    except ValidationError as e:
        raise DemoError(f"{path}: {describe(e, 'demo')}") from None
    doc.setdefault("listen", {}).update(host="127.0.0.1", port=port)
    doc["policy_path"] = str(_policy(path, doc.get("policy_path"), policy, run_dir))
    sims: list[SimSpec] = []
    for pool in doc.get("pools") or []:
        if not isinstance(pool, dict):
            continue
        name = str(pool.get("name", ""))
        models = pool.get("models") or [settings.model]
        extra = (
            "--time-scale",
            repr(time_scale),
            *settings.sim_args.get(name, ()),
            "--model",
            str(models[0]),  # the pool's model: a speech pool may serve another than the demo's
        )
        specs = [
            SimSpec(f"{name}-{i}", name, ports(), extra) for i, _ in enumerate(pool.get("backends") or [])
        ]
        pool["backends"] = [s.url for s in specs]
        sims += specs
    try:
        config = parse_config(doc, str(path))
    except ConfigError as e:
        raise DemoError(str(e)) from None
    keys = {k: str(t.get("id")) for t in config.tenants for k in t.get("keys", [])}
    return Plan(doc, settings, tuple(sims), port, config.admin.resolve_token(), keys)


def _policy(config: Path, named: Any, override: Path | None, run_dir: Path) -> Path:
    """The policy file the gateway watches: `override`, else the config's (relative to the config file);
    a file shipped in this package is watched as a copy in `run_dir`."""
    if override is not None:
        return override.resolve()
    path = Path(str(named or "policy.yaml"))
    if not path.is_absolute():
        path = config.resolve().parent / path
    if path.parent == default_config().parent:
        copy = run_dir / path.name
        shutil.copyfile(path, copy)
        return copy
    return path
