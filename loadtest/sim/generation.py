"""From a parsed HTTP request to an engine request and back: validation, output length, faults, and the
streaming / non-streaming bodies of the OpenAI and native routes."""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from loadtest.sim.engine import EngineError, SimRequest
from loadtest.sim.faults import FaultInjector
from loadtest.sim.profile import Profile
from loadtest.sim.responses import (
    SSE_DONE,
    ChunkFactory,
    error_response,
    json_response,
    output_text,
    sse,
    stream_error,
)
from loadtest.sim.runtime import EngineRunner, Handle
from loadtest.sim.tokens import PromptCount, PromptError


class DroppedConnection(Exception):
    """Raised inside a stream to cut the connection (mid-stream disconnect fault)."""


@dataclass
class Call:
    """One validated generation call, whatever route it came from."""

    kind: str  # chat | completion | generate
    model: str
    prompt: PromptCount
    max_new_tokens: int | None
    ignore_eos: bool
    stream: bool
    include_usage: bool
    priority: int | None
    rid: str | None = None


def int_field(body: dict[str, Any], *names: str, minimum: int = 0) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PromptError(f"{name} must be an integer >= {minimum}.")
        return value
    return None


WORK_KEPT = 100_000  # requests the work ledger remembers (oldest dropped first)


class Generator:
    def __init__(
        self,
        profile: Profile,
        runner: EngineRunner,
        faults: FaultInjector,
        seed: int,
        legacy: bool = False,
        cache_report: bool = False,
    ) -> None:
        self.legacy = legacy  # SGLang 0.5.9's surface (responses.py), else 0.5.23's
        self.cache_report = cache_report  # usage tells the prompt's cached tokens (--enable-cache-report)
        # the engine's own account of the work it took, by the caller's x-request-id (GET /sim/work): what
        # a gateway's ledger must match
        self.work: dict[str, tuple[float, SimRequest]] = {}
        self.profile = profile
        self.runner = runner
        self.faults = faults
        self._rng = random.Random(seed)
        self.context_len = min(profile.context_length, runner.engine.config.max_total_tokens)

    def _output_len(self, max_new: int, ignore_eos: bool) -> int:
        if ignore_eos:
            return max_new
        o = self.profile.output
        natural = round(self._rng.lognormvariate(math.log(o.median_tokens), o.sigma))
        return min(max_new, max(o.min_tokens, natural))

    def _check_context(self, prompt: int, max_new: int | None) -> int:
        """SGLang's two length checks; returns the effective max_new_tokens."""
        if prompt >= self.context_len:
            raise PromptError(
                f"The input ({prompt} tokens) is longer than the model's context length "
                f"({self.context_len} tokens)."
            )
        if max_new is None:
            return self.context_len - prompt
        if max_new + prompt >= self.context_len:
            raise PromptError(
                "Requested token count exceeds the model's maximum context length of "
                f"{self.context_len} tokens. You requested a total of {prompt + max_new} tokens: "
                f"{prompt} tokens from the input messages and {max_new} tokens for the completion. "
                "Please reduce the number of tokens in the input messages or the completion to fit "
                "within the limit."
            )
        return max_new

    async def handle(self, call: Call, request: Request) -> Response:
        try:
            max_new = self._check_context(call.prompt.total, call.max_new_tokens)
        except PromptError as exc:
            return error_response(exc.status, exc.message)
        if max_new == 0:
            max_new = 1
        status = self.faults.error_status()
        if status is not None:
            return error_response(status, f"Injected fault: simulated error {status}.")
        if self.faults.config.latency_s > 0:
            await self.runner.clock.sleep(self.faults.config.latency_s)
        prefix = {"chat": "chatcmpl-", "completion": "cmpl-"}.get(call.kind, "") if self.legacy else ""
        req = SimRequest(
            rid=call.rid or prefix + uuid.uuid4().hex,
            prompt_tokens=call.prompt.total,
            max_new_tokens=max_new,
            output_len=self._output_len(max_new, call.ignore_eos),
            encoder_tokens=call.prompt.encoder_tokens,
            priority=call.priority,
            pages=call.prompt.pages.pages if call.prompt.pages is not None else [],
        )
        try:
            handle = self.runner.submit(req)
        except EngineError as exc:
            if call.stream and not self.legacy:  # 0.5.23 answers a stream 200, whatever its first event
                refusal = [stream_error(exc.message, exc.status), SSE_DONE]
                return StreamingResponse(iter(refusal), media_type="text/event-stream")
            return error_response(exc.status, exc.message)
        self._note(request.headers.get("x-request-id"), req)
        if call.stream:
            events = self._stream(call, handle)
            if self.legacy:
                return StreamingResponse(events, media_type="text/event-stream")
            return await self._stream_from_first_event(events, request)
        return await self._complete(call, handle, request)

    async def _stream_from_first_event(self, events: AsyncIterator[bytes], request: Request) -> Response:
        """SGLang 0.5.23 sends a stream's headers with its first event (the first token, or an error such
        as an eviction from the queue): a queued stream has no status yet. A client that leaves before it
        aborts the request (`_stream`'s cleanup) and gets nothing."""
        first: list[bytes] = []

        async def take_first() -> None:
            first.append(await anext(events))

        if not await finish_or_abandon(take_first(), request):
            return Response(status_code=204)  # nobody is listening

        async def replay() -> AsyncIterator[bytes]:
            yield first[0]
            async for event in events:
                yield event

        return StreamingResponse(replay(), media_type="text/event-stream")

    def _note(self, request_id: str | None, req: SimRequest) -> None:
        if request_id is None:
            return
        self.work.pop(request_id, None)  # a retry of the same request: its latest attempt counts
        self.work[request_id] = (time.time(), req)
        if len(self.work) > WORK_KEPT:
            del self.work[next(iter(self.work))]

    def work_report(self) -> dict[str, dict[str, Any]]:
        """Per request id: the prompt the engine took (`prompt_tokens`), the tokens it generated, whether
        its prefill had started (`prefilled`), how it ended (None while it runs) and when it arrived
        (`at`, wall-clock seconds: the later of two engines' attempts is the one that counts)."""
        return {
            rid: {
                "at": at,
                "prompt_tokens": r.prompt_tokens,
                "generated": r.generated,
                "prefilled": r.admitted_at is not None,
                "finish_reason": r.finish_reason,
            }
            for rid, (at, r) in self.work.items()
        }

    async def _complete(self, call: Call, handle: Handle, request: Request) -> Response:
        finished = False
        try:
            finished = await finish_or_abandon(self._drain(handle), request)
        finally:
            if not finished:
                self.runner.abort(handle.req.rid)
            self.runner.release(handle)
        req = handle.req
        if req.error is not None:
            return error_response(req.error.status, req.error.message)
        if not finished:  # the client left: nobody reads an answer
            return error_response(400, "The request was aborted.")
        return json_response(self._body(call, req))  # ended by `/abort_request`: 200, finish_reason abort

    def _body(self, call: Call, req: SimRequest) -> dict[str, Any]:
        text = output_text(0, req.generated)
        finish = req.finish_reason or "stop"
        if call.kind == "generate":
            return _native_chunk(req, req.generated)
        return ChunkFactory(req.rid, call.model, call.kind == "chat", self.legacy).complete(
            text, finish, _counted_prompt(req), req.generated, self._cached(req)
        )

    async def _drain(self, handle: Handle) -> None:
        async for _ in handle.progress():
            pass

    async def _stream(self, call: Call, handle: Handle) -> AsyncIterator[bytes]:
        req = handle.req
        chunks = ChunkFactory(req.rid, call.model, call.kind == "chat", self.legacy)
        cut_after = self.faults.disconnect_after()
        stall_at = self.faults.stall_after()
        sent = 0
        try:
            if cut_after == 0:
                raise DroppedConnection
            async for total in handle.progress():
                if call.kind == "chat" and not sent:
                    # as SGLang's serving_chat: the role chunk goes with the engine's first output, so the
                    # stream's first byte comes after the prefill, not at once
                    yield chunks.role_chunk()
                if stall_at is not None and sent >= stall_at:
                    stall_at = None
                    await self.runner.clock.sleep(self.faults.config.stall_s)
                if call.kind == "generate":
                    yield sse(_native_chunk(req, total))
                else:
                    yield chunks.content_chunk(output_text(sent, total))
                sent = total
                if cut_after is not None and sent >= cut_after:
                    raise DroppedConnection
            if req.error is not None:
                yield stream_error(req.error.message, req.error.status, self.legacy)
            elif call.kind != "generate":  # an `/abort_request` ends it cleanly too: finish_reason "abort"
                yield chunks.finish_chunk(req.finish_reason or "stop")
                if call.include_usage:
                    yield chunks.usage_chunk(_counted_prompt(req), req.generated, self._cached(req))
            yield SSE_DONE
        finally:
            if req.finished_at is None:
                self.runner.abort(req.rid)
            self.runner.release(handle)

    def _cached(self, req: SimRequest) -> int | None:
        """The usage's cached tokens: reported only with --enable-cache-report, as SGLang does."""
        return req.cached_tokens if self.cache_report else None


def _counted_prompt(req: SimRequest) -> int:
    """The prompt a usage reports: none for a request aborted before its prefill started (SGLang 0.5.23's
    usage for a request `/abort_request` ended while it waited is 0 prompt, 0 completion tokens)."""
    return req.prompt_tokens if req.admitted_at is not None or req.finish_reason != "abort" else 0


def _native_chunk(req: SimRequest, total: int) -> dict[str, Any]:
    """/generate bodies carry the cumulative text, like SGLang's non-incremental streaming."""
    return {"text": output_text(0, total), "output_ids": list(range(total)), "meta_info": _meta(req)}


def _meta(req: SimRequest) -> dict[str, Any]:
    finish: dict[str, Any] | None = None
    if req.finish_reason == "length":
        finish = {"type": "length", "length": req.generated}
    elif req.finish_reason == "stop":
        finish = {"type": "stop", "matched": 151645}
    elif req.finish_reason in ("abort", "error"):
        finish = {"type": "abort", "message": req.error.message if req.error else "aborted"}
    e2e = None if req.finished_at is None else round(req.finished_at - req.arrival, 6)
    return {
        "id": req.rid,
        "finish_reason": finish,
        "prompt_tokens": req.prompt_tokens,
        "completion_tokens": req.generated,
        "cached_tokens": req.cached_tokens,
        "e2e_latency": e2e,
    }


async def finish_or_abandon(work: Coroutine[Any, Any, None], request: Request) -> bool:
    """Run `work` until it ends or the client disconnects (then it is cancelled); True if it ended."""
    done = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not done.done():
            done.cancel()
    return done.done() and not done.cancelled()


async def wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
