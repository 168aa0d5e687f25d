"""Policy sections for the SLO-aware queue and the dispatcher (owned by the admission room)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SLOClass(_Strict):
    """Service objectives of one traffic class (interactive, offline, ...)."""

    pool: str | None = None
    ttft_p99_s: float | None = Field(2.0, gt=0)
    tpot_p99_s: float | None = Field(0.06, gt=0)
    completion_deadline_s: float | None = Field(None, gt=0)
    max_queue_depth: int = Field(1024, ge=1)
    max_wait_s: float = Field(30.0, gt=0)
    shed_by_deadline: bool = True


class PriorityPolicy(_Strict):
    levels: dict[str, int] = Field(default_factory=lambda: {"low": 0, "normal": 5, "high": 10})
    default: int = 5


class QueuePolicy(_Strict):
    classes: dict[str, SLOClass] = Field(
        default_factory=lambda: {
            "interactive": SLOClass(pool="interactive"),
            "offline": SLOClass(
                pool="offline",
                ttft_p99_s=None,
                tpot_p99_s=None,
                completion_deadline_s=3600.0,
                max_queue_depth=10000,
                max_wait_s=3600.0,
                shed_by_deadline=False,
            ),
        }
    )
    priorities: PriorityPolicy = Field(default_factory=PriorityPolicy)


class BudgetPolicy(_Strict):
    prefill_tokens_per_round: int = Field(16384, gt=0)
    kv_watermark: float = Field(0.85, gt=0, le=1)
    bucket_caps: dict[str, int] = Field(
        default_factory=lambda: {"multi_image": 16, "single_image": 64, "long_doc": 8}
    )


class WindowPolicy(_Strict):
    enabled: bool = True
    max_window_s: float = Field(0.05, ge=0)
    light_load_queue_depth: int = Field(1, ge=0)


class ControllerPolicy(_Strict):
    algorithm: Literal["fixed", "aimd", "gradient"] = "gradient"
    initial: int = Field(32, ge=1)
    min: int = Field(4, ge=1)
    max: int = Field(64, ge=1)


class FairnessPolicy(_Strict):
    input_weight: float = Field(1.0, ge=0)
    output_weight: float = Field(2.0, ge=0)
