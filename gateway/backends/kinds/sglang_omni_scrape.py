"""sglang-omni's optional `/metrics` (`--enable-metrics`, `serve/metrics.py`): the coordinator's /health
snapshot as `sglang_omni_*` gauges, read when a /health body lacks it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class OmniGauges:
    tracked: int | None = None  # sglang_omni_pipeline_tracked_requests
    pending: int | None = None  # sglang_omni_pipeline_pending_completions
    stages: tuple[str, ...] = ()  # sglang_omni_stage_present{stage} == 1


def read_omni_metrics(text: str) -> OmniGauges:
    """The coordinator gauges of one server's exposition (one model per server); ValueError if unparsable."""
    tracked = pending = None
    stages: list[str] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != family.name or not math.isfinite(sample.value):
                continue
            if family.name == "sglang_omni_pipeline_tracked_requests":
                tracked = int(sample.value)
            elif family.name == "sglang_omni_pipeline_pending_completions":
                pending = int(sample.value)
            elif family.name == "sglang_omni_stage_present" and sample.value == 1:
                stages.append(sample.labels.get("stage", ""))
    return OmniGauges(tracked, pending, tuple(stages))
