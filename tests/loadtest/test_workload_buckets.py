"""Per-bucket request shapes: own max_tokens and body fields, runs of one bucket, scheduled batch jobs."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from loadtest.media import MediaCache
from loadtest.sim.profile import load_profile
from loadtest.sim.replay import arrivals
from loadtest.workload import RequestFactory, Workload, WorkloadError, load_workload
from tests.support.workloads import text_stream

LONG = {"output_tokens": {"dist": "fixed", "value": 1900}, "extra_body": {"ignore_eos": True}}


def _workload(buckets: dict[str, Any], mix: dict[str, float] | None = None) -> Workload:
    return load_workload(
        None,
        {
            "mix": mix or {"text": 1},
            "output_tokens": {"dist": "fixed", "value": 300},
            "prompt_tokens": {"dist": "fixed", "value": 20},
            "buckets": buckets,
        },
    )


def _requests(w: Workload, n: int, tmp_path: Path) -> list[tuple[str, int, bool]]:
    f = RequestFactory(w, MediaCache(tmp_path, w.seed))
    out = []
    for _ in range(n):
        r = f.next()
        out.append((r.bucket, r.body["max_tokens"], r.body.get("ignore_eos", False)))
    return out


def test_scheduled_run_gets_its_own_max_tokens_and_body_fields(tmp_path: Path) -> None:
    w = _workload({"long_answer": {**LONG, "at": 2, "run": 3}})
    short, long = ("text", 300, False), ("long_answer", 1900, True)
    assert _requests(w, 7, tmp_path) == [short, short, long, long, long, short, short]


def test_scheduled_run_repeats_every_n_requests(tmp_path: Path) -> None:
    w = _workload({"long_answer": {"at": 1, "every": 4, "run": 2}})
    buckets = [b for b, _, _ in _requests(w, 10, tmp_path)]
    assert buckets == [
        "text",
        *["long_answer"] * 2,
        "text",
        "text",
        *["long_answer"] * 2,
        "text",
        "text",
        "long_answer",
    ]


def test_mix_picked_bucket_with_a_run_comes_in_whole_runs(tmp_path: Path) -> None:
    w = _workload({"long_answer": {"run": 3}}, mix={"text": 1, "long_answer": 1})
    buckets = [b for b, _, _ in _requests(w, 200, tmp_path)]
    streaks = [len(list(g)) for b, g in itertools.groupby(buckets) if b == "long_answer"]
    assert len(streaks) > 5
    assert all(n % 3 == 0 for n in streaks[:-1])  # the last one may be cut off by the end of the sample


def test_unknown_bucket_in_buckets_is_a_clear_error() -> None:
    with pytest.raises(WorkloadError, match=r"unknown buckets in buckets: \['essay'\]"):
        _workload({"essay": {"run": 2}})


def test_replay_runs_ignore_eos_requests_to_max_tokens(tmp_path: Path) -> None:
    w = text_stream(
        output_tokens=4000, warmup={"duration": 0.0}, buckets={"long_answer": {**LONG, "at": 0, "run": 4}}
    )
    sends = arrivals(w, load_profile("default"), MediaCache(tmp_path, w.seed))
    long = [a.req for a in sends if a.bucket == "long_answer"]
    assert [(r.max_new_tokens, r.output_len) for r in long] == [(1900, 1900)] * 4
    assert all(a.req.output_len < 4000 for a in sends if a.bucket == "text")  # natural stop before max_tokens


def test_scheduled_image_bucket_needs_its_images_configured() -> None:
    with pytest.raises(WorkloadError, match=r"sends single_image but images.single_image is not configured"):
        load_workload(None, {"mix": {"text": 1}, "images": {}, "buckets": {"single_image": {"at": 5}}})


def test_every_without_at_is_a_clear_error() -> None:
    with pytest.raises(WorkloadError, match="every needs at"):
        _workload({"long_answer": {"every": 10}})
