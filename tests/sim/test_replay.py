"""Workload replay into the engine: the harness's requests and records, warm-up excluded, no HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.media import MediaCache
from loadtest.sim.engine import EngineConfig
from loadtest.sim.profile import load_profile
from loadtest.sim.replay import arrivals, point
from tests.support.workloads import text_stream


def test_replay_measures_only_the_measured_phase_and_counts_queue_full_as_rejections(tmp_path: Path) -> None:
    w = text_stream(output_tokens=50, warmup={"duration": 1.0, "rate": 2.0}, drain=60.0)
    profile = load_profile("default")
    sends = arrivals(w, profile, MediaCache(tmp_path, w.seed))
    measured = [a for a in sends if a.phase == "measured"]
    assert sends[: len(sends) - 8] == [a for a in sends if a.phase == "warmup"]  # warm-up sends first
    assert [a.t for a in measured[:2]] == [1.125, 1.375]  # constant gaps, after the 1 s warm-up
    roomy = point(w, profile, EngineConfig(max_total_tokens=100_000, max_running_requests=8), sends)
    assert roomy["summary"]["requests"] == 8 and roomy["summary"]["completed"] == 8
    assert roomy["summary"]["total_output_tokens"] == sum(a.req.generated for a in measured)
    tight = EngineConfig(max_total_tokens=100_000, max_running_requests=1, max_queued_requests=1)
    res = point(w, profile, tight, sends)
    s = res["summary"]
    assert s["rejected"] > 0 and s["completed"] + s["rejected"] == 8 and s["errors"] == 0
    assert res["backend"]["queued"]["peak"] == 1 and res["oom"]["detected"] is False


def test_replay_outer_cap_holds_arrivals_and_sheds_what_it_still_holds_when_the_load_stops(
    tmp_path: Path,
) -> None:
    w = text_stream(output_tokens=50, warmup={"duration": 0.0}, drain=60.0)
    profile = load_profile("default")
    sends = arrivals(w, profile, MediaCache(tmp_path, w.seed))
    config = EngineConfig(max_total_tokens=100_000, max_running_requests=8)
    res = point(w, profile, config, sends, max_in_flight=1)
    s = res["summary"]
    assert res["backend"]["running"]["peak"] == 1
    assert res["backend"]["queued"]["peak"] == 0  # the engine never sees more than the cap
    # one at a time, ~0.5 s each, 8 arrivals over the 2 s window: four go out before it closes, the
    # fourth finishes in the drain, the other four are shed at the window's end (2.0 s)
    assert (s["completed"], s["rejected"], s["error_codes"]) == (4, 4, {"outer_queue_timeout": 4})
    measured = [a for a in sends if a.phase == "measured"]
    assert measured[3].req.finished_at is not None and measured[3].req.finished_at > 2.0
    assert s["outer_wait_ms"]["max"] == pytest.approx((2.0 - measured[4].t) * 1000)
    assert res["backend"]["engine_ttft_ms"]["p99"] > 0
    short = w.model_copy(update={"drain": 0.1})  # the last released one cannot finish in 0.1 s
    s = point(short, profile, config, sends, max_in_flight=1)["summary"]
    assert (s["completed"], s["rejected"], s["error_codes"]) == (
        3,
        4,
        {"outer_queue_timeout": 4, "unfinished": 1},
    )
