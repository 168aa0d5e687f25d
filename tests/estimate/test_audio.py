"""Audio: encoder output-length formulas (hand + reference CSV) and clip durations from headers."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gateway.estimate.audio import (
    audio_tokens,
    clip_seconds,
    qwen2_5_omni_audio_tokens,
    qwen3_omni_audio_tokens,
)
from gateway.estimate.blob import Blob, MediaError
from tests.estimate.helpers import b64, wav_bytes

REFERENCE_CSV = Path(__file__).resolve().parents[1] / "data" / "audio_tokens_reference.csv"


def _rows() -> list[dict[str, str]]:
    with REFERENCE_CSV.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("row", _rows(), ids=lambda r: f"{r['seconds']}s")
def test_matches_reference(row: dict[str, str]) -> None:
    seconds, frames = float(row["seconds"]), int(row["mel_frames"])
    assert qwen2_5_omni_audio_tokens(frames) == int(row["qwen2_5_omni_tokens"])
    assert qwen3_omni_audio_tokens(frames) == int(row["qwen3_omni_tokens"])
    assert audio_tokens("qwen2_5_omni", seconds) == int(row["qwen2_5_omni_tokens"])
    assert audio_tokens("qwen3_omni", seconds) == int(row["qwen3_omni_tokens"])


def test_hand_values() -> None:
    # 30 s: F=3000 → L=(2999)//2+1=1500 → (1498)//2+1 = 750
    assert qwen2_5_omni_audio_tokens(3000) == 750
    # 1.5 s: F=150 → 1 window of 13 + remainder 50: feat=25 → ((24)//2+1-1)//2+1 = 7 → 20
    assert qwen3_omni_audio_tokens(150) == 20
    assert qwen2_5_omni_audio_tokens(0) == 0
    assert audio_tokens("none", 30.0) == 0


@pytest.mark.parametrize(("seconds", "rate", "channels"), [(2.5, 16000, 1), (1.0, 44100, 2), (30.0, 8000, 1)])
def test_wav_duration_is_exact(seconds: float, rate: int, channels: int) -> None:
    assert clip_seconds(Blob(b64(wav_bytes(seconds, rate, channels))), 128.0) == pytest.approx(seconds)


def test_flac_duration_from_streaminfo() -> None:
    rate, samples = 44100, 441_000  # 10 s
    bits = (rate << 44) | (1 << 41) | (15 << 36) | samples  # stereo, 16-bit
    streaminfo = b"\x10\x00\x10\x00" + b"\x00" * 6 + bits.to_bytes(8, "big") + b"\x00" * 16
    flac = b"fLaC" + b"\x80\x00\x00\x22" + streaminfo + b"\x00" * 100
    assert clip_seconds(Blob(b64(flac)), 128.0) == pytest.approx(10.0)


def test_mp3_uses_frame_bitrate_and_skips_id3() -> None:
    frame = b"\xff\xfb\x90\x44"  # MPEG-1 Layer III, 128 kbps, 44.1 kHz
    body = frame + b"\x00" * (160_000 - 4)  # 160 kB at 128 kbps = 10 s
    assert clip_seconds(Blob(b64(body)), 64.0) == pytest.approx(10.0)
    id3 = b"ID3\x04\x00\x00" + bytes([0, 0, 0, 20]) + b"\x00" * 20
    frame320 = b"\xff\xfb\xe0\x44"  # 320 kbps
    assert clip_seconds(Blob(b64(id3 + frame320 + b"\x00" * 39_996)), 64.0) == pytest.approx(1.0)


def test_other_compressed_formats_use_policy_bitrate() -> None:
    ogg = b"OggS" + b"\x00" * 79_996  # 80 kB at 128 kbps = 5 s
    assert clip_seconds(Blob(b64(ogg)), 128.0) == pytest.approx(5.0)


def test_wav_without_data_chunk_is_an_error() -> None:
    header = wav_bytes(0.1)[:36]  # RIFF + fmt only
    with pytest.raises(MediaError):
        clip_seconds(Blob(b64(header)), 128.0)
