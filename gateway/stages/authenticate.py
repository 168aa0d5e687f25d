"""Stage 1: who is asking. An API key becomes a tenant (or every request is the anonymous tenant when
`auth.required` is off); each tenant's fairness weight is remembered for the schedulers."""

from __future__ import annotations

from starlette.requests import Request

from gateway.tenants.models import Tenant
from gateway.tenants.service import TenantService


class Authenticate:
    def __init__(self, tenants: TenantService, required: bool, weights: dict[str, float]) -> None:
        self.tenants = tenants
        self.required = required
        self.weights = weights  # tenant id → weight, read by the schedulers' fairness (weight_of)

    async def __call__(self, request: Request) -> Tenant:
        if not self.required:
            return self.tenants.anonymous()
        tenant = await self.tenants.authenticate(request.headers.get("authorization"))
        self.weights[tenant.id] = tenant.weight
        return tenant
