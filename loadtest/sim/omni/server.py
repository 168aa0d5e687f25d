"""The simulated sglang-omni server's HTTP surface, route for route `serve/openai_api.py` (README: omni).

`create_app(OmniConfig)` builds one independent server (pipeline, loop task, faults, metrics) so tests and the
demo can run several in one process. Routes the real server lacks answer FastAPI's 404 `{"detail":"Not
Found"}`. The simulator's own routes live under `/sim/omni/` (accounting) and `/admin/faults`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loadtest.sim.faults import FaultInjector
from loadtest.sim.omni import speech_api
from loadtest.sim.omni.config import OmniConfig
from loadtest.sim.omni.generation import Generator
from loadtest.sim.omni.metrics import PROMETHEUS_MEDIA_TYPE, HttpMetricsMiddleware, OmniMetrics
from loadtest.sim.omni.pipeline import PREPROCESSING
from loadtest.sim.omni.protocol import ChatCompletionRequest, CreateSpeechRequest, parse_body
from loadtest.sim.omni.responses import detail_response, json_response
from loadtest.sim.omni.runner import PipelineRunner
from loadtest.sim.runtime import VirtualClock


class OmniBackend:
    """Everything one simulated sglang-omni server holds; routes are its methods."""

    def __init__(self, config: OmniConfig) -> None:
        self.config = config
        self.profile = config.load_profile()
        self.model = config.model or self.profile.served_model_name
        self.pipeline = config.pipeline(self.profile)
        self.faults = FaultInjector(config.faults, seed=config.seed)
        self.metrics = OmniMetrics(self.model) if config.enable_metrics else None
        self.clock = VirtualClock(config.time_scale)
        self.runner = PipelineRunner(self.pipeline, self.clock)
        self.generator = self._generator()

    def _generator(self) -> Generator:
        c = self.config
        return Generator(
            self.profile, c.behaviour, self.runner, self.faults, self.model, c.speech_route, c.seed
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.clock = VirtualClock(self.config.time_scale)
        self.runner = PipelineRunner(self.pipeline, self.clock)
        self.generator = self._generator()
        self.generator.metrics = self.metrics
        self.runner.start()
        try:
            yield
        finally:
            await self.runner.stop()

    # -- generation ---------------------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        body = parse_body(await request.body(), request.headers.get("content-type"), ChatCompletionRequest)
        if isinstance(body, list):
            return detail_response(422, body)
        return await self.generator.chat(body, request.is_disconnected)

    async def speech(self, request: Request) -> Response:
        """The snapshot validates the body as FastAPI does (422); 0.1.9 reads any JSON and answers 400 in
        OpenAI's envelope."""
        later = self.config.behaviour.in_band_failures
        body = parse_body(
            await request.body(),
            "application/json" if later else request.headers.get("content-type"),
            CreateSpeechRequest,
        )
        if isinstance(body, list):
            return speech_api.parse_errors(body) if later else detail_response(422, body)
        return await self.generator.speech(body, request.is_disconnected)

    async def speech_outcome(self, request: Request) -> Response:
        """GET /v1/audio/speech/{id}: a finished PCM stream's finish reason and usage (0.1.9)."""
        request_id = request.path_params["request_id"]
        outcome = self.generator.outcomes.get(request_id)
        if outcome is None:
            return detail_response(404, f"No finished speech stream with request id {request_id}")
        return json_response(outcome)

    # -- information ----------------------------------------------------------------------------------------
    def health_info(self) -> dict[str, Any]:
        """Coordinator.health(): whole-pipeline in-flight counts (finished requests are dropped)."""
        f = self.faults.config
        tracked = self.runner.tracked
        return {
            "running": not (f.health_failing or self.clock.now() < f.slow_start_s),
            "stages": list(self.pipeline.stage_names),
            "entry_stage": PREPROCESSING,
            "total_requests": tracked,
            "pending_completions": self.runner.pending_completions,
            "request_states": {"running": tracked} if tracked else {},
        }

    async def health(self, request: Request) -> Response:
        info = self.health_info()
        status = "healthy" if info["running"] else "unhealthy"
        return json_response({"status": status, **info}, 200 if info["running"] else 503)

    async def models(self, request: Request) -> Response:
        permission = {
            "id": "modelperm-default",
            "object": "model_permission",
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
        }
        card = {
            "id": self.model,
            "object": "model",
            "created": 0,
            "owned_by": "sglang-omni",
            "permission": [permission],
            "root": self.model,
        }
        return json_response({"object": "list", "data": [card]})

    async def prometheus(self, request: Request) -> Response:
        assert self.metrics is not None
        self.metrics.update_from_health(self.health_info())
        return Response(self.metrics.render(), media_type=PROMETHEUS_MEDIA_TYPE)

    # -- the simulator's own routes ---------------------------------------------------------------------
    async def accounting(self, request: Request) -> Response:
        """Per-request and total thinker/talker tokens and audio seconds, and per-stage load: the numbers the
        real server never exposes, for tests and benchmarks (virtual seconds)."""
        limit = request.query_params.get("limit")
        recent = list(self.pipeline.recent)
        if limit is not None and limit.isdigit():
            recent = recent[len(recent) - int(limit) :] if int(limit) else []
        t = self.pipeline.totals
        totals = {
            "submitted": t.submitted,
            "finished": t.finished,
            "failed": t.failed,
            "aborted": t.aborted,
            "thinker_tokens": t.thinker_tokens,
            "talker_tokens": t.talker_tokens,
            "audio_seconds": round(t.audio_seconds, 6),
        }
        return json_response(
            {
                "release": self.config.release,
                "pipeline": "speech" if self.pipeline.speech else "text",
                "now": round(self.clock.now(), 6),
                "tracked": self.runner.tracked,
                "totals": totals,
                "stages": self.pipeline.stage_state(),
                "requests": recent,
            }
        )

    async def get_faults(self, request: Request) -> Response:
        return json_response(self.faults.config.model_dump())

    async def set_faults(self, request: Request) -> Response:
        """A partial change of the fault settings, validated as a whole (the plain simulator's contract)."""
        try:
            body = json.loads(await request.body() or b"null")
        except json.JSONDecodeError as exc:
            return detail_response(400, f"Invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return detail_response(400, "The request body must be a JSON object.")
        try:
            return json_response(self.faults.update(body).model_dump())
        except ValidationError as exc:
            return detail_response(
                400, f"Invalid fault settings: {exc.errors(include_url=False, include_context=False)}"
            )


async def _http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's handler: `{"detail": …}` with the exception's status and headers (404, 405, …)."""
    assert isinstance(exc, HTTPException)
    return detail_response(exc.status_code, exc.detail, dict(exc.headers or {}))


def create_app(config: OmniConfig | None = None) -> Starlette:
    omni = OmniBackend(config or OmniConfig())
    routes = [
        Route("/health", omni.health, methods=["GET"]),
        Route("/v1/models", omni.models, methods=["GET"]),
        Route("/v1/chat/completions", omni.chat, methods=["POST"]),
        Route("/v1/audio/speech", omni.speech, methods=["POST"]),
        *(
            [Route("/v1/audio/speech/{request_id}", omni.speech_outcome, methods=["GET"])]
            if omni.config.behaviour.in_band_failures
            else []
        ),
        Route("/sim/omni/accounting", omni.accounting, methods=["GET"]),
        Route("/admin/faults", omni.get_faults, methods=["GET"]),
        Route("/admin/faults", omni.set_faults, methods=["POST"]),
    ]
    middleware: list[Middleware] = []
    if omni.metrics is not None:
        routes.append(Route("/metrics", omni.prometheus, methods=["GET"]))
        paths = {r.path for r in routes}
        middleware.append(
            Middleware(
                HttpMetricsMiddleware, metrics=omni.metrics, routes=paths, now=lambda: omni.clock.now()
            )
        )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=omni.lifespan,
        exception_handlers={HTTPException: _http_error},
    )
    app.state.omni = omni
    return app
