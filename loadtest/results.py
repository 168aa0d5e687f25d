"""Assemble one run's result document (the JSON report) from raw records and backend samples.

Times of a time-scaled simulator run are expanded back (× time_scale) so the table reads in the
simulated engine's milliseconds; the client's own send lag stays in wall time — it is a property of
the load generator, not of the system under test.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from loadtest.metrics import breakdowns, error_bursts, stats, summarize, time_series
from loadtest.records import RequestRecord
from loadtest.runner import RunOptions
from loadtest.scrape import Sample, summarize_samples
from loadtest.workload import key_fingerprint

SCHEMA_VERSION = 1


def build_result(records: list[RequestRecord], samples: list[Sample], opts: RunOptions) -> dict[str, Any]:
    w = opts.workload
    measured = [r for r in records if r.phase == "measured"]
    scale = w.time_scale
    scaled = [r.scaled(scale) for r in measured] if scale != 1.0 else measured
    summary = summarize(scaled, w.slo, gpus=opts.gpus)
    summary["send_lag_ms"] = stats([r.send_lag * 1000 for r in measured])
    first = min((r.sent for r in measured), default=0.0)
    window = [Sample(s.t - first, s.target, s.up, s.values) for s in samples if s.t >= first]
    backend = summarize_samples(window, scale)
    crashes = int(backend.get("crashes", 0))
    bursts = error_bursts(measured)
    wall = max((r.sent for r in measured), default=0.0) - first
    return {
        "kind": "run",
        "version": SCHEMA_VERSION,
        "meta": {
            "workload": w.name,
            "url": opts.url,
            "seed": w.seed,
            "workers": opts.workers,
            "time_scale": scale,
            "gpus": opts.gpus,
            "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "workload_spec": _without_keys(w.model_dump(mode="json")),
        },
        "summary": summary,
        "client": {
            "sent": len(measured),
            "offered_rate_wall": (len(measured) - 1) / wall if wall > 0 else 0.0,
            "send_lag_ms": summary["send_lag_ms"],
        },
        "breakdowns": breakdowns(scaled, w.slo, summary["duration_s"]),
        "series": time_series(scaled),
        "backend": backend,
        "oom": {"crashes": crashes, "error_bursts": bursts, "detected": crashes > 0 or bursts > 0},
    }


def _without_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """The workload as run, its API keys replaced by their fingerprints: result files get shared."""
    spec["tenants"] = [{**t, "name": key_fingerprint(t["name"])} for t in spec.get("tenants") or []]
    if spec.get("api_key"):
        spec["api_key"] = key_fingerprint(spec["api_key"])
    return spec
