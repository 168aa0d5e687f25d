"""Alerting settings, split by how they change.

`AlertThresholds` is a policy section (key `alerts` in policies/*.yaml): ops tune it live, a reload takes
effect at the next evaluation. `AlertsConfig` is deployment config (key `alerts` in config/gateway.yaml):
where notifications go and how they are delivered, read once at start.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

RuleName = Literal["queue_depth", "ttft_slo", "tpot_slo", "kv_usage", "backend_down", "rejection_rate"]


class AlertThresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    queue_depth: int = Field(default=100, ge=1, description="Fire when a pool's queue holds more than this.")
    queue_depth_per_pool: dict[str, int] = Field(default_factory=dict, description="Per-pool overrides.")
    kv_usage: float = Field(
        default=0.85, gt=0, le=1, description="Fire when a backend's scraped KV fill is above."
    )
    rejection_rate: float = Field(
        default=0.05, ge=0, le=1, description="Fire when rejected/answered is above."
    )
    rejection_window_s: float = Field(
        default=300.0, gt=0, description="Window the rejection rate is measured on."
    )
    rejection_min_requests: int = Field(
        default=20, ge=1, description="No rate alert on fewer answered requests."
    )
    slo_min_samples: int = Field(default=20, ge=1, description="No P99 alert on fewer latency samples.")
    for_s: float = Field(default=60.0, ge=0, description="How long a condition must hold before it fires.")
    for_overrides: dict[RuleName, float] = Field(
        default_factory=lambda: dict[RuleName, float]({"backend_down": 10.0}),
        description="Per-rule `for` durations.",
    )
    repeat_s: float = Field(default=3600.0, gt=0, description="Re-send a still-firing alert this often.")
    failure_alerts: bool = True
    failure_burst: int = Field(
        default=5, ge=1, description="Failure messages sent at once per failure window."
    )
    failure_window_s: float = Field(
        default=60.0, gt=0, description="Extra failures in a window go into one summary."
    )

    def for_rule(self, rule: RuleName) -> float:
        return self.for_overrides.get(rule, self.for_s)

    def queue_limit(self, pool: str) -> int:
        return self.queue_depth_per_pool.get(pool, self.queue_depth)


SinkKind = Literal["webhook", "wecom", "slack"]


class SinkConfig(BaseModel):
    """One notification target. The URL may come from the environment so webhook keys stay out of files."""

    model_config = ConfigDict(extra="forbid")

    kind: SinkKind
    name: str = Field(default="", description="Label in logs and metrics; defaults to the kind.")
    url: str | None = None
    url_env: str | None = Field(default=None, description="Environment variable holding the URL.")

    @model_validator(mode="after")
    def _check(self) -> SinkConfig:
        if not self.name:
            self.name = self.kind
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


class AlertsConfig(BaseModel):
    """Deployment side of alerting: sinks, delivery, evaluation cadence and the rolling SLO window."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    sinks: list[SinkConfig] = Field(default_factory=list)
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
