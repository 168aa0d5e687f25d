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
from pydantic import Field, ValidationError, field_validator, model_validator

from gateway.settings.schema import Frozen, FrozenDict, describe


class Listen(Frozen):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


OmniVersion = Literal["snapshot", "later"]


class SGLangOmniServer(Frozen):
    """What the gateway must know of a pool's sglang-omni servers that they do not tell over HTTP
    (gateway/backends/README.md, "sglang-omni versions")."""

    version: OmniVersion = Field(
        "snapshot",
        description="snapshot: the April 2026 tree (2489a10) and servers like it — OpenAI content parts "
        "are not understood (the gateway sends the top-level media lists), thinker/talker caps 16/16, no "
        "abort on disconnect, every failure a 500; later: content parts parsed, caps 64/32, streams "
        "aborted on disconnect, 400 for the bad requests it recognises.",
    )
    thinker_max_running_requests: int | None = Field(
        None, ge=1, description="The thinker's cap if the server overrides it; None: the version's default."
    )
    talker_max_running_requests: int | None = Field(
        None, ge=1, description="The talker's cap if the server overrides it; None: the version's default."
    )
    encoder_max_batch_size: int = Field(32, ge=1, description="Media items an encoder runs in one batch.")
    code2wav_audio_seconds_per_s: float | None = Field(
        None, gt=0, description="Audio the serial vocoder makes per second, if known; None: measured."
    )


class PoolConfig(Frozen):
    name: str = Field(min_length=1)
    kind: Literal["sglang", "sglang-omni"] = "sglang"
    sglang_omni: SGLangOmniServer = Field(
        default_factory=lambda: SGLangOmniServer(), description="Only for kind: sglang-omni."
    )
    models: tuple[str, ...] = Field(min_length=1)
    backends: tuple[str, ...] = Field(min_length=1)
    traffic_class: str | None = Field(None, description="Class this pool serves (defaults to the pool name).")
    max_connections: int = Field(1024, ge=1)
    max_keepalive: int = Field(256, ge=0)
    health_interval_s: float = Field(2.0, gt=0)
    abort_delay_s: float = Field(
        0.1,
        ge=0,
        le=60,
        description="How long after its connection closes a backend stops a request it has not finished: "
        "the ledger's guess of what it did meanwhile, when the backend does not say (SGLang 0.5.23 and "
        "the simulator: ~0.1 s; SGLang 0.5.9's HTTP server: ~2 s).",
    )
    end_wait_s: float = Field(
        1.0,
        gt=0,
        le=30,
        description="How long the gateway reads on a request it ended for a departed client (the backend's "
        "`/abort_request`) for the usage the engine closes it with; none in time: the ledger guesses.",
    )
    priority_scheduling: bool = Field(
        False,
        description="The backends run SGLang's priority scheduling: pass each dispatch's engine priority "
        "(2 × the effective priority, + 1 while the tenant is under its fair share) in `priority`.",
    )

    @field_validator("backends")
    @classmethod
    def _urls(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for url in v:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"backend URL must start with http:// or https://: {url!r}")
        return tuple(url.rstrip("/") for url in v)

    @model_validator(mode="after")
    def _kind_settings(self) -> PoolConfig:
        if self.kind != "sglang-omni" and "sglang_omni" in self.model_fields_set:
            raise ValueError(f"pool {self.name!r}: sglang_omni settings need kind: sglang-omni")
        if self.kind == "sglang-omni" and self.priority_scheduling:
            raise ValueError(f"pool {self.name!r}: sglang-omni has no priority scheduling")
        return self


class AdminConfig(Frozen):
    token: str | None = None
    token_env: str = "OMNIGATE_ADMIN_TOKEN"
    openapi_public: bool = Field(
        False, description="Serve /admin/openapi.json without the admin token (it maps the admin API)."
    )

    def resolve_token(self) -> str | None:
        return self.token or os.environ.get(self.token_env) or None


class StoreConfig(Frozen):
    kind: Literal["memory", "sqlite", "redis"] = "sqlite"
    path: str = "var/omnigate.sqlite3"
    redis_url: str | None = None
    redis_prefix: str = "omnigate:"
    redis_failure: Literal["open", "closed"] = "open"
    deadline_s: float = Field(
        0.05,
        gt=0,
        description="How long a request waits for one call to a shared (redis) store: beyond it the "
        "failure mode applies to the request and the store is marked slow until a probe answers within it.",
    )
    outbox_path: str | None = Field(
        None,
        description="The ledger outbox file (charges the store could not take yet, retried until applied). "
        "Default: beside the SQLite file (`<path>.outbox`); var/omnigate-outbox.sqlite3 for redis; "
        "in memory for the memory store.",
    )

    def outbox_file(self) -> str | None:
        if self.outbox_path is not None:
            return self.outbox_path
        return {"sqlite": self.path + ".outbox", "redis": "var/omnigate-outbox.sqlite3"}.get(self.kind)


class CoordinationConfig(Frozen):
    """Shared engine budgets between replicas on one Redis store (gateway/coordination/); used only with
    `store.kind: redis`."""

    enabled: bool = Field(
        True,
        description="Share the engines' budgets with the other replicas on the store (off: each "
        "replica gives every engine its whole budget, as one process does).",
    )
    lease_ttl_s: float = Field(
        3.0,
        gt=0,
        description="A replica's share of a backend lives this long unless refreshed; a killed "
        "replica's share returns within it.",
    )
    refresh_s: float = Field(0.25, gt=0, description="How often a replica refreshes its leases.")
    replicas_hint: int = Field(
        1, ge=1, description="Replicas assumed before the first answer from Redis (the fallback's N)."
    )
    redis_timeout_s: float = Field(0.5, gt=0, description="A lease refresh slower than this has failed.")

    @model_validator(mode="after")
    def _refresh_within_ttl(self) -> CoordinationConfig:
        if self.refresh_s * 2 > self.lease_ttl_s:
            raise ValueError("coordination.refresh_s must be at most half of lease_ttl_s")
        return self


class AuthConfig(Frozen):
    required: bool = Field(True, description="Require a tenant API key on /v1 routes.")


class ShutdownConfig(Frozen):
    drain_s: float = Field(
        20.0,
        ge=0,
        description="After SIGTERM: how long requests already on a backend may run before the process "
        "exits (it exits sooner once none is left). Queued and new requests get 503 shutting_down at once.",
    )


class LimitsConfig(Frozen):
    """What one client may hold: the body size, and the HTTP limits at the edge (gateway/http/edge.py)."""

    max_body_bytes: int = Field(64 * 1024 * 1024, gt=0)
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="Request line and headers together; beyond: 431 and close."
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="From a connection's start, or a request's first byte, to its last header."
    )
    keepalive_timeout_s: int = Field(
        30, ge=1, description="An idle kept-alive connection closes after this (above the load balancer's)."
    )
    max_connections: int = Field(
        2048, ge=1, description="Open client connections; one more is answered 503 and closed."
    )


SinkKind = Literal["webhook", "wecom", "slack"]


class SinkConfig(Frozen):
    """One notification target. The URL may come from the environment so webhook keys stay out of files."""

    kind: SinkKind
    name: str = Field(default="", description="Label in logs and metrics; defaults to the kind.")
    url: str | None = None
    url_env: str | None = Field(default=None, description="Environment variable holding the URL.")

    @model_validator(mode="before")
    @classmethod
    def _named(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("name") and isinstance(data.get("kind"), str):
            return {**data, "name": data["kind"]}
        return data

    @model_validator(mode="after")
    def _check(self) -> SinkConfig:
        if (self.url is None) == (self.url_env is None):
            raise ValueError(f"sink {self.name!r}: set exactly one of url or url_env")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"sink {self.name!r}: url must start with http:// or https://")
        return self

    def resolve_url(self, environ: dict[str, str] | None = None) -> str | None:
        if self.url is not None:
            return self.url
        env = os.environ if environ is None else environ
        return env.get(self.url_env or "") or None


class AlertsConfig(Frozen):
    """Deployment side of alerting (key `alerts`): sinks, delivery, evaluation cadence, the rolling SLO
    window. The thresholds are a policy section (gateway/observability/settings.py), tuned live."""

    enabled: bool = True
    sinks: tuple[SinkConfig, ...] = ()
    evaluation_interval_s: float = Field(default=5.0, gt=0)
    slo_window_s: float = Field(default=300.0, gt=0, description="Rolling window of P99 and SLO attainment.")
    timeout_s: float = Field(default=5.0, gt=0, description="Per delivery attempt.")
    retries: int = Field(default=3, ge=0, le=10)
    backoff_s: float = Field(default=1.0, gt=0, description="First retry delay; doubles each attempt.")
    backoff_max_s: float = Field(default=30.0, gt=0)
    queue_size: int = Field(
        default=1000, ge=1, description="Pending messages per sink; oldest dropped when full."
    )

    @model_validator(mode="after")
    def _unique_names(self) -> AlertsConfig:
        names = [s.name for s in self.sinks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate sink names: {dupes} (give each sink a distinct name)")
        return self


class TracingConfig(Frozen):
    """OpenTelemetry traces over OTLP/HTTP (gateway/observability/tracing.py); needs the `otel` extra."""

    enabled: bool = Field(False, description="Off: no tracing code is loaded and requests pay nothing.")
    endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces", description="The collector's OTLP/HTTP traces URL (protobuf)."
    )
    service_name: str = Field("omnigate", min_length=1, description="The `service.name` resource attribute.")
    sampling_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Share of new traces kept; a client's `traceparent` decides for its own trace.",
    )
    headers: FrozenDict[str, str] = Field(
        default_factory=dict, description="Sent with every export (a collector's auth header)."
    )
    timeout_s: float = Field(10.0, gt=0, description="One export's time limit.")
    schedule_delay_s: float = Field(5.0, gt=0, description="How often the batch of ended spans is sent.")
    max_queue_size: int = Field(2048, ge=1, description="Ended spans held for export; beyond, dropped.")

    @field_validator("endpoint")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"endpoint must start with http:// or https://: {v!r}")
        return v


class GatewayConfig(Frozen):
    listen: Listen = Field(default_factory=lambda: Listen())
    policy_path: str = "policies/default.yaml"
    watch_policy: bool = True
    admin: AdminConfig = Field(default_factory=lambda: AdminConfig())
    auth: AuthConfig = Field(default_factory=lambda: AuthConfig())
    store: StoreConfig = Field(default_factory=lambda: StoreConfig())
    coordination: CoordinationConfig = Field(default_factory=lambda: CoordinationConfig())
    limits: LimitsConfig = Field(default_factory=lambda: LimitsConfig())
    shutdown: ShutdownConfig = Field(default_factory=lambda: ShutdownConfig())
    pools: tuple[PoolConfig, ...]
    alerts: AlertsConfig = Field(default_factory=lambda: AlertsConfig())
    tracing: TracingConfig = Field(default_factory=lambda: TracingConfig())
    tenants: tuple[FrozenDict[str, Any], ...] = Field(
        default=(), description="Tenants (and keys) created at start if missing: demos, tests."
    )
    access_log: bool = True
    access_log_sample_rate: float = Field(1.0, ge=0, le=1, description="Share of successful requests logged.")

    @field_validator("pools")
    @classmethod
    def _some_pool(cls, pools: tuple[PoolConfig, ...]) -> tuple[PoolConfig, ...]:
        # not `min_length`: a tuple whose one pool is invalid would then also be reported "too short"
        if not pools:
            raise ValueError("at least one pool is required")
        return pools

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
        raise ConfigError(f"{source}: {describe(e)}") from None


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
            return cfg.model_copy(update={"policy_path": str(candidate)})
    return cfg
