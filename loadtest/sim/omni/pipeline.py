"""A staged model of sglang-omni's Qwen3-Omni speech pipeline, pure and steppable on a virtual clock.

Stages and what bounds them (the README has the sources):
- preprocessing (CPU): a delay per request, no queue (each request is its own task);
- image_encoder / audio_encoder: FIFO, up to 32 requests per forward; skipped by requests without that media;
- mm_aggregate: joins the encoders' outputs, free;
- thinker: the plain simulator's continuous-batching `Engine` (cap 16, later 64; chunked prefill 128);
- decode (CPU, terminal): free; completes with the thinker;
- talker_ar + code_predictor: one `Engine` whose decode step is one codec frame for every running request; it
  starts when the thinker has its first token (the thinker streams hidden states to it) and holds its slot
  until its codec EOS; every frame also pays one serialized code-predictor pass (in the cost model);
- code2wav (terminal): one window of 10 new frames (+25 of left context) at a time, FIFO across requests;
  each window is one audio chunk of 0.8 s.
A request ends when every terminal stage has finished with it: decode alone when the audio stages do not run
for it, decode and code2wav otherwise. `step()` runs the earliest pending action (a preprocessing timer or a
stage's next forward) and returns its events, stamped with the virtual time they happen.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from loadtest.sim.engine import Engine, EngineConfig, SimRequest
from loadtest.sim.omni.profile import ARStage as ARStageSpec
from loadtest.sim.omni.profile import OmniProfile, Release
from loadtest.sim.omni.prompt import OmniPrompt
from loadtest.sim.omni.stages import ARStage, BatchStage, BatchStep, Work
from loadtest.sim.profile import OutputModel

PREPROCESSING, IMAGE_ENCODER, AUDIO_ENCODER = "preprocessing", "image_encoder", "audio_encoder"
AGGREGATE, THINKER, DECODE = "mm_aggregate", "thinker", "decode"
TALKER, CODE_PREDICTOR, CODE2WAV = "talker_ar", "code_predictor", "code2wav"
TEXT_STAGES = (PREPROCESSING, IMAGE_ENCODER, AUDIO_ENCODER, AGGREGATE, THINKER, DECODE)
SPEECH_STAGES = (*TEXT_STAGES, TALKER, CODE_PREDICTOR, CODE2WAV)
RECENT_LIMIT = 10_000

EventKind = Literal["text", "audio", "done", "failed"]


class SubmitRefused(Exception):
    """The coordinator refuses a request before it enters the pipeline (duplicate id, full queue)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class Event:
    """What a request's client may see: a thinker token (value = tokens so far), an audio chunk (value =
    samples), the end, or a failure."""

    time: float
    rid: str
    kind: EventKind
    value: int = 0
    message: str = ""


@dataclass(frozen=True, slots=True)
class StepRecord:
    stage: str
    start: float
    end: float
    rids: tuple[str, ...]
    events: list[Event]


def answer_tokens(rng: random.Random, output: OutputModel) -> int:
    """Natural answer length in text tokens, before any cap."""
    return max(output.min_tokens, round(rng.lognormvariate(math.log(output.median_tokens), output.sigma)))


@dataclass(eq=False)
class Job:
    """One request through the pipeline: the caller fills the fields above `arrival`, the pipeline
    the rest."""

    rid: str
    kind: Literal["chat", "speech"]
    prompt: OmniPrompt
    max_new_tokens: int
    text_tokens: int  # answer tokens before the natural stop (drawn by the caller)
    audio_out: bool  # the client asked for audio (decides only what the HTTP layer delivers)
    preprocess_s: float = 0.0
    fail_message: str | None = None  # preprocessing fails the request with this message
    arrival: float = 0.0
    talker: bool = False  # set at submit: the audio stages run for this request
    frames: int = 0
    frames_made: int = 0
    frames_queued: int = 0
    windows_pending: int = 0
    encoders_left: int = 0
    thinker_tokens: int = 0
    talker_tokens: int = 0
    audio_samples: int = 0
    first_text_at: float | None = None
    first_audio_at: float | None = None
    thinker_done_at: float | None = None
    talker_done: bool = False
    code2wav_done_at: float | None = None
    finished_at: float | None = None
    status: Literal["running", "finished", "failed", "aborted"] = "running"
    error: str | None = None

    @property
    def output_len(self) -> int:
        """Thinker tokens it generates: the answer plus <|im_end|>, unless max_new_tokens cuts it first."""
        return min(self.text_tokens + 1, self.max_new_tokens)

    @property
    def text_generated(self) -> int:
        """Tokens so far that carry text (the final <|im_end|> does not)."""
        return min(self.thinker_tokens, self.text_tokens)


@dataclass
class Totals:
    submitted: int = 0
    finished: int = 0
    failed: int = 0
    aborted: int = 0
    thinker_tokens: int = 0
    talker_tokens: int = 0
    audio_seconds: float = 0.0


class OmniPipeline:
    def __init__(
        self,
        profile: OmniProfile,
        release: Release,
        speech: bool = True,
        text_only_skips_audio_stages: bool = False,
        thinker_cap: int | None = None,
        talker_cap: int | None = None,
        queue_limit: int | None = None,
        start: float = 0.0,
    ) -> None:
        costs = profile.stages(release)
        self.profile = profile
        self.release = release
        self.speech = speech
        self.text_only_skips_audio_stages = text_only_skips_audio_stages
        self.stage_names = SPEECH_STAGES if speech else TEXT_STAGES
        self.thinker = ARStage(THINKER, _engine(costs.thinker, thinker_cap, start))
        self.talker = ARStage(TALKER, _engine(costs.talker, talker_cap, start)) if speech else None
        self.image_encoder = BatchStage(
            IMAGE_ENCODER, costs.image_encoder.batch_time, costs.image_encoder.max_batch, start
        )
        self.audio_encoder = BatchStage(
            AUDIO_ENCODER, costs.audio_encoder.batch_time, costs.audio_encoder.max_batch, start
        )
        self.code2wav = BatchStage(CODE2WAV, lambda sizes: costs.code2wav.window_time(sum(sizes)), 1, start)
        self.queue_limit = queue_limit
        self.jobs: dict[str, Job] = {}
        self.totals = Totals()
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_LIMIT)
        self.now = start
        self._timers: list[tuple[float, int, str]] = []
        self._seq = itertools.count()

    # -- requests in and out -------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Enter the pipeline at `job.arrival`; raises SubmitRefused like the coordinator's submit."""
        if job.rid in self.jobs:
            raise SubmitRefused(f"Request {job.rid} already exists", 409)
        if self.queue_limit is not None and len(self.jobs) >= self.queue_limit:
            raise SubmitRefused("The request queue is full.", 503)
        job.talker = self.speech and (job.audio_out or not self.text_only_skips_audio_stages)
        self.jobs[job.rid] = job
        self.totals.submitted += 1
        heapq.heappush(self._timers, (job.arrival + job.preprocess_s, next(self._seq), job.rid))

    def abort(self, rid: str, t: float) -> bool:
        """Drop a request from every stage (a later server's abort on client disconnect)."""
        job = self.jobs.get(rid)
        if job is None:
            return False
        for ar in self._ar_stages():
            if ar.engine.abort(rid) is not None:
                ar.touched()
        for batch in (self.image_encoder, self.audio_encoder, self.code2wav):
            batch.drop(rid)
        self._end(job, "aborted", t)
        return True

    # -- stepping ------------------------------------------------------------------------------------------
    def next_time(self) -> float | None:
        times = [t for t in (s.next_start() for s in self._stages()) if t is not None]
        if self._timers:
            times.append(self._timers[0][0])
        return min(times, default=None)

    def step(self) -> StepRecord | None:
        """Run the earliest pending action; None when nothing is pending."""
        best: tuple[float, int] | None = None
        for i, stage in enumerate(self._stages()):
            t = stage.next_start()
            if t is not None and (best is None or t < best[0]):
                best = (t, i)
        if self._timers and (best is None or self._timers[0][0] <= best[0]):
            return self._fire_timer()
        if best is None:
            return None
        stage = self._stages()[best[1]]
        self.now = max(self.now, best[0])
        if isinstance(stage, ARStage):
            return self._step_ar(stage)
        return self._step_batch(stage)

    def run_until(self, t: float) -> list[StepRecord]:
        """Every action that starts no later than t (tests and replays)."""
        records: list[StepRecord] = []
        while (nxt := self.next_time()) is not None and nxt <= t:
            record = self.step()
            if record is not None:
                records.append(record)
        self.now = max(self.now, t)
        return records

    # -- stage handlers --------------------------------------------------------------------------------------
    def _fire_timer(self) -> StepRecord:
        t, _, rid = heapq.heappop(self._timers)
        self.now = max(self.now, t)
        events: list[Event] = []
        job = self.jobs.get(rid)
        if job is not None:
            if job.fail_message is not None:
                events.append(self._end(job, "failed", t, job.fail_message))
            else:
                self._route_encoders(job, t)
        return StepRecord(PREPROCESSING, t, t, (rid,), events)

    def _route_encoders(self, job: Job, t: float) -> None:
        for stage, items in (
            (self.image_encoder, job.prompt.image_items),
            (self.audio_encoder, job.prompt.audio_items),
        ):
            if items:
                stage.submit(Work(job.rid, tuple(items), t))
                job.encoders_left += 1
        if not job.encoders_left:
            self._start_thinker(job, t)

    def _start_thinker(self, job: Job, t: float) -> None:
        req = SimRequest(job.rid, job.prompt.total, job.max_new_tokens, job.output_len, arrival=t)
        self.thinker.engine.submit(req)
        self.thinker.touched()

    def _start_talker(self, job: Job, t: float) -> None:
        """The talker starts on the thinker's first streamed hidden state; its prompt is the thinker's."""
        sp = self.profile.speech
        spoken = min(job.text_tokens, job.output_len)  # max_new_tokens may cut the answer short
        job.frames = min(math.ceil(spoken * sp.frames_per_text_token), sp.talker_max_new_tokens)
        length = min(job.frames + 1, sp.talker_max_new_tokens)  # + the codec EOS frame
        prompt = job.prompt.total + sp.talker_prompt_extra_tokens
        # encoder_tokens=1: the code predictor's pass over the first frame, charged at admission
        req = SimRequest(job.rid, prompt, sp.talker_max_new_tokens, length, encoder_tokens=1, arrival=t)
        assert self.talker is not None
        self.talker.engine.submit(req)
        self.talker.touched()

    def _step_batch(self, stage: BatchStage) -> StepRecord:
        step = stage.run()
        events: list[Event] = []
        for work in step.items:
            job = self.jobs.get(work.rid)
            if job is None:
                continue
            if stage is self.code2wav:
                self._vocoded(job, work, step, events)
            else:
                job.encoders_left -= 1
                if not job.encoders_left:
                    self._start_thinker(job, step.end)  # mm_aggregate joins the encoders at no cost
        return StepRecord(stage.name, step.start, step.end, tuple(w.rid for w in step.items), events)

    def _vocoded(self, job: Job, work: Work, step: BatchStep, events: list[Event]) -> None:
        job.windows_pending -= 1
        samples = work.new_frames * self.profile.speech.samples_per_frame
        job.audio_samples += samples
        if job.first_audio_at is None:
            job.first_audio_at = step.end
        events.append(Event(step.end, job.rid, "audio", samples))
        if job.talker_done and not job.windows_pending:
            job.code2wav_done_at = step.end
            self._maybe_finish(job, step.end, events)

    def _step_ar(self, stage: ARStage) -> StepRecord:
        result = stage.run()
        if result is None:
            return StepRecord(stage.name, self.now, self.now, (), [])
        events: list[Event] = []
        thinker = stage is self.thinker
        for req in result.emitted:
            job = self.jobs.get(req.rid)
            if job is None:
                continue
            if thinker:
                self._thought(job, req, result.end, events)
            else:
                self._talked(job, req, result.end)
        for req in result.finished:
            job = self.jobs.get(req.rid)
            if job is None:
                continue
            if thinker:
                job.thinker_done_at = result.end  # decode, the text terminal, completes with it
            else:
                self._talker_done(job, result.end)
            self._maybe_finish(job, result.end, events)
        for req in result.failed:
            job = self.jobs.get(req.rid)
            if job is not None:
                events.append(
                    self._end(job, "failed", result.end, req.error.message if req.error else "failed")
                )
        rids = tuple(r.rid for r in (*result.emitted, *result.failed))
        return StepRecord(stage.name, result.start, result.end, rids, events)

    def _thought(self, job: Job, req: SimRequest, t: float, events: list[Event]) -> None:
        first = job.thinker_tokens == 0
        job.thinker_tokens = req.generated
        if job.first_text_at is None and job.text_generated > 0:
            job.first_text_at = t
        if first and job.talker:
            self._start_talker(job, t)
        events.append(Event(t, job.rid, "text", req.generated))

    def _talked(self, job: Job, req: SimRequest, t: float) -> None:
        job.talker_tokens = req.generated
        job.frames_made = min(req.generated, job.frames)
        chunk = self.profile.speech.chunk_frames
        while job.frames_made - job.frames_queued >= chunk:
            self._queue_window(job, chunk, t)

    def _talker_done(self, job: Job, t: float) -> None:
        job.talker_done = True
        rest = job.frames_made - job.frames_queued
        if rest > 0:
            self._queue_window(job, rest, t)
        elif not job.windows_pending:
            job.code2wav_done_at = t

    def _queue_window(self, job: Job, frames: int, t: float) -> None:
        context = min(self.profile.speech.left_context_frames, job.frames_queued)
        self.code2wav.submit(Work(job.rid, (frames + context,), t, new_frames=frames))
        job.frames_queued += frames
        job.windows_pending += 1

    def _maybe_finish(self, job: Job, t: float, events: list[Event]) -> None:
        if job.status != "running" or job.thinker_done_at is None:
            return
        if job.talker and job.code2wav_done_at is None:
            return
        events.append(self._end(job, "finished", t))

    def _end(
        self, job: Job, status: Literal["finished", "failed", "aborted"], t: float, error: str = ""
    ) -> Event:
        job.status = status
        job.finished_at = t
        job.error = error or None
        self.jobs.pop(job.rid, None)
        totals = self.totals
        totals.thinker_tokens += job.thinker_tokens
        totals.talker_tokens += job.talker_tokens
        totals.audio_seconds += job.audio_samples / self.profile.speech.sample_rate
        if status == "finished":
            totals.finished += 1
        elif status == "failed":
            totals.failed += 1
        else:
            totals.aborted += 1
        self.recent.append(self.record(job))
        return Event(t, job.rid, "done" if status == "finished" else "failed", message=error)

    # -- accounting ------------------------------------------------------------------------------------------
    def record(self, job: Job) -> dict[str, Any]:
        def since(t: float | None) -> float | None:
            return None if t is None else round(t - job.arrival, 6)

        return {
            "rid": job.rid,
            "kind": job.kind,
            "status": job.status,
            "arrival": round(job.arrival, 6),
            "prompt_tokens": job.prompt.total,
            "thinker_tokens": job.thinker_tokens,
            "talker_tokens": job.talker_tokens,
            "audio_seconds": round(job.audio_samples / self.profile.speech.sample_rate, 6),
            "audio_stages": job.talker,
            "audio_delivered": job.audio_out and job.talker,
            "first_text_s": since(job.first_text_at),
            "first_audio_s": since(job.first_audio_at),
            "e2e_s": since(job.finished_at),
            "error": job.error,
        }

    def stage_state(self) -> dict[str, dict[str, Any]]:
        """Per-stage load right now: what the real server keeps to itself."""
        state: dict[str, dict[str, Any]] = {}
        for ar in self._ar_stages():
            e = ar.engine
            state[ar.name] = {
                "running": e.num_running,
                "waiting": len(e.waiting),
                "max_running_requests": e.config.max_running_requests,
                "kv_used_tokens": e.used_tokens,
                "kv_total_tokens": e.config.max_total_tokens,
                "busy_s": round(ar.busy_s, 6),
            }
        for batch in (self.image_encoder, self.audio_encoder, self.code2wav):
            state[batch.name] = {
                "queued": len(batch.queue),
                "in_flight": batch.in_flight_at(self.now),
                "max_batch": batch.max_batch,
                "busy_s": round(batch.busy_s, 6),
            }
        return state

    # -- helpers ---------------------------------------------------------------------------------------------
    def _ar_stages(self) -> list[ARStage]:
        return [self.thinker] if self.talker is None else [self.thinker, self.talker]

    def _stages(self) -> list[ARStage | BatchStage]:
        """Tie order at equal start times: encoders, thinker, talker, vocoder (upstream first)."""
        return [self.image_encoder, self.audio_encoder, *self._ar_stages(), self.code2wav]


def _engine(spec: ARStageSpec, cap: int | None, start: float) -> Engine:
    d = spec.engine
    config = EngineConfig(
        max_total_tokens=d.max_total_tokens,
        max_running_requests=cap or d.max_running_requests,
        max_prefill_tokens=d.max_prefill_tokens,
        chunked_prefill_size=d.chunked_prefill_size,
    )
    return Engine(config, spec.costs, start)
