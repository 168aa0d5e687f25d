"""Policy section: alert thresholds ops tune live (owned by observability)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AlertThresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    queue_depth: int = Field(100, ge=1)
    kv_usage: float = Field(0.85, gt=0, le=1)
    rejection_rate: float = Field(0.05, ge=0, le=1)
    for_s: float = Field(60.0, ge=0)
    repeat_s: float = Field(3600.0, gt=0)
