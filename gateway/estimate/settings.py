"""Policy section for estimation and modality buckets (owned by the estimate room).

Every default here is the published default of the model family it prices (see gateway/estimate/README.md),
so an empty policy prices a Qwen2.5-Omni-style deployment correctly.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from gateway.settings.schema import Frozen

VisionFamily = Literal["qwen2_vl", "llava_1_5", "llava_next", "internvl", "gemma3", "fixed"]
AudioFamily = Literal["qwen2_5_omni", "qwen3_omni", "none"]
BucketName = Literal["speech", "text", "single_image", "multi_image", "long_doc", "audio", "video"]
DEFAULT_BUCKET_ORDER: tuple[BucketName, ...] = (
    "speech",
    "video",
    "audio",
    "multi_image",
    "single_image",
    "long_doc",
    "text",
)

# Markers the chat template wraps around each media item (<|vision_start|> … <|vision_end|>, <img> … </img>,
# <start_of_image> … <end_of_image>); LLaVA inlines the features with no markers.
DEFAULT_MARKER_TOKENS: dict[str, int] = {
    "qwen2_vl": 2,
    "internvl": 2,
    "gemma3": 2,
    "llava_1_5": 0,
    "llava_next": 0,
    "fixed": 0,
}


class ModelProfile(Frozen):
    """How one family of models (matched by a glob on the model name) turns media into tokens."""

    match: str = "*"
    vision: VisionFamily = "qwen2_vl"
    min_pixels: int = Field(default=3136, gt=0, description="qwen2_vl smart-resize lower bound (4·28²).")
    max_pixels: int = Field(
        default=1_003_520, gt=0, description="qwen2_vl smart-resize upper bound (1280·28²)."
    )
    fixed_image_tokens: int = Field(default=256, ge=0, description="Tokens per image for vision: fixed.")
    max_tiles: int = Field(default=12, ge=1, description="internvl: most 448-px tiles per image.")
    image_marker_tokens: int | None = Field(
        default=None, ge=0, description="Start/end marker tokens per media item; None = the family's default."
    )
    audio: AudioFamily = "qwen2_5_omni"
    context_length: int = Field(default=32768, gt=0)
    default_max_tokens: int = Field(default=2048, gt=0, description="Output cap when the request names none.")
    message_overhead_tokens: int = Field(
        default=5, ge=0, description="Chat template per message (ChatML: 5)."
    )
    reply_overhead_tokens: int = Field(
        default=3, ge=0, description="Generation prompt '<|im_start|>assistant\\n'."
    )
    default_system_tokens: int = Field(
        default=0,
        ge=0,
        description="Tokens (template overhead included) of the system prompt the template adds when "
        "the request has none (Qwen2.5 chat: 'You are Qwen, created by Alibaba Cloud…' ≈ 25).",
    )
    speech_sample_rate: int = Field(
        default=24_000,
        gt=0,
        description="Sample rate of the model's raw 16-bit PCM speech (sglang-omni's talkers: 24 kHz): "
        "times PCM audio that states no rate of its own (chat audio deltas asked as `pcm`).",
    )
    video_fps: float = Field(default=2.0, gt=0, description="Frames sampled per second of video.")
    video_min_frames: int = Field(default=4, ge=1)
    video_max_frames: int = Field(default=768, ge=1)
    video_temporal_patch: int = Field(
        default=2, ge=1, description="Frames merged into one token grid (qwen: 2)."
    )
    video_min_pixels: int = Field(default=128 * 28 * 28, gt=0)
    video_max_pixels: int = Field(default=768 * 28 * 28, gt=0)
    video_total_pixels: int = Field(
        default=24576 * 28 * 28, gt=0, description="Pixel budget over all frames."
    )

    @property
    def marker_tokens(self) -> int:
        if self.image_marker_tokens is not None:
            return self.image_marker_tokens
        return DEFAULT_MARKER_TOKENS[self.vision]

    @model_validator(mode="after")
    def _check_bounds(self) -> ModelProfile:
        if self.min_pixels > self.max_pixels:
            raise ValueError("min_pixels must not exceed max_pixels")
        if self.video_min_pixels > self.video_max_pixels:
            raise ValueError("video_min_pixels must not exceed video_max_pixels")
        if self.video_min_frames > self.video_max_frames:
            raise ValueError("video_min_frames must not exceed video_max_frames")
        return self


class EstimationPolicy(Frozen):
    models: tuple[ModelProfile, ...] = Field(default_factory=lambda: (ModelProfile(),))
    max_images_per_request: int = Field(default=32, ge=0)
    max_image_pixels: int = Field(
        default=178_956_970,
        gt=0,
        description="Larger declared images get 400: Pillow's decompression-bomb limit, which SGLang hits.",
    )
    max_audios_per_request: int = Field(default=8, ge=0)
    max_videos_per_request: int = Field(default=2, ge=0)
    remote_image_default_size: tuple[int, int] = Field(
        default=(1024, 1024), description="(width, height) assumed for an http(s) image we do not fetch."
    )
    remote_image_low_detail_size: tuple[int, int] = Field(
        default=(512, 512), description="(width, height) assumed for a remote image sent with detail: low."
    )
    video_default_size: tuple[int, int] = Field(
        default=(640, 360), description="(width, height) of an unsized video."
    )
    video_default_seconds: float = Field(default=10.0, gt=0)
    audio_default_seconds: float = Field(
        default=10.0, gt=0, description="Duration of a remote or unreadable clip."
    )
    compressed_audio_kbps: float = Field(
        default=128.0, gt=0, description="Bitrate assumed when a compressed clip's header does not say."
    )
    default_output_tokens: int = Field(
        default=256, gt=0, description="Expected output before any usage is seen."
    )
    output_ewma_alpha: float = Field(default=0.1, gt=0, le=1)
    output_min_samples: int = Field(
        default=5, ge=1, description="Observations before the learned value is used."
    )
    output_max_keys: int = Field(default=10_000, ge=1, description="Most (tenant, bucket) pairs remembered.")
    speech_seconds_per_token: float = Field(
        default=0.3,
        gt=0,
        description="Audio seconds spoken per output text token before any answer of the (tenant, voice) "
        "was measured (about 3.3 tokens per spoken second: 150 words/min at 1.3 tokens per word).",
    )
    context_text_slack: float = Field(
        default=0.15,
        ge=0,
        lt=1,
        description="Share of the estimated text tokens forgiven in the context-length check (text is "
        "estimated, media exactly), so a near-limit prompt is left for the backend to judge.",
    )
    tokenizer_json: str | None = Field(
        default=None,
        description="Optional local tokenizer.json (needs the `tokenizers` package); never fetched.",
    )


class BucketPolicy(Frozen):
    """Classification rules: the first bucket in `order` whose condition holds wins."""

    long_doc_prompt_tokens: int = Field(default=8192, gt=0)
    multi_image_min: int = Field(
        default=2, ge=2, description="Images (video frames excluded) that make multi_image."
    )
    order: tuple[BucketName, ...] = DEFAULT_BUCKET_ORDER

    @model_validator(mode="after")
    def _check_order(self) -> BucketPolicy:
        if len(set(self.order)) != len(self.order):
            raise ValueError("order must not repeat a bucket")
        if "text" not in self.order:
            raise ValueError("order must contain 'text' (the fallback)")
        return self
