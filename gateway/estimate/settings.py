"""Policy section for estimation and modality buckets (owned by the estimate room)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelProfile(_Strict):
    """How one family of models (matched by a glob on the model name) turns media into tokens."""

    match: str = "*"
    vision: Literal["qwen2_vl", "llava_1_5", "llava_next", "internvl", "gemma3", "fixed"] = "qwen2_vl"
    min_pixels: int = Field(3136, gt=0)
    max_pixels: int = Field(1_003_520, gt=0)
    fixed_image_tokens: int = Field(256, ge=0)
    max_tiles: int = Field(12, ge=1)
    audio: Literal["qwen2_5_omni", "qwen3_omni", "none"] = "qwen2_5_omni"
    context_length: int = Field(32768, gt=0)
    default_max_tokens: int = Field(2048, gt=0)


class EstimationPolicy(_Strict):
    models: list[ModelProfile] = Field(default_factory=lambda: [ModelProfile()])
    max_images_per_request: int = Field(32, ge=0)
    max_audios_per_request: int = Field(8, ge=0)
    remote_image_default_size: tuple[int, int] = (1024, 1024)
    default_output_tokens: int = Field(256, gt=0)


class BucketPolicy(_Strict):
    long_doc_prompt_tokens: int = Field(8192, gt=0)
