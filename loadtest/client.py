"""One chat completion (or speech request), measured the way vLLM's bench serve measures it.

TTFT is taken at the first chunk carrying non-empty content (SGLang's opening role-only chunk with
content "" is not a token) or audio, every later content chunk adds one ITL gap, E2E ends at the stream's
last byte, and output tokens are the server's usage count (chunk count only if the server sent no usage).
A whole (non-streamed) answer has its first token when it all arrives: TTFT = E2E, no ITL. Audio (a chat's
`delta.audio`, a speech chunk's `audio`) is timed per chunk with its seconds, read from its WAV header
(gateway/speech/events.py): time to first audio, real-time factor and stalls follow from them.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.speech.events import read_json, speech_seconds
from gateway.speech.pcm import PcmFormat
from loadtest.http import HttpError, HttpPool, Response
from loadtest.records import GATEWAY_HEADERS, RequestRecord

CHAT_PATH = "/v1/chat/completions"
SPEECH_PATH = "/v1/audio/speech"


@dataclass(slots=True)
class PreparedRequest:
    """What the workload hands the client: the JSON body plus the labels we break metrics down by."""

    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    bucket: str = "text"
    tenant: str = ""
    priority: int | None = None
    traffic_class: str = ""
    path: str = CHAT_PATH


def error_code(status: int, body: bytes) -> str:
    """A short error label from OpenAI-style, SGLang-style or FastAPI-style error bodies."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"http_{status}"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            code = err.get("code") or err.get("type")
            if code is not None:
                return str(code)
    return f"http_{status}"


def _content(choice: dict[str, Any]) -> str:
    delta = choice.get("delta") or {}
    return str(delta.get("content") or delta.get("reasoning_content") or "")


async def _consume(pool: HttpPool, req: PreparedRequest, rec: RequestRecord, t_sent: float) -> None:
    payload = orjson.dumps(req.body)
    headers = {"content-type": "application/json", "accept": "text/event-stream", **req.headers}
    resp = await pool.request("POST", req.path, payload, headers)
    try:
        await _read_stream(resp, rec, t_sent)
    finally:
        resp.close()


async def _read_stream(resp: Response, rec: RequestRecord, t_sent: float) -> None:
    rec.status = resp.status
    rec.headers = {k: resp.headers[k] for k in GATEWAY_HEADERS if k in resp.headers}
    if resp.status != 200:
        rec.error = error_code(resp.status, await resp.read())
        rec.e2e = time.perf_counter() - t_sent
        return
    media_type = resp.headers.get("content-type", "")
    pcm = PcmFormat.of(resp.headers) if media_type == "audio/pcm" else None
    if pcm is not None and resp.headers.get("content-length") is None:  # streamed raw PCM, timed per chunk
        async for piece in resp.iter_bytes():
            now = time.perf_counter() - t_sent
            rec.audio.append((now, pcm.seconds(len(piece))))
            if rec.ttfa is None:
                rec.ttfa = rec.ttft = now
        rec.e2e = time.perf_counter() - t_sent
        return
    if media_type.startswith("audio/"):  # a whole speech answer: its tokens in the headers
        body = await resp.read()
        rec.ttft = rec.ttfa = rec.e2e = time.perf_counter() - t_sent
        rec.audio.append((rec.e2e, speech_seconds(body, resp.headers.get("x-sample-rate"))))
        rec.output_tokens = int(resp.headers.get("x-completion-tokens") or 0)
        rec.prompt_tokens = int(resp.headers.get("x-prompt-tokens") or 0)
        return
    if not media_type.startswith("text/event-stream"):
        _read_whole(await resp.read(), rec, time.perf_counter() - t_sent)
        return
    buf = b""
    content_chunks = 0
    usage_tokens: int | None = None
    async for piece in resp.iter_bytes():
        now = time.perf_counter() - t_sent
        buf += piece
        *events, buf = buf.replace(b"\r\n", b"\n").split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                msg, seconds = read_json(data)
                if seconds is not None:
                    rec.audio.append((now, seconds))
                    if rec.ttfa is None:
                        rec.ttfa = now
                    if rec.ttft is None:
                        rec.ttft = now
                if "error" in msg:
                    err = msg["error"]
                    rec.error = str(err.get("code") or err.get("type") or "stream_error")
                    continue
                if any(_content(c) for c in msg.get("choices") or ()):
                    content_chunks += 1
                    rec.chunk_times.append(now)
                    if rec.ttft is None:
                        rec.ttft = now
                usage = msg.get("usage")
                if usage:
                    usage_tokens = int(usage.get("completion_tokens") or 0)
                    _prompt_usage(usage, rec)
    rec.e2e = time.perf_counter() - t_sent
    rec.output_tokens = usage_tokens if usage_tokens is not None else content_chunks


def _read_whole(body: bytes, rec: RequestRecord, now: float) -> None:
    msg, seconds = read_json(body, scan=len(body))
    usage = msg.get("usage") or {}
    rec.ttft = rec.e2e = now
    if seconds is not None:
        rec.ttfa = now
        rec.audio.append((now, seconds))
    rec.output_tokens = int(usage.get("completion_tokens") or 0)
    _prompt_usage(usage, rec)


def _prompt_usage(usage: dict[str, Any], rec: RequestRecord) -> None:
    """The prompt as the server counted it, and its cached prefix when the server tells it (SGLang with
    --enable-cache-report: `prompt_tokens_details.cached_tokens`)."""
    rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        rec.cached_tokens = details["cached_tokens"]


async def send(
    pool: HttpPool, req: PreparedRequest, rec: RequestRecord, start: float, deadline_s: float
) -> RequestRecord:
    """Send now and fill `rec`; `start` is the run's perf_counter origin. Never raises for server faults."""
    t_sent = time.perf_counter()
    rec.sent = t_sent - start
    rec.bucket, rec.tenant, rec.priority = req.bucket, req.tenant, req.priority
    rec.traffic_class = req.traffic_class
    try:
        await asyncio.wait_for(_consume(pool, req, rec, t_sent), deadline_s)
    except TimeoutError:
        rec.error = "timeout"
    except asyncio.CancelledError:
        rec.error = "unfinished"  # still streaming when the run's drain window closed
        rec.e2e = time.perf_counter() - t_sent
        raise
    except (HttpError, orjson.JSONDecodeError) as e:
        rec.error = "transport" if isinstance(e, HttpError) else "bad_stream"
    if rec.error is not None and rec.e2e is None:
        rec.e2e = time.perf_counter() - t_sent
    return rec
