"""Synthetic images and audio clips, generated once per (size, variant, seed) and cached on disk.

Images are gradients with seeded rectangles rather than noise, so PNG/JPEG sizes stay close to real
photos and screenshots. Several variants per resolution keep a prefix cache from serving every image
for free. Clients send them as base64 data URIs, the form the gateway and SGLang must decode.
"""

from __future__ import annotations

import base64
import io
import math
import os
import random
import struct
import wave
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw

IMAGE_FORMATS = {"png": ("PNG", "image/png"), "jpeg": ("JPEG", "image/jpeg")}


def default_cache_dir() -> Path:
    env = os.environ.get("OMNIGATE_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "omnigate" / "loadtest"


def render_image(width: int, height: int, variant: int, seed: int, fmt: str) -> bytes:
    """Deterministic image bytes for the given size, variant and seed."""
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"unknown image format {fmt!r}; use one of {sorted(IMAGE_FORMATS)}")
    rng = random.Random(f"img:{width}x{height}:{variant}:{seed}")
    base = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    tint = Image.new("RGB", (width, height), tuple(rng.randrange(256) for _ in range(3)))
    img = Image.blend(base, tint, 0.5)
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        x1, y1 = (
            min(width, x0 + rng.randrange(1, width // 2 + 2)),
            min(height, y0 + rng.randrange(1, height // 2 + 2)),
        )
        draw.rectangle((x0, y0, x1, y1), fill=tuple(rng.randrange(256) for _ in range(3)))
    out = io.BytesIO()
    pil_format, _ = IMAGE_FORMATS[fmt]
    img.save(out, pil_format, **({"quality": 85} if pil_format == "JPEG" else {}))
    return out.getvalue()


def render_wav(seconds: float, variant: int, rate: int = 16000) -> bytes:
    """A mono 16-bit WAV of a seeded tone: audio cost depends on duration only."""
    freq = 220.0 + 40.0 * variant
    frames = int(seconds * rate)
    samples = struct.pack(
        f"<{frames}h", *(int(8000 * math.sin(2 * math.pi * freq * i / rate)) for i in range(frames))
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples)
    return out.getvalue()


class MediaCache:
    """Data URIs / base64 payloads, memoised in memory and persisted under `root`."""

    def __init__(self, root: Path | None = None, seed: int = 0) -> None:
        self.root = root or default_cache_dir()
        self.seed = seed
        self._memo: dict[str, str] = {}

    def _cached(self, name: str, render: Callable[[], bytes]) -> bytes:
        path = self.root / name
        if path.exists():
            return path.read_bytes()
        data = render()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
        tmp.write_bytes(data)
        tmp.replace(path)  # atomic: concurrent workers never read a half-written file
        return data

    def image_uri(self, width: int, height: int, variant: int, fmt: str) -> str:
        key = f"img_{width}x{height}_v{variant}_s{self.seed}.{fmt}"
        if key not in self._memo:
            data = self._cached(key, lambda: render_image(width, height, variant, self.seed, fmt))
            mime = IMAGE_FORMATS[fmt][1]
            self._memo[key] = f"data:{mime};base64," + base64.b64encode(data).decode()
        return self._memo[key]

    def audio_b64(self, seconds: float, variant: int) -> str:
        key = f"audio_{seconds:g}s_v{variant}.wav"
        if key not in self._memo:
            data = self._cached(key, lambda: render_wav(seconds, variant))
            self._memo[key] = base64.b64encode(data).decode()
        return self._memo[key]
