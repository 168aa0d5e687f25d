"""Deployment config (config/gateway.yaml): what needs a restart. Validated at start, fails fast.

Environment variables override file values: `OMNIGATE_<SECTION>__<FIELD>=value`, nested with double
underscores, values parsed as YAML scalars (e.g. `OMNIGATE_LISTEN__PORT=9000`,
`OMNIGATE_ADMIN__TOKEN=...`). `OMNIGATE_ADMIN_TOKEN` is the default admin token source.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gateway.observability.settings import AlertsConfig


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Listen(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


class PoolConfig(_Strict):
    name: str = Field(min_length=1)
    kind: Literal["sglang"] = "sglang"
    models: list[str] = Field(min_length=1)
    backends: list[str] = Field(min_length=1)
    traffic_class: str | None = Field(None, description="Class this pool serves (defaults to the pool name).")
    max_connections: int = Field(1024, ge=1)
    max_keepalive: int = Field(256, ge=0)
    health_interval_s: float = Field(2.0, gt=0)
    priority_scheduling: bool = Field(
        False,
        description="The backends run SGLang's priority scheduling: pass each dispatch's engine priority "
        "(2 × the effective priority, + 1 while the tenant is under its fair share) in `priority`.",
    )

    @field_validator("backends")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        out = []
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"backend URL must start with http:// or https://: {url!r}")
            out.append(url.rstrip("/"))
        return out


class AdminConfig(_Strict):
    token: str | None = None
    token_env: str = "OMNIGATE_ADMIN_TOKEN"

    def resolve_token(self) -> str | None:
        return self.token or os.environ.get(self.token_env) or None


class StoreConfig(_Strict):
    kind: Literal["memory", "sqlite", "redis"] = "sqlite"
    path: str = "var/omnigate.sqlite3"
    redis_url: str | None = None
    redis_prefix: str = "omnigate:"
    redis_failure: Literal["open", "closed"] = "open"


class AuthConfig(_Strict):
    required: bool = Field(True, description="Require a tenant API key on /v1 routes.")


class LimitsConfig(_Strict):
    max_body_bytes: int = Field(64 * 1024 * 1024, gt=0)


class GatewayConfig(_Strict):
    listen: Listen = Field(default_factory=lambda: Listen())
    policy_path: str = "policies/default.yaml"
    watch_policy: bool = True
    admin: AdminConfig = Field(default_factory=lambda: AdminConfig())
    auth: AuthConfig = Field(default_factory=lambda: AuthConfig())
    store: StoreConfig = Field(default_factory=lambda: StoreConfig())
    limits: LimitsConfig = Field(default_factory=lambda: LimitsConfig())
    pools: list[PoolConfig] = Field(min_length=1)
    alerts: AlertsConfig = Field(default_factory=lambda: AlertsConfig())
    tenants: list[dict[str, Any]] = Field(
        default_factory=list, description="Tenants (and keys) created at start if missing: demos, tests."
    )
    access_log: bool = True
    access_log_sample_rate: float = Field(1.0, ge=0, le=1, description="Share of successful requests logged.")

    @model_validator(mode="after")
    def _unique_pools(self) -> GatewayConfig:
        names = [p.name for p in self.pools]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate pool names: {sorted(dupes)}")
        return self


class ConfigError(ValueError):
    """A config that cannot start the gateway; one message naming the field."""


def _apply_env(data: dict[str, Any], environ: dict[str, str]) -> dict[str, Any]:
    for key, raw in environ.items():
        if not key.startswith("OMNIGATE_") or "__" not in key:
            continue
        path = [p.lower() for p in key[len("OMNIGATE_") :].split("__")]
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = yaml.safe_load(raw) if raw else raw
    return data


def parse_config(data: Any, source: str = "<config>", environ: dict[str, str] | None = None) -> GatewayConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: top level must be a mapping")
    data = _apply_env(data, dict(os.environ if environ is None else environ))
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "(root)"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise ConfigError(f"{source}: {loc}: {first['msg']}{more}") from None


def load_config(path: str | Path, environ: dict[str, str] | None = None) -> GatewayConfig:
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from None
    cfg = parse_config(data, str(p), environ)
    base = p.resolve().parent.parent if p.parent.name == "config" else p.resolve().parent
    if not Path(cfg.policy_path).is_absolute():
        candidate = base / cfg.policy_path
        if candidate.exists() or not Path(cfg.policy_path).exists():
            cfg.policy_path = str(candidate)
    return cfg
