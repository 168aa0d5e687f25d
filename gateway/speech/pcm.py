"""A raw audio stream's format from its headers (sglang-omni's streamed speech: `audio/pcm` with
`x-sample-rate`, `x-channels`, `x-bit-depth`), and the seconds its bytes hold."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


def _positive(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else None


@dataclass(frozen=True, slots=True)
class PcmFormat:
    sample_rate: int
    channels: int = 1
    bit_depth: int = 16

    @classmethod
    def of(cls, headers: Mapping[str, str]) -> PcmFormat | None:
        """The format the headers state; None without a sample rate (the bytes cannot be timed)."""
        rate = _positive(headers.get("x-sample-rate"))
        if rate is None:
            return None
        channels = _positive(headers.get("x-channels")) or 1
        bits = _positive(headers.get("x-bit-depth")) or 16
        return cls(rate, channels, bits)

    def seconds(self, n_bytes: int) -> float:
        return n_bytes / (self.sample_rate * self.channels * self.bit_depth / 8)
