"""Admin routes for tenants, keys and usage (mount under /admin), and the tenant-facing /v1/usage route.

Every admin route checks the admin bearer token first (constant time, gateway/admin_auth.py), so a tenant
key gets 403 there. The tenant route answers only for the key's own tenant: there is no tenant id to pass.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from gateway.admin_auth import require_admin
from gateway.tenants.http import Endpoint, int_query, json_response, parse_body, rendering_errors
from gateway.tenants.models import QuotasPatch, TenantCreate, TenantPatch, TenantSpec
from gateway.tenants.openapi import openapi_document
from gateway.tenants.service import TenantService
from gateway.tenants.usage import MAX_HISTORY_DAYS


class KeyCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="", max_length=200)


def _admin(token: str | None, handler: Endpoint) -> Endpoint:
    async def guarded(request: Request) -> Response:
        require_admin(request, token)
        return await handler(request)

    return rendering_errors(guarded)


def admin_routes(
    service: TenantService,
    admin_token: str | None,
    extra_openapi_paths: dict[str, Any] | None = None,
    openapi_public: bool = False,
) -> list[BaseRoute]:
    """Routes relative to the /admin mount. `extra_openapi_paths` adds the gateway's own admin routes
    (e.g. /policy/reload, /state) to /admin/openapi.json, keyed like the paths here; that document maps
    the admin surface, so it takes the admin token too unless `openapi_public`."""

    def tenant_json(spec: TenantSpec) -> dict[str, Any]:
        return {**spec.model_dump(mode="json"), "effective": service.resolve(spec).model_dump(mode="json")}

    async def list_tenants(request: Request) -> Response:
        return json_response(
            {"object": "list", "data": [tenant_json(t) for t in await service.list_tenants()]}
        )

    async def create_tenant(request: Request) -> Response:
        spec = await service.create_tenant(await parse_body(request, TenantCreate))
        return json_response(tenant_json(spec), 201)

    async def get_tenant(request: Request) -> Response:
        return json_response(tenant_json(await service.get_tenant(request.path_params["tenant_id"])))

    async def update_tenant(request: Request) -> Response:
        patch = await parse_body(request, TenantPatch)
        return json_response(
            tenant_json(await service.update_tenant(request.path_params["tenant_id"], patch))
        )

    async def patch_quotas(request: Request) -> Response:
        patch = TenantPatch(quotas=await parse_body(request, QuotasPatch))
        spec = await service.update_tenant(request.path_params["tenant_id"], patch)
        return json_response(spec.quotas.model_dump())

    async def delete_tenant(request: Request) -> Response:
        await service.delete_tenant(request.path_params["tenant_id"])
        return json_response({"id": request.path_params["tenant_id"], "deleted": True})

    async def list_keys(request: Request) -> Response:
        keys = await service.list_keys(request.path_params["tenant_id"])
        return json_response({"object": "list", "data": [k.public() for k in keys]})

    async def create_key(request: Request) -> Response:
        body = await parse_body(request, KeyCreate, empty_ok=True)
        record, plaintext = await service.create_key(request.path_params["tenant_id"], body.name)
        return json_response({**record.public(), "key": plaintext}, 201)

    async def revoke_key(request: Request) -> Response:
        p = request.path_params
        return json_response((await service.revoke_key(p["tenant_id"], p["key_id"])).public())

    async def usage(request: Request) -> Response:
        days = int_query(request, "days", 7, 1, MAX_HISTORY_DAYS)
        return json_response(await service.usage(request.path_params["tenant_id"], days))

    document = openapi_document(extra_openapi_paths)

    async def openapi(request: Request) -> Response:
        return json_response(document)

    def route(path: str, handler: Endpoint, method: str) -> Route:
        return Route(path, _admin(admin_token, handler), methods=[method])

    return [
        route("/tenants", list_tenants, "GET"),
        route("/tenants", create_tenant, "POST"),
        route("/tenants/{tenant_id}", get_tenant, "GET"),
        route("/tenants/{tenant_id}", update_tenant, "PATCH"),
        route("/tenants/{tenant_id}", delete_tenant, "DELETE"),
        route("/tenants/{tenant_id}/quotas", patch_quotas, "PATCH"),
        route("/tenants/{tenant_id}/keys", list_keys, "GET"),
        route("/tenants/{tenant_id}/keys", create_key, "POST"),
        route("/tenants/{tenant_id}/keys/{key_id}", revoke_key, "DELETE"),
        route("/tenants/{tenant_id}/usage", usage, "GET"),
        Route("/openapi.json", openapi if openapi_public else _admin(admin_token, openapi), methods=["GET"]),
    ]


def usage_route(service: TenantService, path: str = "/v1/usage") -> Route:
    """GET the caller's own usage, authenticated by its tenant key."""

    async def own_usage(request: Request) -> Response:
        tenant = await service.authenticate(request.headers.get("authorization"))
        days = int_query(request, "days", 7, 1, MAX_HISTORY_DAYS)
        return json_response(await service.usage(tenant.id, days))

    return Route(path, rendering_errors(own_usage), methods=["GET"])
