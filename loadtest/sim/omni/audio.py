"""Audio bytes as sglang-omni's `client/audio.py` encodes them: 16-bit mono PCM in a 44-byte WAV header.

The waveform is a quiet 200 Hz tone (one cached period repeated), so a chunk costs a bytes repeat, not maths.
Formats the simulator cannot encode (mp3, flac, opus, aac, anything unknown) fall back to WAV with the
`audio/wav` MIME type, as the real server does when pydub / soundfile are not installed.
"""

from __future__ import annotations

import base64
import functools
import math
import struct

FORMAT_MIME_TYPES = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "pcm": "audio/pcm",
}
MIME_TO_FORMAT = {mime: fmt for fmt, mime in FORMAT_MIME_TYPES.items()}
TONE_HZ = 200
TONE_AMPLITUDE = 0.1


@functools.cache
def _period(sample_rate: int) -> bytes:
    n = sample_rate // TONE_HZ
    return b"".join(
        struct.pack("<h", int(TONE_AMPLITUDE * 32767 * math.sin(2 * math.pi * i / n))) for i in range(n)
    )


def pcm(samples: int, sample_rate: int) -> bytes:
    period = _period(sample_rate)
    reps = samples * 2 // len(period) + 1
    return (period * reps)[: samples * 2]


def wav(samples: int, sample_rate: int) -> bytes:
    data = pcm(samples, sample_rate)
    header = b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return header + b"data" + struct.pack("<I", len(data)) + data


def apply_speed(samples: int, speed: float) -> int:
    """Sample count after client/audio.py's speed resampling; speed must be positive as there."""
    if speed <= 0.0:
        raise ValueError(f"speed must be positive, got {speed}")
    return samples if speed == 1.0 else max(round(samples / speed), 1)


def encode(samples: int, response_format: str, sample_rate: int, speed: float = 1.0) -> tuple[bytes, str]:
    """(bytes, mime type) for `samples` of audio in the requested format."""
    samples = apply_speed(samples, speed)
    fmt = response_format.lower().strip()
    if fmt == "pcm":
        return pcm(samples, sample_rate), FORMAT_MIME_TYPES["pcm"]
    return wav(samples, sample_rate), FORMAT_MIME_TYPES["wav"]


def encode_b64(samples: int, response_format: str, sample_rate: int) -> str:
    """audio_to_base64: what one chat `delta.audio.data` (or `message.audio.data`) carries."""
    data, _ = encode(samples, response_format, sample_rate)
    return base64.b64encode(data).decode("ascii")
