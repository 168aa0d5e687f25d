"""Policy section: defaults applied to tenants that do not set their own values (owned by tenants)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TenantDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight: float = Field(1.0, gt=0)
    default_priority: int = 5
    max_priority: int = 5
