"""Vision and audio token counts per model family — the simulator's own implementation of the published
formulas (../shared/REFERENCE.md), kept separate from the gateway's estimator on purpose."""

from __future__ import annotations

import math

from loadtest.sim.profile import AudioModel, VisionModel

PATCH_FACTOR = 28  # 14-px patches merged 2×2


def smart_resize(
    height: int, width: int, min_pixels: int, max_pixels: int, factor: int = PATCH_FACTOR
) -> tuple[int, int]:
    """Qwen2-VL's resize to multiples of `factor` (patch × merge: 28 for Qwen2-VL, 32 for Qwen3-Omni)
    within [min_pixels, max_pixels]."""
    f = factor
    h_bar = max(f, round(height / f) * f)
    w_bar = max(f, round(width / f) * f)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar, w_bar


def image_tokens(height: int, width: int, vision: VisionModel) -> int:
    """Image-pad tokens for one image, without the start/end markers."""
    if vision.family == "qwen2_vl":
        h, w = smart_resize(height, width, vision.min_pixels, vision.max_pixels)
        return (h // PATCH_FACTOR) * (w // PATCH_FACTOR)
    if vision.family == "llava_1_5":
        return 576
    if vision.family == "gemma3":
        return 256
    return vision.fixed_tokens


def video_tokens(frames: int, height: int | None, width: int | None, vision: VisionModel) -> int:
    """Frames are paired (temporal patch 2) for Qwen; other families pay per frame at the image rate."""
    if vision.family != "qwen2_vl":
        return frames * image_tokens(height or 336, width or 336, vision)
    side = int(math.sqrt(vision.video_frame_pixels))
    h, w = smart_resize(height or side, width or side, vision.min_pixels, vision.video_frame_pixels)
    return math.ceil(frames / 2) * (h // PATCH_FACTOR) * (w // PATCH_FACTOR)


def audio_tokens(seconds: float, audio: AudioModel) -> int:
    """Audio-encoder output length for a clip, from its mel frame count at 100 frames per second."""
    frames = max(1, round(seconds * 100))
    if audio.family == "qwen2_5_omni":
        after_conv = (frames - 1) // 2 + 1
        return (after_conv - 2) // 2 + 1
    rest = frames % 100
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (frames // 100) * 13
