"""From a validated chat or speech request to a pipeline job and back to sglang-omni's HTTP answers.

Failure shapes follow `serve/openai_api.py`: a whole answer's failure is `{"detail": message}` with 500 (the
later release: 400 for a bad request, 409 for a duplicate id, 503 for a full queue); a streamed answer has
already sent its 200 headers when the pipeline fails, so the connection is cut with no error event and no
`[DONE]`. Whether a client disconnect aborts the job depends on the release (see release.py).
"""

from __future__ import annotations

import base64
import contextlib
import random
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import Response, StreamingResponse

from loadtest.sim.faults import FaultInjector
from loadtest.sim.omni import audio
from loadtest.sim.omni.pipeline import Event, Job, SubmitRefused, answer_tokens
from loadtest.sim.omni.profile import OmniProfile
from loadtest.sim.omni.prompt import OmniCounter, OmniInputError, OmniPrompt
from loadtest.sim.omni.protocol import SAMPLING_PARAM_FIELDS, ChatCompletionRequest, CreateSpeechRequest
from loadtest.sim.omni.release import DEFAULT_MAX_NEW_TOKENS, Behaviour
from loadtest.sim.omni.responses import (
    SSE_DONE,
    ChatChunks,
    SpeechChunks,
    detail_response,
    json_response,
    usage,
)
from loadtest.sim.omni.runner import JobHandle, PipelineRunner
from loadtest.sim.responses import output_text

SPEECH_PREPROCESS_ERROR = "Preprocessing expects a list of chat messages"
NO_AUDIO_ERROR = "No audio output generated from the pipeline."


class StreamCut(Exception):
    """Raised inside a streamed body: the server closes the connection mid-response."""


@dataclass
class Failure:
    message: str
    bad_request: bool


class Generator:
    def __init__(
        self,
        profile: OmniProfile,
        behaviour: Behaviour,
        runner: PipelineRunner,
        faults: FaultInjector,
        model: str,
        speech_route: Literal["serve", "reject"],
        seed: int,
    ) -> None:
        self.profile = profile
        self.behaviour = behaviour
        self.runner = runner
        self.faults = faults
        self.model = model
        self.speech_route = speech_route
        self.counter = OmniCounter(profile, behaviour.content_parts)
        self.rng = random.Random(seed)

    # -- building jobs --------------------------------------------------------------------------------
    def _job(
        self,
        rid: str,
        kind: Literal["chat", "speech"],
        count: OmniPrompt | Failure,
        max_new: int | None,
        text: int,
        audio_out: bool,
    ) -> tuple[Job, Failure | None]:
        """The job, and the failure its preprocessing will hit (the real server fails inside the pipeline)."""
        failure = count if isinstance(count, Failure) else None
        prompt = count if isinstance(count, OmniPrompt) else OmniPrompt()
        if failure is None and max_new is not None and max_new < 0:
            failure = Failure(f"max_new_tokens must be at least 0, got {max_new}.", True)
        ctx = self.profile.context_length
        if failure is None and prompt.total >= ctx:
            failure = Failure(
                f"The input ({prompt.total} tokens) is longer than the model's context length "
                f"({ctx} tokens).",
                True,
            )
        budget = DEFAULT_MAX_NEW_TOKENS if max_new is None else max(max_new, 1)
        if failure is None and prompt.total + budget >= ctx:
            if self.behaviour.rejects_long_completion:
                failure = Failure(
                    "Requested token count exceeds the model's maximum context length of "
                    f"{ctx} tokens. You requested a total of {prompt.total + budget} tokens: "
                    f"{prompt.total} tokens from the input messages and {budget} tokens for the completion. "
                    "Please reduce the number of tokens in the input messages or the completion to fit "
                    "within the limit.",
                    True,
                )
            budget = ctx - prompt.total - 1  # the snapshot's scheduler clamps to the room left
        p = self.profile.preprocessing
        preprocess = (
            p.base_s
            + p.per_image_s * len(prompt.image_items)
            + p.per_audio_clip_s * len(prompt.audio_items)
            + p.per_audio_second_s * prompt.audio_seconds
        )
        job = Job(rid, kind, prompt, max(budget, 1), text, audio_out, preprocess)
        job.fail_message = failure.message if failure else None
        return job, failure

    def _count_chat(self, req: ChatCompletionRequest) -> OmniPrompt | Failure:
        try:
            messages = [(m.role, m.content) for m in req.messages]
            return self.counter.chat(messages, req.images, req.audios, req.videos)
        except OmniInputError as exc:
            return Failure(exc.message, exc.bad_request)

    def _status(self, failure: Failure | None, refused: SubmitRefused | None = None) -> int:
        if not self.behaviour.error_statuses:
            return 500
        if refused is not None:
            return refused.status
        return 400 if failure is not None and failure.bad_request else 500

    async def _prelude(self) -> Response | None:
        """Injected faults that answer before the request reaches the pipeline."""
        status = self.faults.error_status()
        if status is not None:
            return detail_response(status, f"Injected fault: simulated error {status}.")
        if self.faults.config.latency_s > 0:
            await self.runner.clock.sleep(self.faults.config.latency_s)
        return None

    # -- /v1/chat/completions -------------------------------------------------------------------------
    async def chat(self, req: ChatCompletionRequest) -> Response:
        request_id = req.request_id or str(uuid.uuid4())
        model = req.model or self.model
        if req.stage_sampling and any(set(p) - SAMPLING_PARAM_FIELDS for p in req.stage_sampling.values()):
            bad = sorted({k for p in req.stage_sampling.values() for k in p} - SAMPLING_PARAM_FIELDS)
            # SamplingParams(**params) raises before any response: FastAPI's plain-text 500
            raise TypeError(f"SamplingParams.__init__() got an unexpected keyword argument {bad[0]!r}")
        modalities = req.modalities or ["text"]
        fmt = str(req.audio.get("format", "wav")) if req.audio else "wav"
        count = self._count_chat(req)
        job, failure = self._job(
            request_id,
            "chat",
            count,
            req.effective_max_tokens,
            answer_tokens(self.rng, self.profile.output),
            "audio" in modalities,
        )
        early = await self._prelude()
        if early is not None:
            return early
        chunks = ChatChunks(request_id, model, int(time.time()))
        if req.stream:
            return StreamingResponse(
                self._chat_stream(job, chunks, modalities, fmt), media_type="text/event-stream"
            )
        refused = await self._whole(job, failure)
        return refused or json_response(self._chat_body(job, chunks, modalities, fmt))

    def _chat_body(self, job: Job, chunks: ChatChunks, modalities: list[str], fmt: str) -> dict[str, Any]:
        text = output_text(0, job.text_generated)
        message: dict[str, Any] = {"role": "assistant"}
        if "text" in modalities and text:
            message["content"] = text
        if "audio" in modalities and job.talker:
            data = audio.encode_b64(job.audio_samples, fmt, self.profile.speech.sample_rate)
            message["audio"] = {"id": f"audio-{job.rid}", "data": data, "transcript": text or None}
        if "content" not in message and "audio" not in message:
            message["content"] = text
        return chunks.complete(message, "stop", usage(job.prompt.total, job.thinker_tokens))

    async def _chat_stream(
        self, job: Job, chunks: ChatChunks, modalities: list[str], fmt: str
    ) -> AsyncIterator[bytes]:
        cut_after = self.faults.disconnect_after()
        stall_at = self.faults.stall_after()
        sent = chunk_count = 0
        async with contextlib.aclosing(self._live(job)) as events:
            async for event in events:
                delta: dict[str, Any] = {} if chunk_count else {"role": "assistant"}
                if event.kind == "text":
                    text_now = min(event.value, job.text_tokens)
                    if "text" in modalities and text_now > sent:
                        delta["content"] = output_text(sent, text_now)
                    sent = text_now
                elif "audio" in modalities and event.value:
                    data = audio.encode_b64(event.value, fmt, self.profile.speech.sample_rate)
                    delta["audio"] = {"id": f"audio-{job.rid}", "data": data}
                if not delta:
                    continue
                if stall_at is not None and chunk_count >= stall_at:
                    stall_at = None
                    await self.runner.clock.sleep(self.faults.config.stall_s)
                yield chunks.delta(delta)
                chunk_count += 1
                if cut_after is not None and chunk_count >= cut_after:
                    raise StreamCut("injected disconnect")
        yield chunks.finish("stop", usage(job.prompt.total, job.thinker_tokens))
        yield SSE_DONE

    # -- /v1/audio/speech -----------------------------------------------------------------------------
    async def speech(self, req: CreateSpeechRequest) -> Response:
        request_id = f"speech-{uuid.uuid4()}"
        count: OmniPrompt | Failure = self.counter.speech(req.input)
        if self.speech_route == "reject":
            count = Failure(SPEECH_PREPROCESS_ERROR, False)
        job, failure = self._job(
            request_id, "speech", count, req.max_new_tokens, self.counter.text(req.input), True
        )
        early = await self._prelude()
        if early is not None:
            return early
        if req.stream:
            return StreamingResponse(self._speech_stream(job, req), media_type="text/event-stream")
        refused = await self._whole(job, failure)
        if refused is not None:
            return refused
        if not job.talker:  # the --text-only pipeline: Client.speech finds no audio chunk
            return detail_response(500, NO_AUDIO_ERROR)
        try:
            data, mime = audio.encode(
                job.audio_samples, req.response_format, self.profile.speech.sample_rate, req.speed
            )
        except ValueError as exc:
            return detail_response(500, str(exc))
        fmt = audio.MIME_TO_FORMAT.get(mime, req.response_format)
        headers = {
            "Content-Disposition": f'attachment; filename="speech.{fmt}"',
            "X-Prompt-Tokens": str(job.prompt.total),
            "X-Completion-Tokens": str(job.thinker_tokens),
            "X-Engine-Time": str(self._engine_time(job)),
        }
        return Response(data, media_type=mime, headers=headers)

    async def _speech_stream(self, job: Job, req: CreateSpeechRequest) -> AsyncIterator[bytes]:
        chunks = SpeechChunks(job.rid)
        rate = self.profile.speech.sample_rate
        index = 0
        async with contextlib.aclosing(self._live(job)) as events:
            async for event in events:
                if event.kind != "audio" or not event.value:
                    continue
                try:
                    data, mime = audio.encode(event.value, req.response_format, rate, req.speed)
                except ValueError as exc:
                    raise StreamCut(str(exc)) from exc
                fmt = audio.MIME_TO_FORMAT.get(mime, req.response_format)
                yield chunks.audio(index, base64.b64encode(data).decode("ascii"), fmt, mime, rate)
                index += 1
        yield chunks.final(index, "stop", usage(job.prompt.total, job.thinker_tokens, self._engine_time(job)))
        yield SSE_DONE

    # -- shared ---------------------------------------------------------------------------------------
    @staticmethod
    def _engine_time(job: Job) -> float:
        assert job.finished_at is not None
        return round(job.finished_at - job.arrival, 6)

    async def _live(self, job: Job) -> AsyncGenerator[Event, None]:
        """A streamed job's events until its end. It is submitted from inside the body, so the 200 headers
        are out before the pipeline can refuse or fail it: both cut the connection. However the stream
        ends — done, cut or client gone — the handler detaches (and, where the release does, aborts)."""
        try:
            handle = self.runner.submit(job)
        except SubmitRefused as exc:
            raise StreamCut(exc.message) from exc
        try:
            async for event in handle.stream():
                if event.kind == "failed":
                    raise StreamCut(event.message)
                if event.kind == "done":
                    return
                yield event
        finally:
            self._leave(handle)

    async def _whole(self, job: Job, failure: Failure | None) -> Response | None:
        """Run a non-streamed job to its end (a disconnect never cancels this handler); the error answer, or
        None when it finished."""
        try:
            handle = self.runner.submit(job)
        except SubmitRefused as exc:
            return detail_response(self._status(None, exc), exc.message)
        try:
            async for event in handle.stream():
                if event.kind == "failed":
                    return detail_response(self._status(failure), event.message)
            return None
        finally:
            self.runner.detach(handle)

    def _leave(self, handle: JobHandle) -> None:
        self.runner.detach(handle)
        if self.behaviour.aborts_streams_on_disconnect and handle.job.finished_at is None:
            self.runner.abort(handle.job.rid)
