"""A bare Starlette app with the tenants routes mounted the way the gateway mounts them, for tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.routing import Mount

from gateway.tenants.admin import admin_routes, usage_route
from gateway.tenants.service import TenantService

ADMIN_TOKEN = "admin-secret-token"


def tenants_app(service: TenantService) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        yield
        await service.close()

    return Starlette(
        routes=[Mount("/admin", routes=admin_routes(service, ADMIN_TOKEN)), usage_route(service)],
        lifespan=lifespan,
    )
