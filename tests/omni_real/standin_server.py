"""sglang-omni 0.1.9's own HTTP app on loopback: the package's `create_app` around its real `Client`, with
only the pipeline coordinator replaced by a stand-in that needs no GPU. Run by the prepared venv's python (it
never imports the project): `python standin_server.py --port P --model-name M`.

The stand-in answers every request with a few text tokens and, when audio is asked for, audio chunks in the
pipeline's own format (float32 `audio_waveform` bytes + shape + dtype + `sample_rate`), at a steady pace and
with `engine_time_s` in its usage. A marker in the prompt (the chat messages or the speech input) picks
another shape, so a test can trigger each of the server's answers:

- `[overload]` / `[overload-mid]`: the coordinator's `QueueFullError` before any output / after some;
- `[fail]` / `[fail-mid]`: a stage failure (RuntimeError) before any output / after some;
- `[bad]`: a failure the server classes as the request's own (`Request has no prompt tokens`);
- `[slow]`: ten times the pace (a client can leave while it runs).

Stand-in control routes beside the real ones: `POST /standin/health {"running": bool}` (the coordinator's
`running`, which `/health` reports), `POST /standin/overload {"overloaded": bool}` (every request refused with
a full queue), `GET /standin/aborts` (the request ids the app aborted, and how many were refused).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import types
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse

SAMPLE_RATE = 24000
CHUNK_SAMPLES = 6000  # 0.25 s of audio per pipeline chunk
AUDIO_CHUNKS = 3
TOKENS = ("Hello", " from", " the", " stand", "-in")
TOKEN_S = 0.01  # thinker decode pace
AUDIO_CHUNK_S = 0.05  # code2wav pace: 0.25 s of audio every 0.05 s (real-time factor 0.2)
FIRST_TOKEN_S = 0.02  # thinker prefill
STAGES = ["preprocessing", "audio_encoder", "image_encoder", "mm_aggregate", "thinker", "decode", "talker_ar",
          "code_predictor", "code2wav"]  # fmt: skip
TORCH_USERS = ("torch", "torchaudio", "sglang", "sglang.utils")
"""Modules `serve.openai_api`'s imports reach with a top-level `import torch` (and torchaudio, sglang's
LazyImport) that the served routes never call: placeholders for the duration of the import."""


def import_app() -> tuple[Any, Any, Any, Any, Any]:
    added = [name for name in TORCH_USERS if name not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["sglang.utils"].LazyImport = lambda *args, **kwargs: None  # type: ignore[attr-defined]
    try:
        from sglang_omni.admission import QueueFullError
        from sglang_omni.client import Client
        from sglang_omni.proto import CompleteMessage, StreamMessage
        from sglang_omni.serve.openai_api import create_app
    finally:
        for name in added:
            sys.modules.pop(name, None)
    return create_app, Client, QueueFullError, CompleteMessage, StreamMessage


create_app, Client, QueueFullError, CompleteMessage, StreamMessage = import_app()


def waveform(n: int, start: int) -> dict[str, Any]:
    """`n` samples of a 440 Hz tone in the pipeline's own audio format."""
    t = (np.arange(n) + start) / SAMPLE_RATE
    samples = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    return {
        "audio_waveform": samples.tobytes(),
        "audio_waveform_shape": [n],
        "audio_waveform_dtype": "float32",
        "sample_rate": SAMPLE_RATE,
    }


class Script:
    """What one request does, read from its markers."""

    def __init__(self, request: Any) -> None:
        text = f"{request.inputs!r} {request.metadata!r}"
        self.tts = request.metadata.get("task") == "tts"
        self.audio = self.tts or "audio" in (request.metadata.get("output_modalities") or [])
        self.text = not self.tts
        self.prompt_tokens = max(1, len(text) // 4)
        self.pace = 10.0 if "[slow]" in text else 1.0
        self.fail_at: int | None = None  # outputs produced before it fails
        self.failure: Exception | None = None
        for marker, at, error in (
            ("[overload-mid]", 2, QueueFullError()),
            ("[overload]", 0, QueueFullError()),
            ("[fail-mid]", 2, RuntimeError("Stage thinker failed: device-side assert (stand-in)")),
            ("[fail]", 0, RuntimeError("Stage thinker failed: device-side assert (stand-in)")),
            ("[bad]", 0, ValueError("Request has no prompt tokens")),
        ):
            if marker in text:
                self.fail_at, self.failure = at, error
                break

    async def outputs(self) -> AsyncIterator[tuple[str, Any]]:
        """("text", token) and ("audio", waveform) in the pipeline's order; raises its failure on cue."""
        await asyncio.sleep(FIRST_TOKEN_S * self.pace)
        steps: list[tuple[str, Any]] = []
        if self.text:
            steps += [("text", token) for token in TOKENS]
        if self.audio:
            steps += [("audio", waveform(CHUNK_SAMPLES, i * CHUNK_SAMPLES)) for i in range(AUDIO_CHUNKS)]
        for produced, (kind, value) in enumerate(steps):
            if self.failure is not None and produced == self.fail_at:
                raise self.failure
            await asyncio.sleep((TOKEN_S if kind == "text" else AUDIO_CHUNK_S) * self.pace)
            yield kind, value

    def usage(self, started: float) -> dict[str, Any]:
        completion = len(TOKENS) if self.text else 0
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
            "engine_time_s": round(time.monotonic() - started, 6),
        }


class StandInCoordinator:
    """The coordinator interface `Client` calls: submit, stream, abort, health, get_request_info."""

    def __init__(self) -> None:
        self.running = True
        self.requests: dict[str, str] = {}  # id → state
        self.aborted: list[str] = []
        self.overloaded = False  # every request refused with a full queue before its output
        self.refused = 0

    def health(self) -> dict[str, Any]:
        states: dict[str, int] = {}
        for state in self.requests.values():
            states[state] = states.get(state, 0) + 1
        return {
            "running": self.running,
            "stages": STAGES,
            "entry_stage": "preprocessing",
            "total_requests": len(self.requests),
            "pending_completions": len(self.requests),
            "request_states": states,
        }

    def get_request_info(self, request_id: str) -> None:
        return None

    async def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        return self.requests.pop(request_id, None) is not None

    def _admit(self, request: Any) -> Script:
        if self.overloaded:
            self.refused += 1
            raise QueueFullError()
        return Script(request)

    async def submit(self, request_id: str, request: Any) -> Any:
        script = self._admit(request)
        started = time.monotonic()
        self.requests[request_id] = "running"
        try:
            text: list[str] = []
            audio: list[bytes] = []
            async for kind, value in script.outputs():
                if kind == "text":
                    text.append(value)
                else:
                    audio.append(value["audio_waveform"])
            done: dict[str, Any] = {
                "text": "".join(text),
                "finish_reason": "stop",
                "usage": script.usage(started),
            }
            if not audio:
                return done
            samples = CHUNK_SAMPLES * len(audio)
            sound = {**waveform(samples, 0), "audio_waveform": b"".join(audio)}
            if script.tts:
                return {**sound, "finish_reason": "stop", "usage": script.usage(started)}
            return {"decode": done, "code2wav": sound}
        finally:
            self.requests.pop(request_id, None)

    async def stream(self, request_id: str, request: Any) -> AsyncIterator[Any]:
        script = self._admit(request)
        started = time.monotonic()
        self.requests[request_id] = "running"
        try:
            text = ""
            async for kind, value in script.outputs():
                if kind == "text":
                    text += value
                    chunk = {"text": value}
                    stage = "decode"
                else:
                    chunk, stage = value, "code2wav"
                yield StreamMessage(request_id, stage, chunk, stage_name=stage, modality=kind)
            result = {"finish_reason": "stop", "usage": script.usage(started)}
            if script.text:
                result["text"] = text
            yield CompleteMessage(request_id, "decode", True, result=result)
            self.requests.pop(request_id, None)
        finally:
            if request_id in self.requests:  # `Coordinator.stream`'s finally: a stream left unfinished
                await self.abort(request_id)


def build(model_name: str) -> Any:
    coordinator = StandInCoordinator()
    app = create_app(Client(coordinator), model_name=model_name)

    @app.post("/standin/health")
    async def set_health(request: Request) -> JSONResponse:
        coordinator.running = bool((await request.json()).get("running"))
        return JSONResponse({"running": coordinator.running})

    @app.post("/standin/overload")
    async def set_overload(request: Request) -> JSONResponse:
        coordinator.overloaded = bool((await request.json()).get("overloaded"))
        return JSONResponse({"overloaded": coordinator.overloaded})

    @app.get("/standin/aborts")
    async def aborts() -> JSONResponse:
        return JSONResponse({"aborted": coordinator.aborted, "refused": coordinator.refused})

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model-name", default="qwen3-omni")
    parser.add_argument("--check", action="store_true", help="import the app and build it, then exit")
    args = parser.parse_args()
    if args.check:
        build(args.model_name)
        return
    uvicorn.run(build(args.model_name), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
