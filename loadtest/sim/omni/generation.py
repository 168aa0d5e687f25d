"""From a validated chat or speech request to a pipeline job and back to sglang-omni's HTTP answers.

Failure shapes follow `serve/openai_api.py`: a whole answer's failure is `{"detail": message}` with 500 (the
later release: 400 for a bad request, 409 for a duplicate id, 503 for a full queue); a streamed answer has
already sent its 200 headers when the pipeline fails: the snapshot cuts the connection with no error event and
no `[DONE]`, the later release (0.1.9) sends an error event carrying the status as its `code`, then `[DONE]`.
The later release's speech surface (PCM streams, OpenAI-envelope errors) is speech_api.py. Whether a client
disconnect aborts the job depends on the release (see release.py).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import Response, StreamingResponse

from loadtest.sim.faults import FaultInjector
from loadtest.sim.omni import audio, speech_api
from loadtest.sim.omni.metrics import OmniMetrics
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
    sse,
    usage,
)
from loadtest.sim.omni.runner import JobHandle, PipelineRunner
from loadtest.sim.responses import output_text

SPEECH_PREPROCESS_ERROR = "Preprocessing expects a list of chat messages"
NO_AUDIO_ERROR = "No audio output generated from the pipeline."


Disconnected = Callable[[], Awaitable[bool]]
DISCONNECT_POLL_S = 0.05  # `wait_for_request_disconnect`'s poll (real seconds)


class StreamCut(Exception):
    """A streamed answer's failure with the status the server gives it: raised inside a streamed body, the
    server closes the connection mid-response (or, in the later release, reports it in-band)."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


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
        self.outcomes = speech_api.Outcomes()
        self.metrics: OmniMetrics | None = None  # the server's audio histograms, with --enable-metrics

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

    def _injected(self, status: int) -> StreamCut:
        """An injected failure as the release tells it: the later release's full queue has its own message."""
        if self.behaviour.in_band_failures and status == 503:
            return StreamCut(speech_api.QUEUE_FULL, status)
        return StreamCut(f"Injected fault: simulated error {status}.", status)

    async def _prelude(self) -> StreamCut | None:
        """Injected faults that answer before the request reaches the pipeline."""
        status = self.faults.error_status()
        if status is not None:
            return self._injected(status)
        if self.faults.config.latency_s > 0:
            await self.runner.clock.sleep(self.faults.config.latency_s)
        return None

    # -- /v1/chat/completions -------------------------------------------------------------------------
    async def chat(self, req: ChatCompletionRequest, disconnected: Disconnected | None = None) -> Response:
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
        chunks = ChatChunks(request_id, model, int(time.time()))
        if early is not None and not (req.stream and self.behaviour.in_band_failures):
            return detail_response(early.status, early.message)
        if req.stream:
            return StreamingResponse(
                self._chat_stream(job, failure, chunks, modalities, fmt, early),
                media_type="text/event-stream",
            )
        refused = await self._whole(job, failure, disconnected)
        if refused is not None:
            return detail_response(refused.status, refused.message)
        return json_response(self._chat_body(job, chunks, modalities, fmt))

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
        self,
        job: Job,
        failure: Failure | None,
        chunks: ChatChunks,
        modalities: list[str],
        fmt: str,
        early: StreamCut | None,
    ) -> AsyncIterator[bytes]:
        """The events of a streamed chat; a failure cuts it (snapshot) or ends it with an error event carrying
        its status and [DONE] (`chat_stream`, later)."""
        try:
            if early is not None:
                raise early
            async with contextlib.aclosing(
                self._chat_events(job, failure, chunks, modalities, fmt)
            ) as events:
                async for event in events:
                    yield event
        except StreamCut as cut:
            if not self.behaviour.in_band_failures:
                raise
            kind = "invalid_request_error" if cut.status < 500 else "server_error"
            yield sse({"error": {"message": cut.message, "type": kind, "code": cut.status}})
        yield SSE_DONE

    async def _chat_events(
        self, job: Job, failure: Failure | None, chunks: ChatChunks, modalities: list[str], fmt: str
    ) -> AsyncGenerator[bytes, None]:
        cut_after = self.faults.disconnect_after()
        stall_at = self.faults.stall_after()
        sent = chunk_count = 0
        async with contextlib.aclosing(self._live(job, failure)) as events:
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
                    raise self._mid_stream_fault()
        yield chunks.finish("stop", usage(job.prompt.total, job.thinker_tokens))

    def _mid_stream_fault(self) -> StreamCut:
        """The injected mid-stream failure: a cut connection (snapshot), the injected status (later)."""
        if self.behaviour.in_band_failures:
            return self._injected(self.faults.config.error_status)
        return StreamCut("injected disconnect")

    # -- /v1/audio/speech -----------------------------------------------------------------------------
    async def speech(self, req: CreateSpeechRequest, disconnected: Disconnected | None = None) -> Response:
        if self.behaviour.in_band_failures:
            return await self._speech_019(req, disconnected)
        request_id = f"speech-{uuid.uuid4()}"
        count: OmniPrompt | Failure = self.counter.speech(req.input)
        if self.speech_route == "reject":
            count = Failure(SPEECH_PREPROCESS_ERROR, False)
        job, failure = self._job(
            request_id, "speech", count, req.max_new_tokens, self.counter.text(req.input), True
        )
        early = await self._prelude()
        if early is not None:
            return detail_response(early.status, early.message)
        if req.stream:
            return StreamingResponse(self._speech_stream(job, failure, req), media_type="text/event-stream")
        refused = await self._whole(job, failure)
        if refused is not None:
            return detail_response(refused.status, refused.message)
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

    async def _speech_stream(
        self, job: Job, failure: Failure | None, req: CreateSpeechRequest
    ) -> AsyncIterator[bytes]:
        chunks = SpeechChunks(job.rid)
        rate = self.profile.speech.sample_rate
        index = 0
        async with contextlib.aclosing(self._live(job, failure)) as events:
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

    async def _live(self, job: Job, failure: Failure | None) -> AsyncGenerator[Event, None]:
        """A streamed job's events until its end. It is submitted from inside the body, so the 200 headers
        are out before the pipeline can refuse or fail it (StreamCut, with the status the release gives).
        However the stream ends — done, cut or client gone — the handler detaches (and, where the release
        does, aborts)."""
        try:
            handle = self.runner.submit(job)
        except SubmitRefused as exc:
            raise StreamCut(exc.message, self._status(None, exc)) from exc
        try:
            async for event in handle.stream():
                if event.kind == "failed":
                    raise StreamCut(event.message, self._status(failure))
                if event.kind == "done":
                    return
                yield event
        finally:
            self._leave(handle)

    async def _whole(
        self, job: Job, failure: Failure | None, disconnected: Disconnected | None = None
    ) -> StreamCut | None:
        """Run a non-streamed job to its end; its failure with the status the release gives, or None when it
        finished. The later release aborts it when its client leaves (`complete_unless_disconnected`); the
        snapshot runs it on."""
        try:
            handle = self.runner.submit(job)
        except SubmitRefused as exc:
            return StreamCut(exc.message, self._status(None, exc))
        watch = disconnected if self.behaviour.in_band_failures else None
        watcher = asyncio.create_task(_left(watch)) if watch is not None else None
        try:
            async for event in handle.stream():
                if event.kind == "failed":
                    return StreamCut(event.message, self._status(failure))
                if watcher is not None and watcher.done():
                    break
            return None
        finally:
            if watcher is not None:
                watcher.cancel()
            self.runner.detach(handle)
            if watcher is not None and handle.job.finished_at is None:
                self.runner.abort(handle.job.rid)

    # -- /v1/audio/speech as 0.1.9 serves it ----------------------------------------------------------
    async def _speech_019(self, req: CreateSpeechRequest, disconnected: Disconnected | None) -> Response:
        bad = speech_api.check(req)
        if bad is not None:
            return bad
        request_id = f"speech-{uuid.uuid4()}"
        count: OmniPrompt | Failure = self.counter.speech(req.input)
        if self.speech_route == "reject":
            count = Failure(SPEECH_PREPROCESS_ERROR, False)
        job, failure = self._job(
            request_id, "speech", count, req.max_new_tokens, self.counter.text(req.input), True
        )
        early = await self._prelude()
        if early is not None:
            return speech_api.envelope(early.status, speech_api.failure_message(early.status, early.message))
        if speech_api.streams(req):
            return await self._speech_stream_019(job, failure, req)
        refused = await self._whole(job, failure, disconnected)
        if refused is not None:
            return speech_api.envelope(
                refused.status, speech_api.failure_message(refused.status, refused.message)
            )
        if not job.talker:
            return speech_api.envelope(500, NO_AUDIO_ERROR)
        fmt = req.response_format.strip().lower()
        data, mime = audio.encode(job.audio_samples, fmt, self.profile.speech.sample_rate, req.speed)
        prompt, completion = job.prompt.total, job.thinker_tokens
        headers = {
            "Content-Disposition": f'attachment; filename="speech.{audio.MIME_TO_FORMAT.get(mime, fmt)}"',
            "X-Request-Id": request_id,
            "X-Finish-Reason": "stop",
            "X-Prompt-Tokens": str(prompt),
            "X-Completion-Tokens": str(completion),
            "X-SGLang-Omni-Input-Tokens": str(prompt),
            "X-SGLang-Omni-Output-Tokens": str(completion),
            "X-SGLang-Omni-Total-Tokens": str(prompt + completion),
            "X-Engine-Time": str(self._engine_time(job)),
        }
        return Response(data, media_type=mime, headers=headers)

    async def _speech_stream_019(
        self, job: Job, failure: Failure | None, req: CreateSpeechRequest
    ) -> Response:
        """`speech_audio_response`: nothing is sent until the first audio (a failure before it is a JSON
        error); then raw PCM (or `speech.audio.*` events) whose failure drops the connection (an SSE stream
        ends with an error event and no done event)."""
        rate = self.profile.speech.sample_rate
        events = self._live(job, failure)
        first = b""
        try:
            async for event in events:
                if event.kind == "audio" and event.value:
                    first = audio.encode(event.value, "pcm", rate, req.speed)[0]
                    break
        except StreamCut as cut:
            await events.aclose()
            return speech_api.envelope(cut.status, speech_api.failure_message(cut.status, cut.message))
        if not first:
            await events.aclose()
            return speech_api.envelope(500, NO_AUDIO_ERROR)
        pcm = req.stream_format == "audio"
        body = (
            self._pcm_body(job, events, first, req, True)
            if pcm
            else self._speech_sse(job, events, first, req)
        )
        headers = speech_api.stream_headers(job.rid, rate, pcm)
        return StreamingResponse(
            body, media_type="audio/pcm" if pcm else "text/event-stream", headers=headers
        )

    async def _pcm_body(
        self,
        job: Job,
        events: AsyncGenerator[Event, None],
        first: bytes,
        req: CreateSpeechRequest,
        record: bool,
    ) -> AsyncGenerator[bytes, None]:
        """The PCM chunks from the first on; a finished raw stream's outcome is kept for its GET."""
        cut_after = self.faults.disconnect_after()
        rate = self.profile.speech.sample_rate
        sent = 1
        async with contextlib.aclosing(events):
            yield first
            async for event in events:
                if cut_after is not None and sent >= cut_after:
                    raise self._mid_stream_fault()
                if event.kind == "audio" and event.value:
                    yield audio.encode(event.value, "pcm", rate, req.speed)[0]
                    sent += 1
        engine_s = self._engine_time(job)
        if record:
            self.outcomes.record(job.rid, usage(job.prompt.total, job.thinker_tokens, engine_s))
        if self.metrics is not None and job.first_audio_at is not None:
            seconds = job.audio_samples / self.profile.speech.sample_rate
            self.metrics.observe_audio(job.first_audio_at - job.arrival, engine_s, seconds)

    async def _speech_sse(
        self, job: Job, events: AsyncGenerator[Event, None], first: bytes, req: CreateSpeechRequest
    ) -> AsyncIterator[bytes]:
        try:
            async with contextlib.aclosing(self._pcm_body(job, events, first, req, False)) as chunks:
                async for chunk in chunks:
                    yield speech_api.delta(base64.b64encode(chunk).decode("ascii"))
        except StreamCut as cut:
            yield speech_api.error_event(cut.status, speech_api.failure_message(cut.status, cut.message))
            return
        yield speech_api.done(usage(job.prompt.total, job.thinker_tokens))

    def _leave(self, handle: JobHandle) -> None:
        self.runner.detach(handle)
        if self.behaviour.aborts_streams_on_disconnect and handle.job.finished_at is None:
            self.runner.abort(handle.job.rid)


async def _left(disconnected: Disconnected) -> None:
    """Returns once the client has gone (`wait_for_request_disconnect`)."""
    while not await disconnected():  # noqa: ASYNC110 - the server polls the connection, as the real one does
        await asyncio.sleep(DISCONNECT_POLL_S)
