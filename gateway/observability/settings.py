"""Alert thresholds: a policy section (key `alerts` in policies/*.yaml) that ops tune live; a reload takes
effect at the next evaluation. Where notifications go and how they are delivered is deployment config
(`AlertsConfig`, key `alerts` in config/gateway.yaml, in gateway/settings/config.py), read once at start.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.settings.schema import Frozen, FrozenDict

RuleName = Literal["queue_depth", "ttft_slo", "tpot_slo", "kv_usage", "backend_down", "rejection_rate"]


class AlertThresholds(Frozen):
    enabled: bool = True
    queue_depth: int = Field(default=100, ge=1, description="Fire when a pool's queue holds more than this.")
    queue_depth_per_pool: FrozenDict[str, int] = Field(
        default_factory=dict, description="Per-pool overrides."
    )
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
    for_overrides: FrozenDict[RuleName, float] = Field(
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
