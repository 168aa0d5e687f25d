"""SimConfig: everything one simulated backend is started with (CLI flags, tests, the demo)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from loadtest.sim.engine import EngineConfig
from loadtest.sim.faults import FaultConfig
from loadtest.sim.profile import Profile, load_profile


class SimConfig(BaseModel):
    """Unset engine sizes come from the profile's `engine:` section."""

    model_config = ConfigDict(extra="forbid")

    profile: str = "default"
    model: str | None = None
    max_running_requests: int | None = Field(default=None, gt=0)
    max_total_tokens: int | None = Field(default=None, gt=0)
    max_prefill_tokens: int | None = Field(default=None, gt=0)
    chunked_prefill_size: int | None = None
    schedule_policy: Literal["fcfs", "priority"] = "fcfs"
    schedule_conservativeness: float = Field(default=1.0, gt=0)
    max_queued_requests: int | None = Field(default=None, gt=0)
    time_scale: float = Field(default=1.0, gt=0)
    oom_mode: Literal["retract", "crash"] = "retract"
    restart_s: float = Field(default=30.0, ge=0)
    seed: int = 0
    faults: FaultConfig = FaultConfig()

    def load_profile(self) -> Profile:
        return load_profile(self.profile)

    def engine_config(self, profile: Profile) -> EngineConfig:
        d = profile.engine
        return EngineConfig(
            max_total_tokens=self.max_total_tokens or d.max_total_tokens,
            max_running_requests=self.max_running_requests or d.max_running_requests,
            max_prefill_tokens=self.max_prefill_tokens or d.max_prefill_tokens,
            chunked_prefill_size=(
                d.chunked_prefill_size if self.chunked_prefill_size is None else self.chunked_prefill_size
            ),
            schedule_policy=self.schedule_policy,
            schedule_conservativeness=self.schedule_conservativeness,
            max_queued_requests=self.max_queued_requests,
            oom_mode=self.oom_mode,
            restart_s=self.restart_s,
        )
