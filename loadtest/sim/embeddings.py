"""`POST /v1/embeddings`, as SGLang serves an embedding model (`--is-embedding`).

Each input is one engine request that prefills its tokens and stops there (an embedding is read off the
prefill: one forward pass, no decode), so embeddings take prefill capacity as they would on a GPU. The
vectors are deterministic unit vectors (a hash of the input seeds them), `encoding_format: base64` packs
them as little-endian float32 as OpenAI does (the openai SDK asks for it by default), and `usage` counts
the prompt tokens with the simulator's own counter. The engine, faults and disconnects behave as for
generation.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import math
import random
import struct
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from loadtest.sim.engine import EngineError, SimRequest
from loadtest.sim.faults import FaultInjector
from loadtest.sim.generation import finish_or_abandon, int_field
from loadtest.sim.responses import error_response, json_response
from loadtest.sim.runtime import EngineRunner, Handle
from loadtest.sim.tokens import PromptCounter, PromptError

DEFAULT_DIMENSIONS = 64  # small: the simulator's vectors carry no meaning, only their shape


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) for t in value)


def vector(seed: str, dimensions: int) -> list[float]:
    """A unit vector determined by `seed`."""
    rng = random.Random(hashlib.sha256(seed.encode()).digest())
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


class Embedder:
    def __init__(
        self, counter: PromptCounter, runner: EngineRunner, faults: FaultInjector, context_len: int
    ) -> None:
        self.counter = counter
        self.runner = runner
        self.faults = faults
        self.context_len = context_len

    def _inputs(self, body: dict[str, Any]) -> list[tuple[str, int]]:
        """(seed, prompt tokens) per input."""
        value = body.get("input")
        items = [value] if isinstance(value, str) or _is_tokens(value) else value
        if not isinstance(items, list) or not items:
            raise PromptError("input must be a string, a list of token ids, or a non-empty list of either.")
        out = []
        for item in items:
            if isinstance(item, str) and item:
                out.append((item, self.counter.text(item)))
            elif _is_tokens(item):
                out.append((repr(item), len(item)))
            else:
                raise PromptError("each input must be a non-empty string or a list of token ids.")
        for _, tokens in out:
            if tokens >= self.context_len:
                raise PromptError(
                    f"The input ({tokens} tokens) is longer than the model's context length "
                    f"({self.context_len} tokens)."
                )
        return out

    async def handle(self, body: dict[str, Any], request: Request) -> Response:
        model = body.get("model")
        try:
            if not isinstance(model, str):
                raise PromptError("model: Field required (a string).")
            inputs = self._inputs(body)
            dimensions = int_field(body, "dimensions", minimum=1) or DEFAULT_DIMENSIONS
        except PromptError as exc:
            return error_response(exc.status, exc.message)
        status = self.faults.error_status()
        if status is not None:
            return error_response(status, f"Injected fault: simulated error {status}.")
        if self.faults.config.latency_s > 0:
            await self.runner.clock.sleep(self.faults.config.latency_s)
        handles: list[Handle] = []
        try:
            for _, tokens in inputs:
                req = SimRequest(
                    rid="embd-" + uuid.uuid4().hex, prompt_tokens=tokens, max_new_tokens=1, output_len=1
                )
                handles.append(self.runner.submit(req))
            failed = await self._wait(handles, request)
        except EngineError as exc:
            failed = exc
        finally:
            for handle in handles:
                if handle.req.finished_at is None:
                    self.runner.abort(handle.req.rid)
                self.runner.release(handle)
        if failed is not None:
            return error_response(failed.status, failed.message)
        packed = body.get("encoding_format") == "base64"
        data = []
        for i, (seed, _) in enumerate(inputs):
            values = vector(seed, dimensions)
            embedding: Any = (
                base64.b64encode(struct.pack(f"<{dimensions}f", *values)).decode() if packed else values
            )
            data.append({"object": "embedding", "embedding": embedding, "index": i})
        tokens = sum(t for _, t in inputs)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}
        return json_response({"object": "list", "data": data, "model": model, "usage": usage})

    async def _wait(self, handles: list[Handle], request: Request) -> EngineError | None:
        """Until every input's prefill is done (or the client leaves: an abort, as SGLang answers it)."""

        async def drain(handle: Handle) -> None:
            async for _ in handle.progress():
                pass

        async def all_done() -> None:
            await asyncio.gather(*(drain(h) for h in handles))

        if not await finish_or_abandon(all_done(), request):
            return EngineError(400, "The request was aborted.")
        return next((h.req.error for h in handles if h.req.error is not None), None)
