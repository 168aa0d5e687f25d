"""Shared load-test workloads: one text stream at a constant rate, for the replay and bucket tests."""

from __future__ import annotations

from typing import Any

from loadtest.workload import Workload, load_workload


def text_stream(*, output_tokens: int, warmup: dict[str, float], **fields: Any) -> Workload:
    """Text only, 4 requests/s at constant gaps for 2 s, fixed output tokens; `fields` adds the rest."""
    return load_workload(
        None,
        {
            "mix": {"text": 1},
            "arrivals": {"shape": "constant", "process": "constant", "rate": 4.0},
            "duration": 2.0,
            "warmup": warmup,
            "output_tokens": {"dist": "fixed", "value": output_tokens},
            **fields,
        },
    )
