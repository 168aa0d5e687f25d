"""Vision tokens per image and per video, by model family, exactly as the Hugging Face processors count.

Families (ModelProfile.vision):
- qwen2_vl   Qwen2-VL / Qwen2.5-VL / Qwen2.5-Omni / Qwen3-Omni: smart-resize to multiples of 28 within
             [min_pixels, max_pixels], one token per 28×28 block (Qwen2VLImageProcessor.smart_resize).
- llava_1_5  fixed 576 (24×24 patches of a 336-px crop).
- llava_next anyres: 576 base + best-fit pinpoint grid of 336-px tiles, unpadded, + one newline per row
             (LlavaNextProcessor._get_number_of_features, "default" feature strategy: no CLS).
- internvl   448-px tiles, 256 tokens each, grid with tiles ≤ max_tiles closest in aspect ratio, plus a
             thumbnail tile when more than one (GotOcr2ImageProcessor.crop_to_patches).
- gemma3     256 (pan-and-scan off).
- fixed      ModelProfile.fixed_image_tokens.
Counts here exclude the start/end markers; ModelProfile.marker_tokens adds them per item (estimator).
All arithmetic is on ints and floats: a declared 100000×100000 image costs nothing to price.
"""

from __future__ import annotations

import math
from functools import lru_cache

from gateway.estimate.settings import ModelProfile

QWEN_FACTOR = 28  # patch 14 × spatial merge 2
QWEN_MAX_ASPECT = 200
LLAVA_NEXT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))  # (height, width)
LLAVA_TILE, LLAVA_PATCH = 336, 14
INTERNVL_TILE, INTERNVL_TOKENS_PER_TILE = 448, 256


class AspectError(ValueError):
    """An image the qwen2_vl processor refuses (aspect ratio of 200 or more)."""


def smart_resize(height: int, width: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's resize target (h', w'): multiples of 28 with h'·w' in [min_pixels, max_pixels]."""
    f = QWEN_FACTOR
    if max(height, width) / min(height, width) > QWEN_MAX_ASPECT:
        raise AspectError(
            f"absolute aspect ratio must be smaller than {QWEN_MAX_ASPECT}, got {width}x{height}"
        )
    h_bar = round(height / f) * f
    w_bar = round(width / f) * f
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(f, math.floor(height / beta / f) * f)
        w_bar = max(f, math.floor(width / beta / f) * f)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / f) * f
        w_bar = math.ceil(width * beta / f) * f
    return h_bar, w_bar


def qwen2_vl_tokens(height: int, width: int, min_pixels: int, max_pixels: int) -> int:
    h, w = smart_resize(height, width, min_pixels, max_pixels)
    return (h // QWEN_FACTOR) * (w // QWEN_FACTOR)


def _best_pinpoint(height: int, width: int) -> tuple[int, int]:
    best = LLAVA_NEXT_PINPOINTS[0]
    best_effective, best_wasted = 0, math.inf
    for ph, pw in LLAVA_NEXT_PINPOINTS:
        scale = min(pw / width, ph / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        wasted = ph * pw - effective
        if effective > best_effective or (effective == best_effective and wasted < best_wasted):
            best, best_effective, best_wasted = (ph, pw), effective, wasted
    return best


@lru_cache(maxsize=4096)
def llava_next_tokens(height: int, width: int) -> int:
    ph, pw = _best_pinpoint(height, width)
    side = LLAVA_TILE // LLAVA_PATCH  # 24 patches per tile side
    cur_h, cur_w = side * (ph // LLAVA_TILE), side * (pw // LLAVA_TILE)
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= (cur_h - new_h) // 2 * 2
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= (cur_w - new_w) // 2 * 2
    return cur_h * cur_w + cur_h + side * side


@lru_cache(maxsize=64)
def _internvl_grids(max_tiles: int) -> tuple[tuple[int, int], ...]:
    grids = [(w, h) for w in range(1, max_tiles + 1) for h in range(1, max_tiles + 1) if w * h <= max_tiles]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


@lru_cache(maxsize=4096)
def internvl_tokens(height: int, width: int, max_tiles: int = 12) -> int:
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), math.inf
    for gw, gh in _internvl_grids(max_tiles):
        diff = abs(aspect - gw / gh)
        if diff < best_diff:
            best, best_diff = (gw, gh), diff
        elif diff == best_diff and area > 0.5 * INTERNVL_TILE * INTERNVL_TILE * gw * gh:
            best = (gw, gh)  # same shape: prefer more tiles until they cover twice the image
    tiles = best[0] * best[1]
    return (tiles + (tiles > 1)) * INTERNVL_TOKENS_PER_TILE


def image_tokens(profile: ModelProfile, width: int, height: int) -> int:
    """Tokens of one image of the given size for this profile's family, markers excluded."""
    family = profile.vision
    if family == "qwen2_vl":
        return qwen2_vl_tokens(height, width, profile.min_pixels, profile.max_pixels)
    if family == "llava_next":
        return llava_next_tokens(height, width)
    if family == "internvl":
        return internvl_tokens(height, width, profile.max_tiles)
    if family == "llava_1_5":
        return 576
    if family == "gemma3":
        return 256
    return profile.fixed_image_tokens


def video_frames(profile: ModelProfile, seconds: float, fps: float | None) -> int:
    """Frames the processor samples (qwen-vl-utils smart_nframes): duration × fps, clamped, paired."""
    pair = profile.video_temporal_patch
    n = seconds * (fps or profile.video_fps)
    n = min(max(n, profile.video_min_frames), profile.video_max_frames)
    return max(pair, round(n / pair) * pair)


def video_tokens(profile: ModelProfile, width: int, height: int, seconds: float, fps: float | None) -> int:
    """Tokens of one video: frame groups × per-frame grid, frames shrunk to fit the total pixel budget."""
    frames = video_frames(profile, seconds, fps)
    if profile.vision != "qwen2_vl":
        return frames * image_tokens(profile, width, height)
    pair = profile.video_temporal_patch
    max_pixels = max(
        min(profile.video_max_pixels, profile.video_total_pixels / frames * pair),
        int(profile.video_min_pixels * 1.05),
    )
    per_group = qwen2_vl_tokens(height, width, profile.video_min_pixels, int(max_pixels))
    return frames // pair * per_group
