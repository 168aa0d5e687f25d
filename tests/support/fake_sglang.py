"""A tiny SGLang-like backend for gateway tests: exact SSE framing, scripted failures, abort detection."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Behaviour:
    tokens: int = 5
    token_delay: float = 0.0
    fail_status: int | None = None  # answer every POST with this status
    drop_after: int | None = None  # drop the connection after this many content chunks
    send_usage: bool = True  # False: answers and streams without a `usage` object (as some servers do)
    healthy: bool = True
    dp_ranks: int = 1  # data-parallel ranks the metrics and /server_info report
    # the settings routes it has: 0.5.9 serves both, older servers only the second
    info_routes: tuple[str, ...] = ("/server_info", "/get_server_info")
    ends_on_abort: bool = True  # `/abort_request` ends a stream as SGLang 0.5.23 (False: it is ignored)


@dataclass
class Record:
    received: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)  # each POST's headers, names lower-case
    aborted: list[tuple[str, float]] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)  # rids asked to end (`/abort_request`)
    completed: int = 0
    info_calls: dict[str, int] = field(default_factory=dict)  # settings route → times asked
    metrics_calls: int = 0


def chunk(
    cid: str,
    model: str,
    delta: dict[str, Any] | None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
    choices: bool = True,
) -> bytes:
    obj: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": model,
        "choices": [],
        "usage": usage,
    }
    if choices:
        obj["choices"] = [
            {
                "index": 0,
                "delta": delta or {},
                "logprobs": None,
                "finish_reason": finish,
                "matched_stop": None,
            }
        ]
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def expected_stream(cid: str, model: str, tokens: int, include_usage: bool, prompt_tokens: int) -> bytes:
    """The exact bytes this backend sends for one chat stream."""
    out = chunk(cid, model, {"role": "assistant", "content": ""})
    for i in range(tokens):
        out += chunk(cid, model, {"role": None, "content": f"t{i} "})
    out += chunk(cid, model, {"role": None, "content": None}, finish="length")
    if include_usage:
        out += chunk(
            cid,
            model,
            None,
            usage={
                "prompt_tokens": prompt_tokens,
                "completion_tokens": tokens,
                "total_tokens": prompt_tokens + tokens,
            },
            choices=False,
        )
    return out + b"data: [DONE]\n\n"


def make_app(
    behaviour: Behaviour | None = None, model: str = "test-model"
) -> tuple[Starlette, Behaviour, Record]:
    b = behaviour or Behaviour()
    rec = Record()

    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        rec.received.append(body)
        rec.headers.append(dict(request.headers))
        if b.fail_status is not None:
            return JSONResponse(
                {
                    "object": "error",
                    "message": "scripted failure",
                    "type": "InternalServerError",
                    "param": None,
                    "code": b.fail_status,
                },
                status_code=b.fail_status,
            )
        rid = request.headers.get("x-request-id", "x")
        cid = f"chatcmpl-{rid}"
        tokens = int(body.get("max_tokens") or b.tokens)
        prompt_tokens = 7
        if not body.get("stream"):
            rec.completed += 1
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "created": 1700000000,
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "t " * tokens},
                            "finish_reason": "length",
                        }
                    ],
                    **(
                        {
                            "usage": {
                                "prompt_tokens": prompt_tokens,
                                "completion_tokens": tokens,
                                "total_tokens": prompt_tokens + tokens,
                            }
                        }
                        if b.send_usage
                        else {}
                    ),
                }
            )
        include_usage = b.send_usage and bool((body.get("stream_options") or {}).get("include_usage"))
        data = expected_stream(cid, model, tokens, include_usage, prompt_tokens)
        events = [e + b"\n\n" for e in data.split(b"\n\n")[:-1]]

        engine_rid = body.get("rid")

        async def gen() -> AsyncIterator[bytes]:
            finished = False
            try:
                for i, event in enumerate(events):
                    if b.drop_after is not None and i > b.drop_after:
                        raise RuntimeError("scripted mid-stream drop")
                    if i > 0 and b.token_delay:
                        await anyio.sleep(b.token_delay)
                    if b.ends_on_abort and engine_rid is not None and engine_rid in rec.ended:
                        yield chunk(cid, model, {"content": None}, finish="abort")  # then its usage
                        used = {"prompt_tokens": prompt_tokens, "completion_tokens": i - 1}
                        if include_usage:
                            yield chunk(cid, model, None, usage=used, choices=False)
                        yield b"data: [DONE]\n\n"
                        return
                    yield event
                finished = True
                rec.completed += 1
            finally:
                if not finished:
                    rec.aborted.append((rid, time.monotonic()))

        return StreamingResponse(gen(), media_type="text/event-stream")

    async def health(request: Request) -> Response:
        return Response(status_code=200 if b.healthy else 503)

    async def metrics(request: Request) -> Response:
        """Per DP rank r: KV use 0.25 + 0.5·r, 3 + 2·r running (labelled with the rank when DP > 1)."""
        rec.metrics_calls += 1
        ranks = [
            'model_name="m",tp_rank="0"' + (f',dp_rank="{r}"' if b.dp_ranks > 1 else "")
            for r in range(b.dp_ranks)
        ]
        usage = [f"sglang:token_usage{{{labels}}} {0.25 + 0.5 * r}" for r, labels in enumerate(ranks)]
        running = [f"sglang:num_running_reqs{{{labels}}} {3 + 2 * r}" for r, labels in enumerate(ranks)]
        text = "\n".join(
            ["# TYPE sglang:token_usage gauge", *usage, "# TYPE sglang:num_running_reqs gauge", *running]
        )
        return Response(text + "\n", media_type="text/plain")

    def settings(path: str) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            rec.info_calls[path] = rec.info_calls.get(path, 0) + 1
            if path not in b.info_routes:
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            if b.info_routes == ("/get_server_info",):  # an older server: no per-rank states
                return JSONResponse({"max_total_num_tokens": 1000, "max_running_requests": 16})
            ranks = [
                {"memory_usage": {"token_capacity": 1000}, "effective_max_running_requests_per_dp": 16}
                for _ in range(b.dp_ranks)
            ]
            return JSONResponse(
                {
                    "max_total_num_tokens": 1000,
                    "max_running_requests": None,
                    "dp_size": b.dp_ranks,
                    "internal_states": ranks,
                    "version": "0.5.9",
                }
            )

        return answer

    async def abort_request(request: Request) -> Response:
        rec.ended.append(orjson.loads(await request.body()).get("rid"))
        return Response(status_code=200)

    app = Starlette(
        routes=[
            Route("/abort_request", abort_request, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", chat, methods=["POST"]),
            Route("/health", health),
            Route("/metrics", metrics),
            Route("/server_info", settings("/server_info")),
            Route("/get_server_info", settings("/get_server_info")),
        ]
    )
    return app, b, rec
