"""Header-only image sizes on real Pillow-made files in every supported format, and bad payloads."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from gateway.estimate.blob import Blob, MediaError, parse_source
from gateway.estimate.imagehead import HeaderError, sniff
from gateway.estimate.media import image_size
from tests.estimate.helpers import b64, image_bytes, png_header_only

FORMATS = [
    ("PNG", {}),
    ("JPEG", {}),
    ("JPEG", {"progressive": True, "quality": 80}),
    ("WEBP", {"quality": 70}),  # lossy: VP8
    ("WEBP", {"lossless": True}),  # VP8L
    ("GIF", {}),
    ("BMP", {}),
]
SIZES = [(1, 1), (333, 217), (29, 1001), (1023, 767)]


@pytest.mark.parametrize(("fmt", "save"), FORMATS, ids=lambda v: str(v))
@pytest.mark.parametrize(("w", "h"), SIZES)
def test_sizes_match_pillow_files(fmt: str, save: dict[str, object], w: int, h: int) -> None:
    assert image_size(Blob(b64(image_bytes(fmt, w, h, **save)))) == (w, h)


def test_webp_extended_vp8x() -> None:
    buf = io.BytesIO()
    Image.new("RGBA", (301, 199), (1, 2, 3, 128)).save(buf, "WEBP", exif=b"Exif\x00\x00II*\x00")
    data = buf.getvalue()
    assert data[12:16] == b"VP8X"
    assert image_size(Blob(b64(data))) == (301, 199)


def test_jpeg_with_large_exif_needs_longer_prefix() -> None:
    exif = Image.Exif()
    exif[0x010E] = "x" * 30_000  # ImageDescription: pushes SOF past the first 4 KB
    data = image_bytes("JPEG", 640, 480, exif=exif.tobytes())
    assert data.index(b"\xff\xc0") > 30_000
    assert image_size(Blob(b64(data))) == (640, 480)


def test_exif_orientation_is_ignored_on_purpose() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90°: the backend does not transpose before counting, neither do we
    data = image_bytes("JPEG", 640, 480, exif=exif.tobytes())
    assert image_size(Blob(b64(data))) == (640, 480)


def test_absurd_declared_size_reads_without_allocating() -> None:
    assert image_size(Blob(b64(png_header_only(100_000, 100_000)))) == (100_000, 100_000)


def test_mime_style_base64_with_line_breaks() -> None:
    text = b64(image_bytes("PNG", 50, 40))
    wrapped = "\n".join(text[i : i + 76] for i in range(0, len(text), 76)) + "\n"
    assert image_size(Blob(wrapped)) == (50, 40)


def test_data_uri_and_remote_sources() -> None:
    src = parse_source("data:image/png;base64," + b64(image_bytes("PNG", 5, 6)))
    assert src.kind == "inline" and src.blob is not None and src.blob.mime == "image/png"
    assert image_size(src.blob) == (5, 6)
    assert parse_source("https://example.invalid/cat.png").kind == "remote"
    assert parse_source("/srv/images/cat.png").kind == "remote"
    assert parse_source(b64(image_bytes("JPEG", 8, 8))).kind == "inline"  # raw base64 starting '/9j/'


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("!!!!notbase64!!!", "not valid base64"),
        ("QUJD" + "Q", "multiple of 4"),
        (b64(b"just some text, not an image"), "unsupported image format"),
        (b64(image_bytes("PNG", 64, 64)[:20]), "truncated before its size"),
        (b64(image_bytes("PNG", 64, 64)[:-30]), "PNG image is truncated"),
        (b64(image_bytes("GIF", 64, 64)[:-5]), "GIF image is truncated"),
        (b64(image_bytes("WEBP", 64, 64)[:-10]), "WEBP image is truncated"),
        (b64(image_bytes("BMP", 64, 64)[:-10]), "BMP image is truncated"),
        (b64(image_bytes("JPEG", 64, 64)[:150]), "truncated before its size"),
        (b64(png_header_only(0, 10)), "zero size"),
    ],
)
def test_bad_payloads(payload: str, reason: str) -> None:
    with pytest.raises((MediaError, HeaderError), match=reason):
        image_size(Blob(payload))


def test_data_uri_must_be_base64() -> None:
    with pytest.raises(MediaError, match="not base64"):
        parse_source("data:image/svg+xml,<svg/>")


def test_sniff_names_formats() -> None:
    assert [sniff(image_bytes(f, 2, 2)) for f in ("PNG", "JPEG", "WEBP", "GIF", "BMP")] == [
        "png",
        "jpeg",
        "webp",
        "gif",
        "bmp",
    ]
    assert sniff(b"II*\x00tiff") is None
