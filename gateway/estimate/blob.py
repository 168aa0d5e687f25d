"""Lazy views of inline media: decode only the base64 prefix (and tail) a header reader needs.

A 1 MB image arrives as ~1.4 MB of base64; decoding it all would cost about a millisecond per image and
allocate the whole file. A Blob decodes a few KB from the front, a few bytes from the back, and computes
the decoded length arithmetically.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Literal

_WHITESPACE = str.maketrans("", "", " \t\r\n")


class MediaError(ValueError):
    """Inline media that cannot be decoded; the message says why, the caller adds where."""


class Blob:
    """Base64 text (from offset `start` of a larger string, which is never copied) read from either end."""

    __slots__ = ("_clean", "_s", "_start", "mime")

    def __init__(self, text: str, mime: str | None = None, start: int = 0) -> None:
        self._s = text
        self._start = start  # slicing a data URI's payload out would copy a megabyte per image
        self._clean = False
        self.mime = mime

    def _strip(self) -> None:
        """Drop line breaks/spaces (MIME-style base64) once; only reached when a strict decode failed."""
        if self._clean:
            raise MediaError("not valid base64")
        self._s = self._s[self._start :].translate(_WHITESPACE)
        self._start = 0
        self._clean = True

    @staticmethod
    def _decode(chunk: str) -> bytes | None:
        try:
            return binascii.a2b_base64(chunk, strict_mode=True)
        except binascii.Error:
            return None

    def head(self, nbytes: int) -> bytes:
        """At least the first `nbytes` decoded bytes (fewer only if the payload is shorter)."""
        nchars = (nbytes + 2) // 3 * 4
        while True:
            chunk = self._s[self._start : self._start + nchars]
            out = self._decode(chunk[: len(chunk) - len(chunk) % 4])
            if out is not None:
                return out
            self._strip()

    def tail(self, nbytes: int) -> bytes:
        """The last bytes of the payload (about `nbytes`, aligned to whole base64 quanta)."""
        nchars = (nbytes + 2) // 3 * 4
        while True:
            end = len(self._s)
            while end > self._start and self._s[end - 1] in " \t\r\n":
                end -= 1
            chunk = self._s[max(self._start, end - nchars) : end]
            out = self._decode(chunk[len(chunk) % 4 :])
            if out is not None:
                return out
            self._strip()

    def size(self) -> int:
        """Decoded length in bytes, without decoding; raises MediaError if the length is impossible."""
        n = len(self._s) - self._start
        if n % 4:
            if not self._clean:
                self._strip()
                n = len(self._s)
            if n % 4:
                raise MediaError("base64 length is not a multiple of 4 (truncated or unpadded)")
        if n == 0:
            raise MediaError("empty base64 payload")
        pad = (self._s[-1] == "=") + (self._s[-2] == "=")
        return n // 4 * 3 - pad


@dataclass(frozen=True, slots=True)
class Source:
    """Where a media item lives: inline (a Blob we can read) or remote (a URL or path we do not fetch)."""

    kind: Literal["inline", "remote"]
    blob: Blob | None = None


def parse_source(url: str) -> Source:
    """Classify an image/audio/video `url` value: data URI, http(s) URL or file path, or raw base64."""
    if url.startswith("data:"):
        comma = url.find(",", 5, 512)
        if comma < 0:
            raise MediaError("data URI without a ',' separating its header from the payload")
        header = url[5:comma]
        if not header.endswith(";base64"):
            raise MediaError("data URI is not base64-encoded")
        mime = header[: -len(";base64")].split(";", 1)[0] or None
        return Source("inline", Blob(url, mime, start=comma + 1))
    if url.startswith(("http://", "https://", "file:")):
        return Source("remote")
    if url.startswith(("/", "./")) and "." in url[:4096]:
        return Source("remote")  # a path on the backend's disk; base64 (which may start '/9j/') has no '.'
    if not url:
        raise MediaError("empty url")
    return Source("inline", Blob(url))
