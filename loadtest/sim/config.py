"""SimConfig: everything one simulated backend is started with (CLI flags, tests, the demo)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from loadtest.sim.engine import EngineConfig
from loadtest.sim.faults import FaultConfig
from loadtest.sim.memory import MemoryModel, memory_model
from loadtest.sim.profile import Profile, load_profile


class SimConfig(BaseModel):
    """SGLang's flags, by SGLang's names; unset engine sizes come from the profile (the KV pool from its
    memory section, as SGLang sizes it from `mem_fraction_static`)."""

    model_config = ConfigDict(extra="forbid")

    profile: str = "default"
    model: str | None = None
    max_running_requests: int | None = Field(default=None, gt=0)
    max_total_tokens: int | None = Field(default=None, gt=0)
    max_prefill_tokens: int | None = Field(default=None, gt=0)
    chunked_prefill_size: int | None = None
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    schedule_policy: str = "fcfs"
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    priority_scheduling_preemption_threshold: int = 10
    schedule_conservativeness: float = Field(default=1.0, gt=0)
    max_queued_requests: int | None = Field(default=None, gt=0)
    time_scale: float = Field(default=1.0, gt=0)
    oom_mode: Literal["retract", "crash"] = "retract"
    restart_s: float = Field(default=30.0, ge=0)
    seed: int = 0
    radix_cache: bool = False  # SGLang's prefix cache (radix_cache.py); off: as --disable-radix-cache
    enable_cache_report: bool = False  # usage's prompt_tokens_details.cached_tokens, as SGLang's flag
    faults: FaultConfig = FaultConfig()
    # the SGLang release whose HTTP surface is served (loadtest/sim/README.md lists where they differ)
    sglang_version: Literal["0.5.23", "0.5.9"] = "0.5.23"

    @property
    def legacy(self) -> bool:
        return self.sglang_version == "0.5.9"

    def load_profile(self) -> Profile:
        return load_profile(self.profile)

    def build(self, profile: Profile) -> tuple[EngineConfig, MemoryModel]:
        """The engine's scheduling config and its memory budget (the KV pool is the memory model's)."""
        d = profile.engine
        chunk = d.chunked_prefill_size if self.chunked_prefill_size is None else self.chunked_prefill_size
        running = self.max_running_requests or d.max_running_requests
        prefill = self.max_prefill_tokens or d.max_prefill_tokens
        memory = memory_model(
            profile,
            prefill_chunk=chunk if chunk > 0 else prefill,
            max_running_requests=running,
            mem_fraction_static=self.mem_fraction_static,
            max_total_tokens=self.max_total_tokens or d.max_total_tokens,
        )
        config = EngineConfig(
            max_total_tokens=memory.pool_tokens,
            max_running_requests=running,
            max_prefill_tokens=prefill,
            chunked_prefill_size=chunk,
            schedule_policy=self.schedule_policy,
            enable_priority_scheduling=self.enable_priority_scheduling,
            schedule_low_priority_values_first=self.schedule_low_priority_values_first,
            priority_scheduling_preemption_threshold=self.priority_scheduling_preemption_threshold,
            schedule_conservativeness=self.schedule_conservativeness,
            max_queued_requests=self.max_queued_requests,
            oom_mode=self.oom_mode,
            restart_s=self.restart_s,
            radix_cache=self.radix_cache,
        )
        return config, memory
