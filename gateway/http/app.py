"""Starlette app factory: routes, error rendering and the lifespan that runs one Gateway replica."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http.asgi import RequestIdMiddleware
from gateway.http.model_list import model_card, model_cards
from gateway.http.pipeline import CompletionEndpoint
from gateway.livepolicy.reloader import PolicyHolder
from gateway.observability import metrics
from gateway.process.replica import Gateway
from gateway.request.admin_auth import require_admin
from gateway.request.errors import ApiError, ErrorCode
from gateway.request.openai_api import Endpoint
from gateway.settings.config import GatewayConfig
from gateway.tenants.admin import admin_routes, usage_route

log = logging.getLogger("omnigate")

_ADMIN_OPENAPI: dict[str, Any] = {
    "/policy": {
        "get": {
            "summary": "The running policy, its file and the last reload error",
            "responses": {"200": {"description": "OK"}},
        }
    },
    "/policy/reload": {
        "post": {
            "summary": "Reload the policy file (validated fully before the swap)",
            "responses": {
                "200": {"description": "applied or unchanged"},
                "400": {"description": "invalid; the running policy stays"},
            },
        }
    },
    "/state": {
        "get": {
            "summary": "Live queue, window, concurrency limits and budgets per pool and backend",
            "responses": {"200": {"description": "OK"}},
        }
    },
}


def _completion(gw: Gateway, endpoint: Endpoint, path: str) -> ASGIApp:
    """The endpoint of one OpenAI route, inside its trace span when tracing is on (decided here, once)."""
    app = CompletionEndpoint(gw, endpoint, path)
    return app if gw.tracing is None else gw.tracing.serve(app)


def _routes(gw: Gateway) -> list[BaseRoute]:
    async def models(request: Request) -> Response:
        await gw.authenticate(request)  # like OpenAI: the model list is for key holders
        data = model_cards(gw.router.models, gw.policy.current.model_aliases)
        return JSONResponse({"object": "list", "data": data})

    async def one_model(request: Request) -> Response:
        await gw.authenticate(request)
        model_id = request.path_params["model"]
        return JSONResponse(model_card(model_id, gw.router.models, gw.policy.current.model_aliases))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        """Every pool has a backend up, the replica is not draining (SIGTERM: gateway/process/drain.py), and
        the tenant store is usable (or down under fail-open: the replica serves under local limits)."""
        pools = {name: pool.ready() for name, pool in gw.pools.items()}
        store_ok, store = gw.tenants.readiness()
        ok = all(pools.values()) and not gw.drain.draining and store_ok
        body = {"ready": ok, "draining": gw.drain.draining, "pools": pools, "store": store}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def prom(request: Request) -> Response:
        gw.live.export_gauges()
        return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)

    async def policy_reload(request: Request) -> Response:
        require_admin(request, gw.admin_token)
        result = await gw.policy.reload()
        body = {"result": result.result, "changes": result.changes, "error": result.error}
        return JSONResponse(body, status_code=400 if result.result == "invalid" else 200)

    async def policy_get(request: Request) -> Response:
        require_admin(request, gw.admin_token)
        return JSONResponse(
            {
                "path": str(gw.policy.path) if gw.policy.path else None,
                "last_error": gw.policy.last_error,
                "policy": gw.policy.current.model_dump(mode="json"),
            }
        )

    async def state(request: Request) -> Response:
        require_admin(request, gw.admin_token)
        return JSONResponse({**gw.live.admin_state(), "store": gw.tenants.admin_view()})

    return [
        Route("/v1/chat/completions", _completion(gw, "chat", "/v1/chat/completions"), methods=["POST"]),
        Route("/v1/completions", _completion(gw, "completions", "/v1/completions"), methods=["POST"]),
        Route("/v1/embeddings", _completion(gw, "embeddings", "/v1/embeddings"), methods=["POST"]),
        Route("/v1/audio/speech", _completion(gw, "speech", "/v1/audio/speech"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", one_model, methods=["GET"]),
        usage_route(gw.tenants),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", prom, methods=["GET"]),
        Mount(
            "/admin",
            routes=admin_routes(
                gw.tenants,
                gw.admin_token,
                extra_openapi_paths=_ADMIN_OPENAPI,
                openapi_public=gw.config.admin.openapi_public,
                extra_routes=[
                    Route("/policy/reload", policy_reload, methods=["POST"]),
                    Route("/policy", policy_get, methods=["GET"]),
                    Route("/state", state, methods=["GET"]),
                ],
            ),
        ),
    ]


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return Response(
        exc.body_bytes(),
        status_code=exc.status,
        media_type="application/json",
        headers=exc.response_headers(),
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (404, 405) in the OpenAI error shape, with their headers (`Allow`)."""
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or "Request failed."
    code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(status, ErrorCode.HTTP_ERROR)
    response = await _api_error(request, ApiError(status, str(detail), code=code))
    response.headers.update(getattr(exc, "headers", None) or {})
    return response


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return await _api_error(request, ApiError(500, "Internal gateway error.", code=ErrorCode.INTERNAL_ERROR))


class GatewayApp(Starlette):
    """Starlette, with a short way for the completion routes: a POST to one goes to its endpoint behind
    the request-id middleware only. The endpoint answers every error itself, so Starlette's error
    middlewares, its router and their wrapper around every `send` (~5 % of a whole request's CPU) do
    nothing for it; any other request (a GET on a completion route too: 405) takes Starlette's way."""

    def __init__(self, *args: Any, fast: dict[str, Route], access_log: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fast = {
            path: (route, RequestIdMiddleware(route.endpoint, enabled_log=access_log))
            for path, route in fast.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fast = (
            self._fast.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        )
        if fast is None or scope.get("root_path"):
            await super().__call__(scope, receive, send)
            return
        # the app and the route in the scope as Starlette's router leaves them (metrics label by the path)
        scope["app"], scope["route"] = self, fast[0]
        await fast[1](scope, receive, send)


def create_app(config: GatewayConfig, policy: PolicyHolder | None = None) -> Starlette:
    gw = Gateway(config, policy)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with gw.running():
            yield

    routes = _routes(gw)
    completions = {
        r.path: r for r in routes if isinstance(r, Route) and isinstance(r.endpoint, CompletionEndpoint)
    }
    app = GatewayApp(
        routes=routes,
        middleware=[Middleware(RequestIdMiddleware, enabled_log=config.access_log)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
        lifespan=lifespan,
        fast=completions,
        access_log=config.access_log,
    )
    app.state.gateway = gw
    return app
