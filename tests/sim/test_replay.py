"""Workload replay into the engine: the harness's requests and records, warm-up excluded, no HTTP."""

from __future__ import annotations

from pathlib import Path

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


def test_replay_outer_cap_holds_arrivals_in_the_client_and_sheds_what_the_drain_never_released(
    tmp_path: Path,
) -> None:
    w = text_stream(output_tokens=50, warmup={"duration": 0.0}, drain=60.0)
    profile = load_profile("default")
    sends = arrivals(w, profile, MediaCache(tmp_path, w.seed))
    config = EngineConfig(max_total_tokens=100_000, max_running_requests=8)
    res = point(w, profile, config, sends, max_in_flight=1)
    s = res["summary"]
    assert s["completed"] == 8 and res["backend"]["running"]["peak"] == 1
    assert res["backend"]["queued"]["peak"] == 0  # the engine never sees more than the cap
    assert s["outer_wait_ms"]["max"] > 0 and res["backend"]["engine_ttft_ms"]["p99"] > 0
    short = w.model_copy(update={"drain": 0.5})
    s = point(short, profile, config, sends, max_in_flight=1)["summary"]
    assert s["error_codes"].get("outer_queue_timeout", 0) == s["rejected"] > 0
