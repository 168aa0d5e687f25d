"""Redis going away mid-run: fail-open admits under local limits, fail-closed answers 503; both recover."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gateway.errors import ApiError
from gateway.observability.metrics import REGISTRY
from gateway.tenants.models import TenantCreate
from gateway.tenants.redis_store import RedisStore
from gateway.tenants.service import QuotaExceeded, TenantService
from tests.support.servers import free_port


class PrivateRedis:
    """A redis-server of our own (append-only file, so a restart keeps its data) that we can kill."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(
                "redis-server is not installed; the outage tests need it (apt-get install redis-server)"
            )
        self.binary, self.workdir, self.port = binary, workdir, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"]
        self.proc = subprocess.Popen(
            [self.binary, *args, "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return
            except redis.exceptions.ConnectionError:
                assert time.monotonic() < deadline, "private redis-server did not start"
                time.sleep(0.02)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.parametrize("failure", ["open", "closed"])
async def test_outage_then_recovery(private_redis: PrivateRedis, failure: str) -> None:
    service = TenantService(RedisStore(private_redis.url, retry_interval=0.0), failure=failure)  # type: ignore[arg-type]
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
            await service.reserve(tenant, 1, 1)
            with pytest.raises(QuotaExceeded):  # the local in-memory limit still holds rpm = 2
                await service.reserve(tenant, 1, 1)
            assert first.local and counter("omnigate_quota_fail_open_admissions_total") >= 2
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
