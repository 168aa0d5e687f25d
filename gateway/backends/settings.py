"""The circuit breaker's policy section: per pool under `pools.<name>.circuit`, defaults under
`pool_defaults.circuit` (gateway/livepolicy/policy.py composes it; a reload applies to the next outcome)."""

from __future__ import annotations

from pydantic import Field

from gateway.settings.schema import Frozen


class CircuitPolicy(Frozen):
    consecutive_failures: int | None = Field(
        default=3, ge=1, description="Open after this many request failures in a row (null: off)."
    )
    failure_ratio: float | None = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Open when failed / finished requests over `window_s` reaches this (null: off).",
    )
    window_s: float = Field(default=30.0, gt=0, description="The window of the failure ratio.")
    min_requests: int = Field(
        default=20, ge=1, description="The ratio decides nothing on fewer outcomes in the window."
    )
    open_s: float = Field(
        default=5.0,
        gt=0,
        description="Cool-down: an open circuit half-opens at the first passing health check after this.",
    )
    half_open_probes: int = Field(
        default=1,
        ge=1,
        description="Requests a half-open circuit lets through; it closes once they all succeeded and "
        "opens again at the first failure.",
    )
    alert: bool = Field(default=True, description="Send an alert on every transition.")
