"""Admin routes for tenants, keys and usage (mount under /admin), and the tenant-facing /v1/usage route.

Every admin route checks the admin bearer token first (constant time, gateway/request/admin_auth.py), so a
tenant key gets 403 there. The tenant route answers only for the key's own tenant: there is no tenant id to
pass. Requests and answers are the pydantic models /admin/openapi.json publishes (gateway/tenants/openapi.py);
bodies parse strictly (no true for 1, no "3" for 3). One route per path carries all its methods, so a
method it lacks gets 405 with `Allow` naming the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.request.admin_auth import require_admin
from gateway.tenants.http import Endpoint, int_query, json_response, parse_body, rendering_errors
from gateway.tenants.models import (
    Deleted,
    KeyCreate,
    KeyCreated,
    KeyList,
    QuotasPatch,
    TenantCreate,
    TenantList,
    TenantPatch,
    TenantSpec,
    TenantView,
)
from gateway.tenants.openapi import openapi_document
from gateway.tenants.service import TenantService
from gateway.tenants.usage import MAX_HISTORY_DAYS


def _admin(token: str | None, handler: Endpoint) -> Endpoint:
    async def guarded(request: Request) -> Response:
        require_admin(request, token)
        return await handler(request)

    return rendering_errors(guarded)


def _model(data: BaseModel, status: int = 200) -> Response:
    return json_response(data.model_dump(mode="json"), status)


def _path(path: str, token: str | None, **handlers: Endpoint) -> Route:
    """One route for every method of `path` (keyword = method); HEAD is answered as GET."""
    guarded = {method.upper(): _admin(token, handler) for method, handler in handlers.items()}

    async def endpoint(request: Request) -> Response:
        handler = guarded.get(request.method) or guarded["GET"]
        return await handler(request)

    return Route(path, endpoint, methods=list(guarded))


def admin_routes(
    service: TenantService,
    admin_token: str | None,
    extra_openapi_paths: dict[str, Any] | None = None,
    openapi_public: bool = False,
    extra_routes: Sequence[BaseRoute] = (),
) -> list[BaseRoute]:
    """Routes relative to the /admin mount. `extra_routes` are the gateway's own admin routes (e.g.
    /policy/reload, /state), `extra_openapi_paths` their part of /admin/openapi.json, keyed like the
    paths here; that document maps the admin surface, so it takes the admin token too unless
    `openapi_public`."""

    def view(spec: TenantSpec) -> TenantView:
        return TenantView(**dict(spec), effective=service.resolve(spec))

    async def list_tenants(request: Request) -> Response:
        return _model(TenantList(data=[view(t) for t in await service.list_tenants()]))

    async def create_tenant(request: Request) -> Response:
        spec = await service.create_tenant(await parse_body(request, TenantCreate))
        return _model(view(spec), 201)

    async def get_tenant(request: Request) -> Response:
        return _model(view(await service.get_tenant(request.path_params["tenant_id"])))

    async def update_tenant(request: Request) -> Response:
        patch = await parse_body(request, TenantPatch)
        return _model(view(await service.update_tenant(request.path_params["tenant_id"], patch)))

    async def patch_quotas(request: Request) -> Response:
        patch = TenantPatch(quotas=await parse_body(request, QuotasPatch))
        spec = await service.update_tenant(request.path_params["tenant_id"], patch)
        return _model(spec.quotas)

    async def delete_tenant(request: Request) -> Response:
        await service.delete_tenant(request.path_params["tenant_id"])
        return _model(Deleted(id=request.path_params["tenant_id"]))

    async def list_keys(request: Request) -> Response:
        keys = await service.list_keys(request.path_params["tenant_id"])
        return _model(KeyList(data=[k.public() for k in keys]))

    async def create_key(request: Request) -> Response:
        body = await parse_body(request, KeyCreate, empty_ok=True)
        record, plaintext = await service.create_key(request.path_params["tenant_id"], body.name)
        return _model(KeyCreated(**dict(record.public()), key=plaintext), 201)

    async def revoke_key(request: Request) -> Response:
        p = request.path_params
        return _model((await service.revoke_key(p["tenant_id"], p["key_id"])).public())

    async def usage(request: Request) -> Response:
        days = int_query(request, "days", 7, 1, MAX_HISTORY_DAYS)
        return json_response(await service.usage(request.path_params["tenant_id"], days))

    document = openapi_document(extra_openapi_paths)

    async def openapi(request: Request) -> Response:
        return json_response(document)

    token = admin_token
    return [
        *extra_routes,
        _path("/tenants", token, get=list_tenants, post=create_tenant),
        _path("/tenants/{tenant_id}", token, get=get_tenant, patch=update_tenant, delete=delete_tenant),
        _path("/tenants/{tenant_id}/quotas", token, patch=patch_quotas),
        _path("/tenants/{tenant_id}/keys", token, get=list_keys, post=create_key),
        _path("/tenants/{tenant_id}/keys/{key_id}", token, delete=revoke_key),
        _path("/tenants/{tenant_id}/usage", token, get=usage),
        Route("/openapi.json", openapi if openapi_public else _admin(admin_token, openapi), methods=["GET"]),
    ]


def usage_route(service: TenantService, path: str = "/v1/usage") -> Route:
    """GET the caller's own usage, authenticated by its tenant key."""

    async def own_usage(request: Request) -> Response:
        tenant = await service.authenticate(request.headers.get("authorization"))
        days = int_query(request, "days", 7, 1, MAX_HISTORY_DAYS)
        return json_response(await service.usage(tenant.id, days))

    return Route(path, rendering_errors(own_usage), methods=["GET"])
