"""Image width/height from the file header alone: PNG, JPEG, WebP (VP8/VP8L/VP8X), GIF, BMP.

Pricing an image needs only its size, so we never decode pixels: each reader looks at a few dozen bytes
(JPEG walks its segment list to the first SOF marker). A reader returns None when the bytes it was given
end before the answer, so the caller can fetch a longer prefix; it raises HeaderError when the bytes
cannot be the format at all. Faster than Pillow's lazy open, which bench/estimate.py measures.

EXIF orientation is deliberately ignored: neither SGLang nor the Hugging Face processors rotate images
before counting, and the Qwen token count is symmetric in (w, h) anyway.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

Size = tuple[int, int]


class HeaderError(ValueError):
    """The bytes are not a readable image of a supported format."""


def _png(b: bytes) -> Size | None:
    if len(b) < 24:
        return None
    if b[12:16] != b"IHDR":
        raise HeaderError("PNG without an IHDR chunk")
    w, h = struct.unpack(">II", b[16:24])
    return w, h


def _gif(b: bytes) -> Size | None:
    if len(b) < 10:
        return None
    w, h = struct.unpack("<HH", b[6:10])
    return w, h


def _bmp(b: bytes) -> Size | None:
    if len(b) < 26:
        return None
    (dib,) = struct.unpack("<I", b[14:18])
    if dib == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        w, h = struct.unpack("<HH", b[18:22])
        return w, h
    if dib < 40:
        raise HeaderError(f"BMP with unknown header size {dib}")
    w, h = struct.unpack("<ii", b[18:26])
    return abs(w), abs(h)  # negative height means top-down rows


def _webp(b: bytes) -> Size | None:
    if len(b) < 30:
        return None
    chunk = b[12:16]
    if chunk == b"VP8 ":
        if b[23:26] != b"\x9d\x01\x2a":
            raise HeaderError("WebP VP8 frame without its start code")
        w, h = struct.unpack("<HH", b[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L":
        if b[20] != 0x2F:
            raise HeaderError("WebP VP8L without its signature byte")
        bits = int.from_bytes(b[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        w = int.from_bytes(b[24:27], "little") + 1
        h = int.from_bytes(b[27:30], "little") + 1
        return w, h
    raise HeaderError(f"WebP with unknown chunk {chunk!r}")


# SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC): every frame header that carries the size.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE = frozenset([0x01, *range(0xD0, 0xD8)])  # TEM, RSTn: markers with no length field


def _jpeg(b: bytes) -> Size | None:
    i, n = 2, len(b)
    while True:
        if i >= n:
            return None
        if b[i] != 0xFF:
            raise HeaderError("JPEG segment list is corrupt")
        while i < n and b[i] == 0xFF:  # any number of fill bytes may precede a marker code
            i += 1
        if i >= n:
            return None
        marker = b[i]
        if marker == 0:
            raise HeaderError("JPEG segment list is corrupt")
        i += 1
        if marker in _STANDALONE:
            continue
        if marker in (0xD9, 0xDA):
            raise HeaderError("JPEG without a frame header before its scan")
        if i + 2 > n:
            return None
        seg_len = (b[i] << 8) | b[i + 1]
        if seg_len < 2:
            raise HeaderError("JPEG segment with an impossible length")
        if marker in _SOF:
            if i + 7 > n:
                return None
            h, w = struct.unpack(">HH", b[i + 3 : i + 7])
            return w, h
        i += seg_len  # APPn (EXIF, ICC …), DQT, DHT, COM: skip without reading


_READERS: list[tuple[bytes, int, str, Callable[[bytes], Size | None]]] = [
    (b"\x89PNG\r\n\x1a\n", 0, "png", _png),
    (b"\xff\xd8\xff", 0, "jpeg", _jpeg),
    (b"GIF87a", 0, "gif", _gif),
    (b"GIF89a", 0, "gif", _gif),
    (b"BM", 0, "bmp", _bmp),
]


def sniff(b: bytes) -> str | None:
    """The format name from the magic bytes, or None when they match no supported format."""
    for magic, offset, name, _ in _READERS:
        if b.startswith(magic, offset):
            return name
    if b[:4] == b"RIFF" and b[8:12] == b"WEBP":
        return "webp"
    return None


_BY_NAME: dict[str, Callable[[bytes], Size | None]] = {name: fn for _, _, name, fn in _READERS}
_BY_NAME["webp"] = _webp


def read_size(fmt: str, b: bytes) -> Size | None:
    """(width, height) of an image of format `fmt`, None if `b` is too short to tell."""
    return _BY_NAME[fmt](b)


def is_truncated(fmt: str, head: bytes, tail: bytes, total: int) -> bool:
    """Cheap end-of-file checks where the format allows them (PNG IEND, GIF trailer, declared sizes).

    JPEG is not checked: cameras append data after EOI (motion photos), and readers accept that.
    """
    if fmt == "png":
        return b"IEND" not in tail
    if fmt == "gif":
        return not tail.endswith(b";")
    if fmt == "bmp":
        return len(head) >= 6 and struct.unpack("<I", head[2:6])[0] > total
    if fmt == "webp":
        return struct.unpack("<I", head[4:8])[0] + 8 > total
    return False
