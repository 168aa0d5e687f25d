"""The simulated backend's HTTP surface, route for route SGLang's (../shared/REFERENCE.md).

`create_app(SimConfig)` builds one independent backend: its own engine, loop task (lifespan), faults and
metrics registry, so tests and the demo can run several in one process.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from loadtest.sim.config import SimConfig
from loadtest.sim.embeddings import Embedder
from loadtest.sim.engine import Engine
from loadtest.sim.faults import FaultInjector
from loadtest.sim.generation import Call, Generator, int_field
from loadtest.sim.memory import GIB
from loadtest.sim.metrics import SimMetrics
from loadtest.sim.radix_cache import PromptPages
from loadtest.sim.responses import error_response, json_response
from loadtest.sim.runtime import EngineRunner, VirtualClock
from loadtest.sim.tokens import PromptCount, PromptCounter, PromptError

log = logging.getLogger("loadtest.sim")
PROMETHEUS_MEDIA_TYPE = "text/plain; version=0.0.4; charset=utf-8"
CONTENT_TYPE_ERROR = (
    "[{'loc': ['header', 'content-type'], 'msg': \"Unsupported Media Type: Only 'application/json' is "
    "allowed\", 'type': 'value_error'}]"
)


class SimBackend:
    """Everything one simulated server holds; routes are its methods."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.profile = config.load_profile()
        self.model = config.model or self.profile.served_model_name
        engine_config, self.memory = config.build(self.profile)
        self.engine = Engine(engine_config, self.profile.costs, memory=self.memory)
        self.metrics = SimMetrics(
            self.model,
            memory_window_s=config.time_scale,
            legacy=config.legacy,
            priority_scheduling=config.enable_priority_scheduling,
        )
        self.faults = FaultInjector(config.faults, seed=config.seed)
        self.counter = PromptCounter(self.profile, pages=config.radix_cache)
        self.runner: EngineRunner | None = None
        self.generator: Generator | None = None
        self.embedder: Embedder | None = None
        self.clock = VirtualClock(config.time_scale)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.clock = VirtualClock(self.config.time_scale)
        self.runner = EngineRunner(self.engine, self.clock, self.metrics)
        self.generator = Generator(
            self.profile,
            self.runner,
            self.faults,
            self.config.seed,
            legacy=self.config.legacy,
            cache_report=self.config.enable_cache_report,
        )
        self.embedder = Embedder(self.counter, self.runner, self.faults, self.generator.context_len)
        self.runner.start()
        try:
            yield
        finally:
            await self.runner.stop()

    # -- generation routes ----------------------------------------------------------------------------
    async def _body(self, request: Request, openai: bool) -> dict[str, Any] | Response:
        if openai:
            media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if media != "application/json":
                return error_response(400, CONTENT_TYPE_ERROR, "Bad Request")
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"Invalid JSON body: {exc}", "Bad Request")
        if not isinstance(body, dict):
            return error_response(400, "The request body must be a JSON object.", "Bad Request")
        return body

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion")

    async def embeddings(self, request: Request) -> Response:
        body = await self._body(request, openai=True)
        if isinstance(body, Response):
            return body
        assert self.embedder is not None, "lifespan not started"
        return await self.embedder.handle(body, request)

    async def native_generate(self, request: Request) -> Response:
        return await self._generate(request, "generate")

    async def _generate(self, request: Request, kind: str) -> Response:
        body = await self._body(request, openai=kind != "generate")
        if isinstance(body, Response):
            return body
        try:
            call = self._parse(body, kind)
        except PromptError as exc:
            return error_response(exc.status, exc.message)
        assert self.generator is not None, "lifespan not started"
        return await self.generator.handle(call, request)

    def _parse(self, body: dict[str, Any], kind: str) -> Call:
        if kind == "generate":
            return self._parse_native(body)
        model = body.get("model")
        if not isinstance(model, str):
            raise PromptError("model: Field required (a string).")
        if int_field(body, "n", minimum=1) not in (None, 1):
            raise PromptError("n > 1 is not supported by the simulated backend.")
        temperature = body.get("temperature")
        if temperature is not None and not (
            isinstance(temperature, int | float)
            and not isinstance(temperature, bool)
            and math.isfinite(temperature)
            and temperature >= 0
        ):
            raise PromptError(f"temperature must be a non-negative finite number, got {temperature!r}.")
        if kind == "chat":
            prompt = self.counter.chat(body.get("messages"))
            max_new = int_field(body, "max_completion_tokens", "max_tokens")
        else:
            prompt = self._completion_prompt(body.get("prompt"))
            max_new = int_field(body, "max_tokens")
            max_new = 16 if max_new is None else max_new  # OpenAI / SGLang completions default
        options = body.get("stream_options") or {}
        return Call(
            kind=kind,
            model=model,
            prompt=prompt,
            max_new_tokens=max_new,
            ignore_eos=bool(body.get("ignore_eos", False)),
            stream=bool(body.get("stream", False)),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            priority=int_field(body, "priority", minimum=-(1 << 31)),
            rid=body.get("rid") if isinstance(body.get("rid"), str) else None,
        )

    def _completion_prompt(self, prompt: Any) -> PromptCount:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            count = PromptCount(text=self.counter.text(prompt))
            if self.config.radix_cache:
                count.pages = PromptPages()
                count.pages.text(prompt, self.counter.text)
            return count
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return PromptCount(text=len(prompt))
        raise PromptError("prompt must be a string or a list of token ids (one prompt per request).")

    def _parse_native(self, body: dict[str, Any]) -> Call:
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise PromptError("sampling_params must be an object.")
        if isinstance(body.get("text"), str):
            prompt = PromptCount(text=self.counter.text(body["text"]))
        elif isinstance(body.get("input_ids"), list):
            prompt = PromptCount(text=len(body["input_ids"]))
        else:
            raise PromptError("Either text or input_ids should be provided.")
        images = body.get("image_data")
        for item in images if isinstance(images, list) else [images] if images else []:
            self.counter._part({"type": "image_url", "image_url": {"url": item}}, prompt, "image_data")
        return Call(
            kind="generate",
            model=self.model,
            prompt=prompt,
            max_new_tokens=int_field(params, "max_new_tokens") or 128,
            ignore_eos=bool(params.get("ignore_eos", False)),
            stream=bool(body.get("stream", False)),
            include_usage=False,
            priority=int_field(body, "priority", minimum=-(1 << 31)),
            rid=body.get("rid") if isinstance(body.get("rid"), str) else None,
        )

    # -- information routes -------------------------------------------------------------------------
    def _healthy(self) -> bool:
        f = self.faults.config
        return not (f.health_failing or self.clock.now() < f.slow_start_s or self.engine.is_crashed())

    async def health(self, request: Request) -> Response:
        if self.runner is not None:
            self.runner.sync_idle_clock()
        return Response(status_code=200 if self._healthy() else 503)

    async def health_generate(self, request: Request) -> Response:
        if not self._healthy():
            return Response(status_code=503)
        call = Call("generate", self.model, PromptCount(text=1), 1, True, False, False, None)
        assert self.generator is not None
        result = await self.generator.handle(call, request)
        return Response(status_code=200 if result.status_code == 200 else 503)

    async def models(self, request: Request) -> Response:
        return json_response({"object": "list", "data": [self._model_card()]})

    async def one_model(self, request: Request) -> Response:
        if request.path_params["model"] != self.model:
            return error_response(404, f"The model `{request.path_params['model']}` does not exist.")
        return json_response(self._model_card())

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.model,
            "parent": None,
            "max_model_len": self.profile.context_length,
        }

    def _server_args(self) -> dict[str, Any]:
        """The ServerArgs fields a client of SGLang 0.5.9 reads, as the simulated server runs them."""
        cfg, c = self.engine.config, self.config
        return {
            "model_path": self.profile.model_path,
            "served_model_name": self.model,
            "context_length": self.profile.context_length,
            "max_running_requests": cfg.max_running_requests,
            "max_total_tokens": c.max_total_tokens,
            "max_prefill_tokens": cfg.max_prefill_tokens,
            "chunked_prefill_size": cfg.chunked_prefill_size,
            "mem_fraction_static": self.memory.mem_fraction_static,
            "cuda_graph_max_bs": self.profile.memory.cuda_graph_max_bs,
            "schedule_policy": cfg.schedule_policy,
            "enable_priority_scheduling": cfg.enable_priority_scheduling,
            "schedule_low_priority_values_first": cfg.schedule_low_priority_values_first,
            "priority_scheduling_preemption_threshold": cfg.priority_scheduling_preemption_threshold,
            "schedule_conservativeness": cfg.schedule_conservativeness,
            "max_queued_requests": cfg.max_queued_requests,
            "enable_metrics": True,
            "tp_size": 1,
            "dp_size": 1,
            "sim_profile": self.profile.name,
            "sim_time_scale": c.time_scale,
            "sim_oom_mode": cfg.oom_mode,
        }

    async def server_info(self, request: Request) -> Response:
        """SGLang 0.5.9's /server_info: server args, the scheduler's init info, per-DP internal states."""
        args = self._server_args()
        m = self.memory
        internal = {
            **args,
            "last_gen_throughput": round(self.engine.gen_throughput(), 2),
            "memory_usage": {
                "weight": round(m.weight_bytes / GIB, 2),
                "kvcache": round(m.pool_tokens * m.kv_bytes_per_token / GIB, 2),
                "token_capacity": m.pool_tokens,
                "graph": round(m.graph_bytes / GIB, 2),
            },
            "effective_max_running_requests_per_dp": self.engine.config.max_running_requests,
        }
        return json_response(
            {
                **args,
                "status": "ready",
                "max_total_num_tokens": m.pool_tokens,
                "max_req_input_len": self.profile.context_length - 1,
                "internal_states": [internal],
                "version": self.config.sglang_version,
            }
        )

    async def get_server_info(self, request: Request) -> Response:
        """Deprecated in SGLang 0.5.9: same answer, one warning per call."""
        log.warning(
            "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
            "Please use '/server_info' instead."
        )
        return await self.server_info(request)

    async def model_info(self, request: Request) -> Response:
        return json_response(
            {
                "model_path": self.profile.model_path,
                "tokenizer_path": self.profile.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": True,
                "has_audio_understanding": True,
                "model_type": self.profile.model_type,
                "architectures": self.profile.architectures,
            }
        )

    async def get_load(self, request: Request) -> Response:
        e = self.engine
        return json_response(
            [
                {
                    "num_reqs": e.num_running + len(e.waiting),
                    "num_waiting_reqs": len(e.waiting),
                    "num_tokens": e.used_tokens,
                    "dp_rank": 0,
                }
            ]
        )

    async def loads(self, request: Request) -> Response:
        """SGLang 0.5.23's /v1/loads: per DP rank, the counts 0.5.23 reports that the model has (no
        disaggregation; the prefix cache's hit rate with `--radix-cache`); 0.5.9's shorter document with
        `--sglang-version 0.5.9`."""
        e, m = self.engine, self.memory
        total = e.config.max_total_tokens
        load: dict[str, Any] = {
            "dp_rank": 0,
            "num_running_reqs": e.num_running,
            "num_waiting_reqs": len(e.waiting),
            "num_used_tokens": e.used_tokens,
            "max_total_num_tokens": total,
            "token_usage": round(e.used_tokens / total, 4),
            "gen_throughput": round(e.gen_throughput(), 2),
            "cache_hit_rate": round(e.cache.hit_rate, 4) if e.cache else 0.0,
            "max_running_requests": e.config.max_running_requests,
        }
        if self.config.legacy:
            return json_response({"timestamp": time.time(), "dp_rank_count": 1, "loads": [load]})
        load.update(
            timestamp=time.time(),
            num_total_tokens=e.used_tokens,
            num_active_tokens=e.used_tokens,
            utilization=0.0,
            memory={
                "weight_gb": round(m.weight_bytes / 1e9, 3),
                "kv_cache_gb": round(m.pool_tokens * m.kv_bytes_per_token / 1e9, 3),
                "graph_gb": round(m.graph_bytes / 1e9, 3),
                "token_capacity": m.pool_tokens,
            },
            queues={
                "waiting": len(e.waiting),
                "grammar": 0,
                "paused": 0,
                "retracted": 0,
                "prealloc_ready": 0,
            },
        )
        return json_response(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": self.config.sglang_version,
                "accelerator": None,
                "num_accelerators": 1,
                "loads": [load],
            }
        )

    async def abort_request(self, request: Request) -> Response:
        body = await self._body(request, openai=False)
        if isinstance(body, Response):
            return body
        assert self.runner is not None
        if body.get("abort_all"):
            for rid in list(self.runner.handles):
                self.runner.abort(rid)
        elif isinstance(body.get("rid"), str):
            self.runner.abort(body["rid"])
        return Response(status_code=200)

    async def work(self, request: Request) -> Response:
        assert self.generator is not None
        return json_response(self.generator.work_report())

    async def prometheus(self, request: Request) -> Response:
        peak = 0 if self.runner is None else self.runner.peak_requests
        return Response(self.metrics.render(self.engine, peak), media_type=PROMETHEUS_MEDIA_TYPE)

    async def get_faults(self, request: Request) -> Response:
        return json_response(self.faults.config.model_dump())

    async def set_faults(self, request: Request) -> Response:
        body = await self._body(request, openai=False)
        if isinstance(body, Response):
            return body
        try:
            return json_response(self.faults.update(body).model_dump())
        except ValidationError as exc:
            message = f"Invalid fault settings: {exc.errors(include_url=False)}"
            return error_response(400, message, "Bad Request")


def create_app(config: SimConfig | None = None) -> Starlette:
    sim = SimBackend(config or SimConfig())
    routes = [
        Route("/v1/chat/completions", sim.chat, methods=["POST"]),
        Route("/v1/completions", sim.completions, methods=["POST"]),
        Route("/v1/embeddings", sim.embeddings, methods=["POST"]),
        Route("/generate", sim.native_generate, methods=["POST"]),
        Route("/v1/models", sim.models, methods=["GET"]),
        Route("/v1/models/{model:path}", sim.one_model, methods=["GET"]),
        Route("/health", sim.health, methods=["GET"]),
        Route("/health_generate", sim.health_generate, methods=["GET"]),
        Route("/get_server_info", sim.get_server_info, methods=["GET"]),
        Route("/server_info", sim.server_info, methods=["GET"]),
        Route("/get_model_info", sim.model_info, methods=["GET"]),
        Route("/model_info", sim.model_info, methods=["GET"]),
        Route("/get_load", sim.get_load, methods=["GET"]),
        Route("/v1/loads", sim.loads, methods=["GET"]),
        Route("/abort_request", sim.abort_request, methods=["POST"]),
        Route("/metrics", sim.prometheus, methods=["GET"]),
        Route("/admin/faults", sim.get_faults, methods=["GET"]),
        Route("/sim/work", sim.work, methods=["GET"]),
        Route("/admin/faults", sim.set_faults, methods=["POST"]),
    ]
    app = Starlette(routes=routes, lifespan=sim.lifespan)
    app.state.sim = sim
    return app
