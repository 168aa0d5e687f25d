"""Vision token formulas: hand-computed tables (REFERENCE.md) and every row of the HF reference CSV."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gateway.estimate.settings import ModelProfile
from gateway.estimate.vision import (
    AspectError,
    image_tokens,
    internvl_tokens,
    llava_next_tokens,
    qwen2_vl_tokens,
    smart_resize,
    video_frames,
    video_tokens,
)

REFERENCE_CSV = Path(__file__).resolve().parents[1] / "data" / "vision_tokens_reference.csv"
MIN, MAX = 3136, 1_003_520


# (height, width, tokens) — worked by hand from the smart-resize formula:
QWEN_TABLE = [
    (224, 224, 64),  # 8×8 blocks, already multiples of 28
    (300, 500, 198),  # round(10.71)=11 → 308, round(17.86)=18 → 504: 11·18
    (70, 70, 4),  # round(2.5)=2 (banker's, as Python/HF) → 56×56 = 3136 = min_pixels exactly: not below
    (20, 30, 6),  # 28×28 < min → β=√(3136/600)=2.286: ceil(1.63)=2, ceil(2.45)=3 → 2·3
    (1, 1, 4),  # β=56: 56×56
    (896, 1120, 1280),  # 32·40 blocks = 1,003,520 = max_pixels exactly: not above
    (924, 1120, 1248),  # 33·40 > max → β=√1.03125: floor(32.50)=32, floor(39.39)=39 → 32·39
    (1080, 1920, 1222),  # β=1.436: floor(26.86)=26, floor(47.76)=47 → 26·47
    (100_000, 100_000, 1225),  # absurd declared size: β=99.8 → 35·35, no allocation anywhere
]


@pytest.mark.parametrize(("h", "w", "tokens"), QWEN_TABLE)
def test_qwen2_vl_hand_table(h: int, w: int, tokens: int) -> None:
    assert qwen2_vl_tokens(h, w, MIN, MAX) == tokens


def test_qwen2_vl_custom_min_pixels_upsizes() -> None:
    # min 256·28² = 200,704: 224×224 (50,176 px) → β=2 → 448×448 → 16·16
    assert smart_resize(224, 224, 256 * 28 * 28, MAX) == (448, 448)
    assert image_tokens(ModelProfile(min_pixels=256 * 28 * 28), 224, 224) == 256


def test_qwen2_vl_rejects_extreme_aspect_ratio() -> None:
    with pytest.raises(AspectError):
        qwen2_vl_tokens(1, 300, MIN, MAX)


def test_other_families_hand_values() -> None:
    assert internvl_tokens(448, 448) == 256  # 1 tile, no thumbnail
    assert internvl_tokens(448, 896) == 768  # 2×1 grid + thumbnail
    assert internvl_tokens(1000, 1000, max_tiles=6) == 1280  # 2×2 (3×3 exceeds 6) + thumbnail
    assert llava_next_tokens(336, 672) == 1752  # pinpoint 336×672: 24×48 features + 24 newlines + 576 base
    assert image_tokens(ModelProfile(vision="llava_1_5"), 4000, 3000) == 576
    assert image_tokens(ModelProfile(vision="gemma3"), 4000, 3000) == 256
    assert image_tokens(ModelProfile(vision="fixed", fixed_image_tokens=99), 1, 1) == 99


def test_marker_tokens_are_explicit_per_family() -> None:
    assert ModelProfile().marker_tokens == 2  # <|vision_start|> … <|vision_end|>
    assert ModelProfile(vision="llava_1_5").marker_tokens == 0
    assert ModelProfile(image_marker_tokens=0).marker_tokens == 0


def _reference_rows() -> list[dict[str, str]]:
    with REFERENCE_CSV.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("row", _reference_rows(), ids=lambda r: f"{r['height']}x{r['width']}")
def test_matches_hf_processor_reference(row: dict[str, str]) -> None:
    h, w = int(row["height"]), int(row["width"])
    assert qwen2_vl_tokens(h, w, MIN, MAX) == int(row["qwen2_vl_tokens"])
    assert internvl_tokens(h, w, 12) == int(row["internvl_tokens_448_max12"])
    assert llava_next_tokens(h, w) == int(row["llava_next_tokens"])


def test_reference_csv_has_all_rows() -> None:
    assert len(_reference_rows()) == 25


def test_video_frames_and_tokens() -> None:
    p = ModelProfile()
    assert video_frames(p, 1.0, None) == 4  # 2 frames raised to the 4-frame minimum
    assert video_frames(p, 3.3, None) == 6  # 6.6 frames rounded to a whole pair
    assert video_frames(p, 600.0, None) == 768  # capped
    # 10 s × 2 fps = 20 frames = 10 pairs; 360×640 → 364×644 = 13·23 = 299 per pair
    assert video_tokens(p, 640, 360, 10.0, None) == 2990
    # 768 frames: per-frame budget max(min(602112, 24576·784/768·2), 1.05·100352) = 105,369 px
    # → β=1.4787: floor(8.70)=8, floor(15.46)=15 → 120 per pair × 384 pairs
    assert video_tokens(p, 640, 360, 600.0, None) == 46_080
    # a declared fps overrides the profile's: 10 s × 1 fps = 10 frames = 5 pairs
    assert video_tokens(p, 640, 360, 10.0, 1.0) == 5 * 299
    # families without temporal merging: frames × per-image tokens
    assert (
        video_tokens(ModelProfile(vision="gemma3", video_temporal_patch=1), 640, 360, 10.0, None) == 20 * 256
    )
