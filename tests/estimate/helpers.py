"""Real media files made on the fly (Pillow images, wave-module WAVs) and request builders."""

from __future__ import annotations

import base64
import io
import struct
import wave
import zlib
from typing import Any

from PIL import Image


def image_bytes(fmt: str, width: int, height: int, **save: Any) -> bytes:
    mode = "P" if fmt == "GIF" else "RGB"
    buf = io.BytesIO()
    Image.new(mode, (width, height), 7 if mode == "P" else (10, 120, 200)).save(buf, fmt, **save)
    return buf.getvalue()


def png_header_only(width: int, height: int) -> bytes:
    """A structurally complete PNG that declares any size but holds no pixel data (IHDR + IEND)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def wav_bytes(seconds: float, rate: int = 16000, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\x00\x00" * channels * int(seconds * rate))
    return buf.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


def image_part(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def chat(*parts: Any, model: str = "qwen2.5-omni-7b", **body: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": list(parts)}], **body}
