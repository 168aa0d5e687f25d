"""Hypothesis strategies for hostile requests: OpenAI envelopes of every wrong shape, and media whose
headers are real (PNG, JPEG, WebP, GIF, BMP, WAV, FLAC, MP3) but carry absurd sizes, are cut short, or have
the wrong magic. Shared by the pure fuzz test and the one through a live gateway."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

from hypothesis import strategies as st

MODEL = "qwen2.5-omni-7b"  # a profile that takes images and audio


def sized(bits: int, signed: bool = False) -> st.SearchStrategy[int]:
    """A field of that width: a plausible value, or any value it can hold (absurd ones included)."""
    low, high = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    return st.one_of(st.integers(1, min(high, 3000)), st.integers(low, high))


u32, u16, i32 = sized(32), sized(16), sized(32, signed=True)


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + b"\0\0\0\0"


png = st.builds(
    lambda w, h: b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)),
    u32,
    u32,
)
gif = st.builds(lambda w, h: b"GIF89a" + struct.pack("<HH", w, h) + b"\xf7\0\0", u16, u16)
bmp = st.builds(
    lambda w, h: b"BM" + struct.pack("<IHHI", 0, 0, 0, 54) + struct.pack("<IiiHH", 40, w, h, 1, 24), i32, i32
)
jpeg = st.builds(
    lambda sof, w, h: (
        b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
        + bytes([0xFF, sof])
        + struct.pack(">HBHHB", 17, 8, h, w, 3)
    ),
    st.sampled_from([0xC0, 0xC1, 0xC2, 0xC4, 0xC8, 0xCC, 0xDA]),
    u16,
    u16,
)
webp = st.one_of(
    st.builds(
        lambda w, h: (
            b"RIFF\0\0\0\0WEBPVP8X"
            + struct.pack("<I", 10)
            + b"\0\0\0\0"
            + w.to_bytes(3, "little")
            + h.to_bytes(3, "little")
        ),
        st.integers(0, 2**24 - 1),
        st.integers(0, 2**24 - 1),
    ),
    st.builds(
        lambda bits: b"RIFF\0\0\0\0WEBPVP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits), u32
    ),
    st.builds(
        lambda w, h: (
            b"RIFF\0\0\0\0WEBPVP8 " + struct.pack("<I", 10) + b"\0\0\0\x9d\x01\x2a" + struct.pack("<HH", w, h)
        ),
        u16,
        u16,
    ),
)
wav = st.builds(
    lambda channels, rate, bits, size: (
        b"RIFF\0\0\0\0WAVEfmt "
        + struct.pack(
            "<IHHIIHH",
            16,
            1,
            channels,
            rate,
            rate * channels * bits // 8 % 2**32,
            channels * bits // 8 % 2**16,
            bits,
        )
        + b"data"
        + struct.pack("<I", size)
    ),
    u16,
    u32,
    u16,
    u32,
)
flac = st.builds(
    lambda rate, samples: (
        b"fLaC\x00\x00\x00\x22" + b"\0" * 10 + ((rate << 44) | samples).to_bytes(8, "big") + b"\0" * 16
    ),
    st.integers(0, 2**20 - 1),
    st.integers(0, 2**36 - 1),
)
mp3 = st.one_of(
    st.builds(
        lambda size: b"ID3\x04\x00\x00" + bytes([(size >> s) & 0x7F for s in (21, 14, 7, 0)]),
        st.integers(0, 2**28 - 1),
    ),
    st.builds(
        lambda b1, b2: bytes([0xFF, 0xE0 | (b1 & 0x1F), b2, 0x00]), st.integers(0, 255), st.integers(0, 255)
    ),
)

IMAGE_HEADERS = {"png": png, "jpeg": jpeg, "webp": webp, "gif": gif, "bmp": bmp}
AUDIO_HEADERS = {"wav": wav, "flac": flac, "mp3": mp3}


@st.composite
def damaged(draw: st.DrawFn, header: st.SearchStrategy[bytes]) -> bytes:
    """A real header, then: whole with a random tail, cut short anywhere, or with its magic broken."""
    data = draw(header)
    how = draw(st.sampled_from(["whole", "truncated", "wrong_magic"]))
    if how == "truncated":
        return data[: draw(st.integers(0, len(data)))]
    if how == "wrong_magic":
        return draw(st.binary(min_size=1, max_size=4)) + data[4:]
    return data + draw(st.binary(max_size=64))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@st.composite
def image_part(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(IMAGE_HEADERS)))
    data = draw(damaged(IMAGE_HEADERS[kind]))
    mime = draw(st.sampled_from([kind, "png", "octet-stream", ""]))
    uri = f"data:image/{mime};base64,{_b64(data)}"
    url = draw(st.sampled_from([uri, uri, uri, _b64(data), "data:image/png;base64,@@@"]))
    part: dict[str, Any] = {"url": url}
    if draw(st.booleans()):
        part["detail"] = draw(st.sampled_from(["low", "high", "auto", 3, None]))
    return {"type": "image_url", "image_url": part}


@st.composite
def audio_part(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(AUDIO_HEADERS)))
    data = draw(damaged(AUDIO_HEADERS[kind]))
    if draw(st.booleans()):
        return {
            "type": "input_audio",
            "input_audio": {"data": _b64(data), "format": draw(st.sampled_from([kind, "ogg", 7]))},
        }
    return {"type": "audio_url", "audio_url": {"url": f"data:audio/{kind};base64,{_b64(data)}"}}


junk = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=8)
)
part = st.one_of(
    image_part(),
    audio_part(),
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(st.text(max_size=40), junk)}),
    st.dictionaries(st.sampled_from(["type", "text", "image_url", "url"]), junk, max_size=3),
    junk,
)
message = st.one_of(
    st.fixed_dictionaries(
        {
            "role": st.one_of(st.sampled_from(["user", "system", "assistant"]), junk),
            "content": st.one_of(st.text(max_size=60), st.lists(part, max_size=4), junk),
        }
    ),
    junk,
)
number = st.one_of(st.integers(-5, 10**9), st.floats(allow_nan=True, allow_infinity=True), junk)


media_message = st.builds(
    lambda parts, text: {"role": "user", "content": [{"type": "text", "text": text}, *parts]},
    st.lists(st.one_of(image_part(), audio_part()), min_size=1, max_size=2),
    st.text(max_size=40),
)


@st.composite
def envelope(draw: st.DrawFn) -> tuple[str, bytes]:
    """(endpoint, raw body). Most are well-formed envelopes around hostile content (damaged media, odd
    text), so the pricing runs on them; the rest are broken anywhere: wrong types, junk values, no JSON."""
    endpoint = draw(st.sampled_from(["chat", "chat", "chat", "completions", "embeddings"]))
    broken = draw(st.integers(0, 9)) < 3
    body: dict[str, Any] = {"model": draw(junk) if broken and draw(st.booleans()) else MODEL}
    if endpoint == "chat":
        messages = (
            st.lists(message, min_size=1, max_size=4)
            if broken
            else st.lists(media_message, min_size=1, max_size=1)
        )
        body["messages"] = draw(st.one_of(messages, junk) if broken else messages)
    elif endpoint == "completions":
        body["prompt"] = draw(
            st.one_of(st.text(max_size=80), st.lists(st.integers(-1, 2**40), max_size=8), junk)
        )
    else:
        body["input"] = draw(
            st.one_of(st.text(max_size=80), st.lists(st.text(max_size=20), max_size=4), junk)
        )
    if endpoint != "embeddings":
        body["max_tokens"] = draw(number if broken else st.integers(1, 64))
    if broken:
        for key in ("max_completion_tokens", "n", "temperature", "priority", "stream"):
            if draw(st.booleans()):
                body[key] = draw(number)
        if draw(st.booleans()):
            body["stream_options"] = draw(st.one_of(st.fixed_dictionaries({"include_usage": junk}), junk))
    # json, not orjson: integers past 64 bits and NaN (not JSON at all) are hostile input too
    raw = json.dumps(body).encode() if draw(st.integers(0, 19)) else draw(st.binary(max_size=40))
    return endpoint, raw
