"""OmniConfig: everything one simulated sglang-omni server is started with (CLI flags, tests, the demo)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loadtest.sim.faults import FaultConfig
from loadtest.sim.omni.pipeline import OmniPipeline
from loadtest.sim.omni.profile import OmniProfile, Release, load_omni_profile
from loadtest.sim.omni.release import BEHAVIOURS, Behaviour


class OmniConfig(BaseModel):
    """Unset stage caps come from the profile's release section (16/16 snapshot, 64/32 later)."""

    model_config = ConfigDict(extra="forbid")

    profile: str = "qwen3-omni"
    model: str | None = None
    release: Release = "snapshot"
    text_only: bool = False  # sgl-omni serve --text-only: the 6-stage pipeline, no talker, never audio
    thinker_max_running_requests: int | None = Field(default=None, gt=0)
    talker_max_running_requests: int | None = Field(default=None, gt=0)
    max_queued_requests: int | None = Field(default=None, ge=0)
    enable_metrics: bool = False
    # Qwen3-Omni's snapshot pipeline rejects /v1/audio/speech (a plain-string prompt fails preprocessing);
    # "serve" answers it through the same stages so the speech path can be exercised (README: speech).
    speech_route: Literal["serve", "reject"] = "serve"
    time_scale: float = Field(default=1.0, gt=0)
    seed: int = 0
    faults: FaultConfig = FaultConfig()

    @model_validator(mode="after")
    def _release_flags(self) -> OmniConfig:
        if self.max_queued_requests is not None and not BEHAVIOURS[self.release].queue_limit:
            raise ValueError(
                "max_queued_requests exists only in later sglang-omni releases (--omni-release later)"
            )
        return self

    @property
    def behaviour(self) -> Behaviour:
        return BEHAVIOURS[self.release]

    def load_profile(self) -> OmniProfile:
        return load_omni_profile(self.profile)

    def pipeline(self, profile: OmniProfile) -> OmniPipeline:
        thinker_cap = (
            self.thinker_max_running_requests
            or profile.stages(self.release).thinker.engine.max_running_requests
        )
        queue_limit = None if self.max_queued_requests is None else thinker_cap + self.max_queued_requests
        return OmniPipeline(
            profile,
            self.release,
            speech=not self.text_only,
            text_only_skips_audio_stages=self.behaviour.text_only_skips_audio_stages,
            thinker_cap=thinker_cap,
            talker_cap=self.talker_max_running_requests,
            queue_limit=queue_limit,
        )
