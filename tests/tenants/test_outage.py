"""Redis going away mid-run: fail-open admits under local limits, fail-closed answers 503; both recover."""

from __future__ import annotations

import pytest

from gateway.observability.metrics import REGISTRY
from gateway.request.errors import ApiError
from gateway.tenants.models import TenantCreate
from gateway.tenants.redis_store import RedisStore
from gateway.tenants.service import QuotaExceeded, TenantService
from tests.support.processes import ManagedProcess

pytestmark = pytest.mark.e2e


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("failure", ["open", "closed"])
async def test_outage_then_recovery(private_redis: ManagedProcess, failure: str) -> None:
    url = f"redis://127.0.0.1:{private_redis.port}/0"
    service = TenantService(RedisStore(url, retry_interval=0.0), failure=failure)  # type: ignore[arg-type]
    await service.start()
    try:
        await service.create_tenant(TenantCreate.model_validate({"id": "acme", "quotas": {"rpm": 2}}))
        _, key = await service.create_key("acme")
        tenant = await service.authenticate(f"Bearer {key}")  # cached: auth keeps working during the outage
        assert not (await service.reserve(tenant, 1, 1)).local
        errors_before = counter("omnigate_tenant_store_errors_total", operation="reserve")

        private_redis.kill()
        tenant = await service.authenticate(f"Bearer {key}")
        if failure == "open":
            first = await service.reserve(tenant, 1, 1)
            with pytest.raises(QuotaExceeded):  # local limits start where Redis was: 1 of rpm = 2 left
                await service.reserve(tenant, 1, 1)
            assert first.local and counter("omnigate_quota_fail_open_admissions_total") >= 1
            await service.reconcile(first, 1, 1)
        else:
            with pytest.raises(ApiError) as err:
                await service.reserve(tenant, 1, 1)
            assert (err.value.status, err.value.code) == (503, "quota_store_unavailable")
        assert counter("omnigate_tenant_store_errors_total", operation="reserve") > errors_before
        assert not service.store_up and counter("omnigate_tenant_store_up") == 0
        with pytest.raises(ApiError) as admin_err:
            await service.list_tenants()
        assert admin_err.value.status == 503

        private_redis.start()
        res = await service.reserve(tenant, 1, 1)  # Redis again: its bucket still holds the first request
        assert not res.local and service.store_up and counter("omnigate_tenant_store_up") == 1
        with pytest.raises(QuotaExceeded):
            await service.reserve(tenant, 1, 1)
    finally:
        await service.close()
