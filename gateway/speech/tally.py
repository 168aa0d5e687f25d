"""A backend's speech as the gateway measured it, summed for `/admin/state`, beside the server's own view
(sglang-omni's `sglang_omni:audio_*` histograms, where it exports them): a difference between the two is a
finding about one side or the other."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AudioTally:
    answers: int = 0  # answers with audio
    seconds: float = 0.0  # audio seconds delivered
    ttfa_sum: float = 0.0  # time to first audio from dispatch (the server's TTFP runs from its arrival)
    rtf_count: int = 0
    rtf_sum: float = 0.0

    def add(self, ttfa_s: float, seconds: float, rtf: float | None) -> None:
        self.answers += 1
        self.seconds += seconds
        self.ttfa_sum += ttfa_s
        if rtf is not None:
            self.rtf_count += 1
            self.rtf_sum += rtf

    def snapshot(self) -> dict[str, float | int | None]:
        return {
            "answers": self.answers,
            "audio_seconds": round(self.seconds, 3),
            "ttfa_s_mean": round(self.ttfa_sum / self.answers, 4) if self.answers else None,
            "rtf_mean": round(self.rtf_sum / self.rtf_count, 4) if self.rtf_count else None,
        }
