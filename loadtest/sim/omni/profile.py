"""The omni profile: per-stage costs of a staged omni pipeline, read from YAML (`profiles/qwen3-omni.yaml`).

A stage whose work is autoregressive (thinker, talker) is a `loadtest.sim.engine.Engine` with the profile's
`CostModel` and engine sizes; the encoders and the vocoder have their own small cost forms below. Every number
is explained in the YAML file (what is derived from the model's published sizes, what is assumed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from loadtest.sim.profile import PROFILE_DIR, AudioModel, CostModel, EngineDefaults, OutputModel, TextModel

Release = Literal["snapshot", "later"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EncoderCost(_Strict):
    """One encoder forward over a batch: base + per_token·Σn + per_token2·Σn² (n: an item's tokens)."""

    base_s: float = Field(ge=0)
    per_token_s: float = Field(ge=0)
    per_token2_s: float = Field(default=0.0, ge=0)
    max_batch: int = Field(default=32, gt=0)

    def batch_time(self, sizes: list[int]) -> float:
        return self.base_s + self.per_token_s * sum(sizes) + self.per_token2_s * sum(n * n for n in sizes)


class VocoderCost(_Strict):
    """One code2wav window: base + per_frame × (new frames + left-context frames)."""

    base_s: float = Field(ge=0)
    per_frame_s: float = Field(ge=0)

    def window_time(self, frames: int) -> float:
        return self.base_s + self.per_frame_s * frames


class ARStage(_Strict):
    costs: CostModel
    engine: EngineDefaults


class StageCosts(_Strict):
    """Everything that costs GPU time in one release of the server."""

    thinker: ARStage
    talker: ARStage
    image_encoder: EncoderCost
    audio_encoder: EncoderCost
    code2wav: VocoderCost


class Preprocessing(_Strict):
    """CPU work before the encoders; every request runs as its own task, so there is no queue."""

    base_s: float = Field(ge=0)
    per_image_s: float = Field(ge=0)
    per_audio_clip_s: float = Field(ge=0)
    per_audio_second_s: float = Field(ge=0)


class OmniVision(_Strict):
    """Qwen2-VL image processor settings as Qwen3-Omni ships them (16-px patches merged 2×2)."""

    patch_factor: int = Field(gt=0)
    min_pixels: int = Field(gt=0)
    max_pixels: int = Field(gt=0)
    markers_per_image: int = Field(ge=0)
    video_frame_pixels: int = Field(gt=0)
    video_fps: float = Field(gt=0)


class Speech(_Strict):
    """The talker/codec side: how much audio a text makes and how code2wav slices it."""

    sample_rate: int = Field(gt=0)
    samples_per_frame: int = Field(gt=0)
    frames_per_text_token: float = Field(gt=0)
    chunk_frames: int = Field(gt=0)
    left_context_frames: int = Field(ge=0)
    talker_max_new_tokens: int = Field(gt=0)
    talker_prompt_extra_tokens: int = Field(ge=0)


class OmniProfile(_Strict):
    name: str
    description: str = ""
    served_model_name: str
    model_path: str
    context_length: int = Field(gt=0)
    text: TextModel
    output: OutputModel
    vision: OmniVision
    audio: AudioModel
    speech: Speech
    preprocessing: Preprocessing
    releases: dict[Release, StageCosts]

    def stages(self, release: Release) -> StageCosts:
        return self.releases[release]


def load_omni_profile(name_or_path: str | Path) -> OmniProfile:
    """A bundled profile by name (`qwen3-omni`) or any YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown omni sim profile {str(name_or_path)!r} (looked for {path})")
    with path.open(encoding="utf-8") as fh:
        profile = OmniProfile.model_validate(yaml.safe_load(fh))
    missing = {"snapshot", "later"} - set(profile.releases)
    if missing:
        raise ValueError(
            f"omni profile {profile.name!r} lacks costs for release(s): {', '.join(sorted(missing))}"
        )
    return profile
