"""Cost profiles: the data that turns a schedule into step times, read from YAML.

A profile is data, not code, so a new GPU or model is a new file. Every coefficient is explained in
`profiles/default.yaml`; this module only validates the shape and evaluates the formulas.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

PROFILE_DIR = Path(__file__).parent / "profiles"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    """One request's share of a prefill batch: tokens already cached, tokens computed now, encoder work."""

    prefix: int
    extend: int
    encoder_tokens: int = 0


class CostModel(_Strict):
    """prefill = a + b·Σext + c·Σ ext·(prefix + ext/2) + v·encoder_tokens; decode = d + e·B + f·Σkv."""

    prefill_base_s: float = Field(ge=0)
    prefill_per_token_s: float = Field(ge=0)
    prefill_attention_per_token2_s: float = Field(ge=0)
    encoder_per_token_s: float = Field(ge=0)
    decode_base_s: float = Field(gt=0)
    decode_per_seq_s: float = Field(ge=0)
    decode_per_kv_token_s: float = Field(ge=0)

    def prefill_time(self, chunks: Iterable[PrefillChunk]) -> float:
        linear = attention = encoder = 0.0
        for c in chunks:
            linear += c.extend
            # causal attention of the new tokens against the cache and against each other
            attention += c.extend * (c.prefix + c.extend / 2)
            encoder += c.encoder_tokens
        return (
            self.prefill_base_s
            + self.prefill_per_token_s * linear
            + self.prefill_attention_per_token2_s * attention
            + self.encoder_per_token_s * encoder
        )

    def decode_time(self, batch: int, kv_tokens: int) -> float:
        return self.decode_base_s + self.decode_per_seq_s * batch + self.decode_per_kv_token_s * kv_tokens


class OutputModel(_Strict):
    """Natural answer length (before max_tokens caps it): log-normal around a median."""

    median_tokens: float = Field(gt=0)
    sigma: float = Field(ge=0)
    min_tokens: int = Field(default=1, ge=1)


class VisionModel(_Strict):
    family: Literal["qwen2_vl", "llava_1_5", "gemma3", "fixed"] = "qwen2_vl"
    min_pixels: int = Field(default=3136, gt=0)
    max_pixels: int = Field(default=1_003_520, gt=0)
    fixed_tokens: int = Field(default=576, gt=0)
    markers_per_image: int = Field(default=2, ge=0)
    video_fps: float = Field(default=2.0, gt=0)
    video_frame_pixels: int = Field(default=360 * 420, gt=0)


class AudioModel(_Strict):
    family: Literal["qwen2_5_omni", "qwen3_omni"] = "qwen2_5_omni"
    markers_per_clip: int = Field(default=2, ge=0)


class TextModel(_Strict):
    bytes_per_token: float = Field(default=4.0, gt=0)
    tokens_per_message: int = Field(default=4, ge=0)
    tokens_per_prompt: int = Field(default=3, ge=0)


class ModelShape(_Strict):
    """What fixes the memory: the KV cell per token and the weights resident on the GPU."""

    layers: int = Field(gt=0)
    kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype_bytes: int = Field(default=2, gt=0)
    params_b: dict[str, float] = Field(min_length=1, description="Resident parameters, billions, by part.")


class Activations(_Strict):
    """Bytes a forward pass allocates outside the KV pool (see memory.py for how they combine)."""

    prefill_token_bytes: int = Field(gt=0)
    encoder_token_bytes: int = Field(ge=0)
    embedding_token_bytes: int = Field(ge=0)
    logits_bytes_per_seq: int = Field(ge=0)


class MemorySpec(_Strict):
    gpu_memory_gib: float = Field(gt=0)
    cuda_context_gib: float = Field(ge=0)
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1)
    cuda_graph_max_bs: int = Field(default=256, ge=0)
    cuda_graph_bytes_per_bs: int = Field(default=2 << 20, ge=0)
    activations: Activations


class _EngineFlags(_Strict):
    max_running_requests: int = Field(gt=0)
    max_prefill_tokens: int = Field(default=16384, gt=0)
    chunked_prefill_size: int = 8192


class EngineDefaults(_EngineFlags):
    """An engine whose KV pool is given in tokens (the SGLang-Omni stages)."""

    max_total_tokens: int = Field(gt=0)


class SGLangEngineDefaults(_EngineFlags):
    """SGLang's engine: the KV pool is derived from the profile's memory unless given."""

    max_total_tokens: int | None = Field(default=None, gt=0)


class Profile(_Strict):
    name: str
    description: str = ""
    served_model_name: str
    model_path: str
    model_type: str
    architectures: list[str] = Field(default_factory=list)
    context_length: int = Field(gt=0)
    costs: CostModel
    model: ModelShape
    memory: MemorySpec
    output: OutputModel
    vision: VisionModel = VisionModel()
    audio: AudioModel = AudioModel()
    text: TextModel = TextModel()
    engine: SGLangEngineDefaults


def load_profile(name_or_path: str | Path) -> Profile:
    """A bundled profile by name (`default`) or any YAML file by path."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))
        raise ValueError(f"unknown sim profile {str(name_or_path)!r}; bundled: {', '.join(known)}")
    with path.open(encoding="utf-8") as fh:
        return Profile.model_validate(yaml.safe_load(fh))
