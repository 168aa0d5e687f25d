"""Fault injection for reliability tests: switchable at start (flags) and at runtime (POST /admin/faults).

All durations are virtual seconds, like every other time in the sim; the shell divides by time_scale.
Draws come from one seeded RNG so a test that sends the same requests sees the same faults.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class FaultConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    error_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of requests failed before first byte"
    )
    error_status: int = Field(default=500, ge=400, le=599)
    disconnect_rate: float = Field(default=0.0, ge=0, le=1, description="share of streams cut mid-way")
    disconnect_after_tokens: int = Field(default=1, ge=0, description="tokens sent before the cut")
    latency_s: float = Field(default=0.0, ge=0, description="added before each request is queued")
    stall_rate: float = Field(default=0.0, ge=0, le=1, description="share of streams that pause once")
    stall_s: float = Field(default=0.0, ge=0)
    health_failing: bool = False
    slow_start_s: float = Field(default=0.0, ge=0, description="/health answers 503 this long after start")


class FaultInjector:
    def __init__(self, config: FaultConfig, seed: int = 0) -> None:
        self.config = config
        self._rng = random.Random(seed)

    def update(self, changes: dict[str, Any]) -> FaultConfig:
        """Apply a partial change, validated as a whole; a bad change leaves the old config in place."""
        self.config = FaultConfig.model_validate({**self.config.model_dump(), **changes})
        return self.config

    def _hit(self, rate: float) -> bool:
        return rate > 0 and self._rng.random() < rate

    def error_status(self) -> int | None:
        return self.config.error_status if self._hit(self.config.error_rate) else None

    def disconnect_after(self) -> int | None:
        return self.config.disconnect_after_tokens if self._hit(self.config.disconnect_rate) else None

    def stall_after(self) -> int | None:
        """Token index at which this stream pauses for stall_s, or None."""
        return 1 if self._hit(self.config.stall_rate) and self.config.stall_s > 0 else None


def add_fault_flags(p: argparse.ArgumentParser) -> None:
    """`--fault-<name>` for every FaultConfig field (both simulators' command lines)."""
    f = p.add_argument_group("fault injection (durations in virtual seconds)")
    for name, field in FaultConfig.model_fields.items():
        flag = "--fault-" + name.replace("_", "-")
        if field.annotation is bool:
            f.add_argument(flag, action="store_true", help=field.description)
        else:
            kind = int if field.annotation is int else float
            f.add_argument(flag, type=kind, default=field.default, help=field.description)


def faults_from_args(args: argparse.Namespace) -> FaultConfig:
    return FaultConfig(**{name: getattr(args, "fault_" + name) for name in FaultConfig.model_fields})
