"""sglang-omni's optional `/metrics` (`--enable-metrics`, `serve/metrics.py`): the coordinator's /health
snapshot as `sglang_omni_*` gauges, read when a /health body lacks it; and newer servers' own audio
histograms (`metrics/audio.py`: `sglang_omni:audio_ttfp_s`, `audio_rtf`, `audio_duration_s`; later spelt
`audio_ttfp_seconds`, `audio_output_duration_seconds`), shown beside the gateway's measurement."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class OmniGauges:
    tracked: int | None = None  # sglang_omni_pipeline_tracked_requests
    pending: int | None = None  # sglang_omni_pipeline_pending_completions
    stages: tuple[str, ...] = ()  # sglang_omni_stage_present{stage} == 1
    audio: dict[str, float] | None = None  # the server's audio histograms' means and totals, if exported


AUDIO_HISTOGRAMS = {
    "sglang_omni:audio_ttfp_s": "ttfp_s",
    "sglang_omni:audio_ttfp_seconds": "ttfp_s",
    "sglang_omni:audio_rtf": "rtf",
    "sglang_omni:audio_duration_s": "duration_s",
    "sglang_omni:audio_output_duration_seconds": "duration_s",
}
"""The server's audio histograms by both spellings, and the short name `/admin/state` shows."""


def _audio(sums: dict[str, float], counts: dict[str, float]) -> dict[str, float] | None:
    """Means of the histograms seen (their sums over their counts), the audio seconds and answers."""
    if not counts:
        return None
    out: dict[str, float] = {}
    for short in ("ttfp_s", "rtf"):
        if counts.get(short):
            out[f"{short}_mean"] = round(sums[short] / counts[short], 4)
    if "duration_s" in counts:
        out["audio_seconds"] = round(sums.get("duration_s", 0.0), 3)
        out["answers"] = counts["duration_s"]
    return out


def read_omni_metrics(text: str) -> OmniGauges:
    """The coordinator gauges of one server's exposition (one model per server); ValueError if unparsable."""
    tracked = pending = None
    stages: list[str] = []
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        short = AUDIO_HISTOGRAMS.get(family.name)
        for sample in family.samples:
            if short is not None and sample.name == family.name + "_sum":
                sums[short] = sums.get(short, 0.0) + sample.value
            elif short is not None and sample.name == family.name + "_count":
                counts[short] = counts.get(short, 0.0) + sample.value
            if sample.name != family.name or not math.isfinite(sample.value):
                continue
            if family.name == "sglang_omni_pipeline_tracked_requests":
                tracked = int(sample.value)
            elif family.name == "sglang_omni_pipeline_pending_completions":
                pending = int(sample.value)
            elif family.name == "sglang_omni_stage_present" and sample.value == 1:
                stages.append(sample.labels.get("stage", ""))
    return OmniGauges(tracked, pending, tuple(stages), _audio(sums, counts))
