"""The staged omni pipeline model stepped directly on its virtual clock (no HTTP, no wall time)."""

from __future__ import annotations

import itertools
import math

import pytest

from loadtest.sim.engine import SimRequest
from loadtest.sim.omni.capacity import Stream, run_point
from loadtest.sim.omni.pipeline import (
    CODE2WAV,
    IMAGE_ENCODER,
    TALKER,
    THINKER,
    Job,
    OmniPipeline,
    StepRecord,
    SubmitRefused,
)
from loadtest.sim.omni.profile import OmniProfile, load_omni_profile
from loadtest.sim.omni.prompt import OmniPrompt
from loadtest.sim.profile import PrefillChunk

PROFILE = load_omni_profile("qwen3-omni")


def job(
    rid: str,
    text: int = 20,
    prompt: int = 100,
    audio_out: bool = True,
    max_new: int = 2048,
    fail: str | None = None,
) -> Job:
    j = Job(rid, "chat", OmniPrompt(text=prompt), max_new, text, audio_out, preprocess_s=0.004)
    j.fail_message = fail
    return j


def run(pipeline: OmniPipeline) -> list[StepRecord]:
    """Every step until the pipeline is idle."""
    records = []
    while (record := pipeline.step()) is not None:
        records.append(record)
    return records


def frames(text_tokens: int, profile: OmniProfile = PROFILE) -> int:
    return math.ceil(text_tokens * profile.speech.frames_per_text_token)


def test_profile_loads_both_releases_with_the_servers_default_caps() -> None:
    snap, later = PROFILE.stages("snapshot"), PROFILE.stages("later")
    assert (snap.thinker.engine.max_running_requests, snap.talker.engine.max_running_requests) == (16, 16)
    assert (later.thinker.engine.max_running_requests, later.talker.engine.max_running_requests) == (64, 32)
    assert snap.thinker.engine.chunked_prefill_size == 128 and snap.talker.engine.chunked_prefill_size == 0
    assert snap.image_encoder.max_batch == snap.audio_encoder.max_batch == 32


def test_one_request_timeline_is_the_sum_of_its_stage_costs() -> None:
    """Thinker: preprocessing, then 128-token prefill chunks; the talker starts on the first token and pays
    its prefill plus one code-predictor pass; every frame after that is one talker decode step."""
    p = OmniPipeline(PROFILE, "snapshot")
    p.submit(job("a", text=3, prompt=300))
    records = run(p)
    record = p.recent[-1]
    thinker = PROFILE.stages("snapshot").thinker.costs
    talker = PROFILE.stages("snapshot").talker.costs
    prefill = sum(
        thinker.prefill_time([PrefillChunk(prefix, n)]) for prefix, n in ((0, 128), (128, 128), (256, 44))
    )
    assert record["first_text_s"] == pytest.approx(0.004 + prefill, abs=1e-6)
    t_first = 0.004 + prefill
    talker_prompt = 300 + PROFILE.speech.talker_prompt_extra_tokens
    talker_prefill = talker.prefill_time([PrefillChunk(0, talker_prompt, 1)])
    steps = [r for r in records if r.stage == TALKER]
    assert steps[0].start == pytest.approx(t_first)
    assert steps[0].end == pytest.approx(t_first + talker_prefill)
    n = frames(3)  # 12 frames + the codec EOS: one prefill step and 12 decode steps
    assert [r.stage for r in records].count(TALKER) == n + 1
    assert record["talker_tokens"] == n + 1 and record["thinker_tokens"] == 3 + 1
    assert record["audio_seconds"] == pytest.approx(n * 1920 / 24000)


def test_audio_is_vocoded_in_windows_of_ten_frames_one_at_a_time() -> None:
    p = OmniPipeline(PROFILE, "snapshot")
    for i in range(6):
        p.submit(job(f"r{i}", text=7 + i))
    records = run(p)
    vocoder = [r for r in records if r.stage == CODE2WAV]
    assert all(len(r.rids) == 1 for r in vocoder)
    spans = sorted((r.start, r.end) for r in vocoder)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    for i in range(6):
        n = frames(7 + i)
        chunks = [e.value for r in vocoder for e in r.events if e.rid == f"r{i}" and e.kind == "audio"]
        expected = [10] * (n // 10) + ([n % 10] if n % 10 else [])
        assert chunks == [k * 1920 for k in expected]
    assert p.totals.audio_seconds == pytest.approx(sum(frames(7 + i) for i in range(6)) * 0.08)


@pytest.mark.parametrize(("release", "thinker_cap", "talker_cap"), [("snapshot", 16, 16), ("later", 64, 32)])
def test_stage_caps_hold_and_are_reached(release: str, thinker_cap: int, talker_cap: int) -> None:
    p = OmniPipeline(PROFILE, release, text_only_skips_audio_stages=release == "later")  # type: ignore[arg-type]
    for i in range(80):  # short max_tokens: the KV reservation must not be what limits the thinker
        p.submit(job(f"r{i}", text=60, prompt=200, max_new=64))
    peaks = {THINKER: 0, TALKER: 0}
    while p.step() is not None:
        peaks[THINKER] = max(peaks[THINKER], p.thinker.engine.num_running)
        assert p.talker is not None
        peaks[TALKER] = max(peaks[TALKER], p.talker.engine.num_running)
    assert peaks == {THINKER: thinker_cap, TALKER: talker_cap}
    assert p.totals.finished == 80 and not p.jobs


def test_configured_caps_override_the_release_defaults() -> None:
    p = OmniPipeline(PROFILE, "snapshot", thinker_cap=3, talker_cap=2)
    for i in range(10):
        p.submit(job(f"r{i}", text=10))
    peak_talker = 0
    while p.step() is not None:
        assert p.thinker.engine.num_running <= 3
        assert p.talker is not None
        peak_talker = max(peak_talker, p.talker.engine.num_running)
    assert peak_talker == 2


def test_snapshot_runs_text_only_requests_through_the_talker() -> None:
    """thinker_next_speech fans every request out to the talker: the audio is made, then dropped by HTTP."""
    p = OmniPipeline(PROFILE, "snapshot")
    p.submit(job("text", text=10, audio_out=False))
    records = run(p)
    assert any("text" in r.rids for r in records if r.stage == TALKER)
    record = p.recent[-1]
    assert record["audio_stages"] and not record["audio_delivered"]
    assert record["audio_seconds"] == pytest.approx(frames(10) * 0.08)
    assert record["e2e_s"] > record["first_audio_s"] > record["first_text_s"]


def test_later_text_only_requests_never_hold_the_talker() -> None:
    p = OmniPipeline(PROFILE, "later", text_only_skips_audio_stages=True)
    p.submit(job("speech", text=30, audio_out=True))
    p.submit(job("text", text=30, audio_out=False))
    records = run(p)
    assert {rid for r in records if r.stage in (TALKER, CODE2WAV) for rid in r.rids} == {"speech"}
    text = next(r for r in p.recent if r["rid"] == "text")
    assert (text["talker_tokens"], text["audio_seconds"], text["first_audio_s"]) == (0, 0.0, None)
    thinker_end = max(r.end for r in records if r.stage == THINKER and "text" in r.rids)
    assert text["e2e_s"] == pytest.approx(thinker_end)


def test_text_only_pipeline_has_six_stages_and_no_audio() -> None:
    p = OmniPipeline(PROFILE, "snapshot", speech=False)
    p.submit(job("a", text=5, audio_out=True))
    run(p)
    assert p.stage_names[-1] == "decode" and len(p.stage_names) == 6 and p.talker is None
    assert p.recent[-1]["audio_seconds"] == 0.0 and p.recent[-1]["talker_tokens"] == 0


def test_image_encoder_batches_up_to_32_requests() -> None:
    p = OmniPipeline(PROFILE, "snapshot")
    for i in range(40):
        p.submit(Job(f"r{i}", "chat", OmniPrompt(text=20, image_items=[256]), 64, 5, False, 0.004))
    records = run(p)
    batches = [len(r.rids) for r in records if r.stage == IMAGE_ENCODER]
    assert batches == [32, 8]
    cost = PROFILE.stages("snapshot").image_encoder
    first = next(r for r in records if r.stage == IMAGE_ENCODER)
    assert first.end - first.start == pytest.approx(cost.batch_time([256] * 32))


def test_a_request_that_fails_preprocessing_ends_after_the_delay() -> None:
    p = OmniPipeline(PROFILE, "snapshot")
    p.submit(job("bad", fail="Failed to load image: broken"))
    records = run(p)
    assert len(records) == 1 and records[0].events[0].kind == "failed"
    assert records[0].events[0].time == pytest.approx(0.004)
    assert p.totals.failed == 1 and not p.jobs and p.recent[-1]["error"] == "Failed to load image: broken"


def test_abort_removes_the_request_from_every_stage() -> None:
    p = OmniPipeline(PROFILE, "later", text_only_skips_audio_stages=True)
    p.submit(job("a", text=100))
    p.submit(job("b", text=100))
    while p.talker is not None and p.talker.engine.num_running < 2:
        p.step()
    assert p.abort("a", p.now) and not p.abort("a", p.now)
    run(p)
    assert p.talker is not None
    engines = (p.thinker.engine, p.talker.engine)
    assert all(not e.running and not e.waiting for e in engines)
    assert (p.totals.finished, p.totals.aborted) == (1, 1)
    assert [r["status"] for r in p.recent] == ["aborted", "finished"]


def test_submit_refuses_duplicates_and_a_full_queue() -> None:
    p = OmniPipeline(PROFILE, "later", queue_limit=2)
    p.submit(job("a"))
    with pytest.raises(SubmitRefused) as dup:
        p.submit(job("a"))
    assert (dup.value.status, dup.value.message) == (409, "Request a already exists")
    p.submit(job("b"))
    with pytest.raises(SubmitRefused) as full:
        p.submit(job("c"))
    assert (full.value.status, full.value.message) == (503, "The request queue is full.")
    run(p)
    p.submit(job("c"))  # room again once the first two have finished


def test_thinker_and_talker_tokens_are_counted_apart() -> None:
    """usage.completion_tokens is the thinker's (answer + <|im_end|>); the talker's frames are separate."""
    p = OmniPipeline(PROFILE, "snapshot")
    capped = Job("capped", "chat", OmniPrompt(text=50), 8, 100, True, 0.004)
    p.submit(capped)
    p.submit(job("natural", text=12))
    run(p)
    by_rid = {r["rid"]: r for r in p.recent}
    assert by_rid["capped"]["thinker_tokens"] == 8  # cut by max_new_tokens: no <|im_end|>
    assert by_rid["capped"]["talker_tokens"] == frames(8) + 1
    assert by_rid["natural"]["thinker_tokens"] == 13 and by_rid["natural"]["talker_tokens"] == frames(12) + 1
    assert p.totals.thinker_tokens == 21 and p.totals.talker_tokens == frames(8) + frames(12) + 2


def test_talker_is_admitted_like_any_engine_request() -> None:
    """The talker reuses the plain engine: its request carries the thinker prompt and one predictor pass."""
    p = OmniPipeline(PROFILE, "snapshot")
    p.submit(job("a", text=4, prompt=77))
    while p.talker is not None and not p.talker.engine.waiting and not p.talker.engine.running:
        p.step()
    assert p.talker is not None
    req: SimRequest = (p.talker.engine.waiting or p.talker.engine.running)[0]
    extra = PROFILE.speech.talker_prompt_extra_tokens
    assert (req.prompt_tokens, req.output_len, req.encoder_tokens) == (77 + extra, frames(4) + 1, 1)


def test_a_stream_stalls_when_a_chunk_comes_after_the_audio_before_it_ran_out() -> None:
    steady = Stream(0.0, [(1.0, 0.8), (1.7, 0.8), (2.6, 0.8)])  # due by 1.8 and 2.6
    assert not steady.stalls()
    assert Stream(0.0, [(1.0, 0.8), (1.7, 0.8), (2.7, 0.8)]).stalls()
    assert not Stream(0.0, []).stalls()


def test_capacity_sweep_counts_what_the_pipeline_made() -> None:
    point = run_point(PROFILE, "later", 2, duration=120.0, warmup=20.0, text_share=0.0, seed=1)
    assert point.requests == len(point.rtf) > 0 and point.stalled == 0.0
    assert all(r < 1 for r in point.rtf) and all(t > 0 for t in point.ttfa)
