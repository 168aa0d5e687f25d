"""Audio clip duration from its header, and audio tokens per family.

Durations: WAV (fmt + data chunks) and FLAC (STREAMINFO) are exact; MP3 uses the first frame's bitrate
(exact for CBR, close for VBR); anything else (ogg, opus, m4a, webm …) is size ÷ the policy's assumed
bitrate. Tokens follow the audio encoders' output-length functions at 100 mel frames per second:
- qwen2_5_omni: L = (F−1)//2 + 1; tokens = (L−2)//2 + 1 (≈ 25/s)
- qwen3_omni (n_window 50): per 100-frame window 13 tokens, plus the remainder through three halvings (≈ 13/s)
"""

from __future__ import annotations

import struct

from gateway.estimate.blob import Blob, MediaError
from gateway.estimate.settings import AudioFamily

MEL_FRAMES_PER_SECOND = 100
_MP3_KBPS = (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 0)  # MPEG-1 Layer III


def qwen2_5_omni_audio_tokens(mel_frames: int) -> int:
    if mel_frames <= 0:
        return 0
    after_conv = (mel_frames - 1) // 2 + 1
    return max(0, (after_conv - 2) // 2 + 1)


def qwen3_omni_audio_tokens(mel_frames: int) -> int:
    if mel_frames <= 0:
        return 0
    rest = mel_frames % 100
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (mel_frames // 100) * 13


def audio_tokens(family: AudioFamily, seconds: float) -> int:
    """Audio tokens (markers excluded) for a clip of `seconds`."""
    frames = int(seconds * MEL_FRAMES_PER_SECOND)
    if family == "qwen2_5_omni":
        return qwen2_5_omni_audio_tokens(frames)
    if family == "qwen3_omni":
        return qwen3_omni_audio_tokens(frames)
    return 0


def wav_seconds(head: bytes, total: int) -> float:
    """Duration of a WAV file of `total` bytes from its first bytes (fmt and data chunks within them)."""
    pos, byte_rate = 12, 0
    while pos + 8 <= len(head):
        chunk, size = head[pos : pos + 4], struct.unpack("<I", head[pos + 4 : pos + 8])[0]
        if chunk == b"fmt ":
            if pos + 20 > len(head):
                break
            byte_rate = struct.unpack("<I", head[pos + 16 : pos + 20])[0]
        elif chunk == b"data":
            if byte_rate <= 0:
                raise MediaError("WAV data chunk before a valid fmt chunk")
            available = total - pos - 8
            return min(size, available) / byte_rate  # streamed WAVs declare 0xFFFFFFFF
        pos += 8 + size + (size & 1)
    raise MediaError("WAV header without fmt and data chunks in its first 4 KB")


def _flac_seconds(head: bytes) -> float:
    if len(head) < 26 or head[4] & 0x7F != 0:
        raise MediaError("FLAC without a STREAMINFO block")
    bits = int.from_bytes(head[18:26], "big")
    rate = bits >> 44
    samples = bits & ((1 << 36) - 1)
    if rate == 0:
        raise MediaError("FLAC with sample rate 0")
    return samples / rate


def _mp3_frames(head: bytes) -> tuple[int, float | None]:
    """(offset of the first frame after any ID3v2 tag, that frame's bitrate in kbps or None)."""
    pos = 0
    if head[:3] == b"ID3" and len(head) >= 10:
        pos = 10 + (head[6] << 21 | head[7] << 14 | head[8] << 7 | head[9])
    if pos + 4 > len(head) or head[pos] != 0xFF or head[pos + 1] & 0xE0 != 0xE0:
        return pos, None
    return pos, float(_MP3_KBPS[head[pos + 2] >> 4]) or None


def clip_seconds(blob: Blob, default_kbps: float) -> float:
    """Duration of an inline clip: exact from WAV/FLAC headers, bitrate-based for compressed formats."""
    total = blob.size()
    head = blob.head(64)
    if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
        return wav_seconds(blob.head(4096), total)
    if head[:4] == b"fLaC":
        return _flac_seconds(head)
    offset, kbps = _mp3_frames(blob.head(4096)) if head[:3] == b"ID3" or head[:1] == b"\xff" else (0, None)
    return max(0, total - offset) * 8 / ((kbps or default_kbps) * 1000)
