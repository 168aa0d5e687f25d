"""Starlette app factory: routes, lifespan (pools, monitors, policy reloader), and the pipeline's stages."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin_auth import require_admin
from gateway.backends.pool import Pool
from gateway.backends.select import Lease, LeastOutstanding
from gateway.config import GatewayConfig
from gateway.errors import ApiError
from gateway.observability import metrics
from gateway.openai_api import ParsedRequest
from gateway.pipeline import CompletionEndpoint
from gateway.policy import Policy
from gateway.reloader import PolicyHolder
from gateway.ticket import Ticket

log = logging.getLogger("omnigate")


class Gateway:
    """Everything one replica holds: config, live policy, pools and their dispatchers."""

    def __init__(self, config: GatewayConfig, policy: PolicyHolder | None = None) -> None:
        self.config = config
        self.policy = policy or PolicyHolder(config.policy_path)
        self.admin_token = config.admin.resolve_token()
        self.pools = {p.name: Pool(p, self.policy) for p in config.pools}
        self.dispatchers = {name: LeastOutstanding(pool) for name, pool in self.pools.items()}
        self.models: dict[str, list[Pool]] = {}
        for pool in self.pools.values():
            for model in pool.config.models:
                self.models.setdefault(model, []).append(pool)

    # -- the request's stages -------------------------------------------------------------------------
    def route(self, model: str, traffic_class: str | None, policy: Policy) -> Pool:
        pools = self.models.get(model)
        if not pools:
            raise ApiError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")
        if traffic_class is not None:
            wanted = policy.queue.classes.get(traffic_class)
            target = wanted.pool if wanted and wanted.pool else traffic_class
            for pool in pools:
                if pool.name == target or pool.config.traffic_class == traffic_class:
                    return pool
        return pools[0]

    async def admit(self, ticket: Ticket, parsed: ParsedRequest, request: Request, policy: Policy) -> Pool:
        """Classify the request and place it on a pool; later stages (quota, queue) hang off this."""
        requested_class = request.headers.get("x-omnigate-class")
        if requested_class is not None and requested_class not in policy.queue.classes:
            raise ApiError(
                400,
                f"Unknown traffic class '{requested_class}'.",
                param="x-omnigate-class",
                code="invalid_traffic_class",
            )
        pool = self.route(parsed.model, requested_class, policy)
        ticket.pool = pool.name
        ticket.traffic_class = requested_class or pool.config.traffic_class or pool.name
        ticket.job_id = request.headers.get("x-omnigate-job")
        return pool

    def release(self, ticket: Ticket, lease: Lease) -> None:
        ttft = (ticket.first_token_at - ticket.arrival) if ticket.first_token_at else None
        lease.release(ticket.usage, ticket.outcome, ttft, _tpot(ticket))

    def finish(self, ticket: Ticket) -> None:
        if ticket.finished_at is None:
            ticket.finished_at = time.monotonic()
        if ticket.outcome == "pending":
            ticket.outcome = "ok"
        labels = (ticket.pool or "none", ticket.traffic_class)
        metrics.REQUESTS.labels(
            *labels, ticket.tenant, ticket.bucket, str(ticket.priority), ticket.outcome
        ).inc()
        if ticket.outcome == "ok" and ticket.pool:
            if ticket.first_token_at is not None:
                metrics.TTFT.labels(*labels).observe(ticket.first_token_at - ticket.arrival)
            tpot = _tpot(ticket)
            if tpot is not None:
                metrics.TPOT.labels(*labels).observe(tpot)
            metrics.E2E.labels(*labels).observe(ticket.finished_at - ticket.arrival)
        elif ticket.outcome == "cancelled" and ticket.pool:
            metrics.CLIENT_DISCONNECTS.labels(ticket.pool).inc()

    def client_headers(self, ticket: Ticket) -> dict[str, str]:
        return {
            "x-omnigate-pool": ticket.pool,
            "x-omnigate-backend": ticket.backend or "",
            "x-omnigate-queue-ms": f"{ticket.queue_seconds * 1000:.1f}",
            "x-omnigate-bucket": ticket.bucket,
            "x-omnigate-priority": str(ticket.priority),
            "x-omnigate-estimated-tokens": str(ticket.cost.total_tokens),
        }

    def access_fields(self, ticket: Ticket) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "backend": ticket.backend,
            "outcome": ticket.outcome,
            "error_code": ticket.error_code,
            "queue_ms": round(ticket.queue_seconds * 1000, 2),
            "estimated_tokens": ticket.cost.total_tokens,
        }
        if ticket.first_token_at is not None:
            fields["ttft_ms"] = round((ticket.first_token_at - ticket.arrival) * 1000, 2)
        tpot = _tpot(ticket)
        if tpot is not None:
            fields["tpot_ms"] = round(tpot * 1000, 3)
        if ticket.usage is not None:
            fields["prompt_tokens"] = ticket.usage.prompt_tokens
            fields["completion_tokens"] = ticket.usage.completion_tokens
        return fields

    # -- lifecycle ------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        for pool in self.pools.values():
            await pool.start()
        try:
            async with anyio.create_task_group() as tg:
                for pool in self.pools.values():
                    tg.start_soon(pool.monitor)
                if self.config.watch_policy:
                    tg.start_soon(self.policy.watch_file)
                tg.start_soon(self.policy.watch_sighup)
                yield
                tg.cancel_scope.cancel()
        finally:
            for pool in self.pools.values():
                await pool.close()


def _tpot(ticket: Ticket) -> float | None:
    """(E2E − TTFT) / (N − 1), the field's definition; None when fewer than two tokens were generated."""
    if ticket.usage is None or ticket.first_token_at is None or ticket.finished_at is None:
        return None
    n = ticket.usage.completion_tokens
    if n < 2:
        return None
    return (ticket.finished_at - ticket.first_token_at) / (n - 1)


# -- plain routes ------------------------------------------------------------------------------------------
def _routes(gw: Gateway) -> list[Route]:
    async def models(request: Request) -> Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "omnigate"} for m in sorted(gw.models)]
        return JSONResponse({"object": "list", "data": data})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        pools = {name: pool.ready() for name, pool in gw.pools.items()}
        ok = all(pools.values())
        return JSONResponse({"ready": ok, "pools": pools}, status_code=200 if ok else 503)

    async def prom(request: Request) -> Response:
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
        pools = {
            name: [
                {
                    "backend": pool.backend_id(b),
                    "healthy": b.healthy,
                    "circuit": b.circuit,
                    "active": b.active,
                    "token_usage": b.token_usage,
                    "running": b.running_reqs,
                    "queued": b.queue_reqs,
                }
                for b in pool.backends
            ]
            for name, pool in gw.pools.items()
        }
        return JSONResponse({"pools": pools})

    return [
        Route(
            "/v1/chat/completions", CompletionEndpoint(gw, "chat", "/v1/chat/completions"), methods=["POST"]
        ),
        Route("/v1/completions", CompletionEndpoint(gw, "completions", "/v1/completions"), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", prom, methods=["GET"]),
        Route("/admin/policy/reload", policy_reload, methods=["POST"]),
        Route("/admin/policy", policy_get, methods=["GET"]),
        Route("/admin/state", state, methods=["GET"]),
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
    status = getattr(exc, "status_code", 500)
    detail = getattr(exc, "detail", None) or "Request failed."
    code = {404: "not_found", 405: "method_not_allowed"}.get(status, "http_error")
    return await _api_error(request, ApiError(status, str(detail), code=code))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s", request.url.path)
    return await _api_error(request, ApiError(500, "Internal gateway error.", code="internal_error"))


def create_app(config: GatewayConfig, policy: PolicyHolder | None = None) -> Starlette:
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware

    from gateway.asgi import RequestIdMiddleware

    gw = Gateway(config, policy)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with gw.running():
            yield

    app = Starlette(
        routes=_routes(gw),
        middleware=[Middleware(RequestIdMiddleware, enabled_log=config.access_log)],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error, Exception: _unexpected},
        lifespan=lifespan,
    )
    app.state.gateway = gw
    return app
