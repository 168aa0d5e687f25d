"""Child process for the kill -9 test: writes to a SQLite store and prints a line after each acknowledged
change (`key <plaintext>`, then `ack <n>` per finished request), until it is killed."""

from __future__ import annotations

import asyncio
import sys

from gateway.tenants.models import TenantCreate
from gateway.tenants.service import TenantService
from gateway.tenants.sqlite_store import SQLiteStore


async def main(path: str) -> None:
    service = TenantService(SQLiteStore(path))
    await service.start()
    await service.create_tenant(TenantCreate(id="acme"))
    _, key = await service.create_key("acme", "durable")
    print("key", key, flush=True)
    tenant = await service.authenticate(f"Bearer {key}")
    n = 0
    while True:
        res = await service.reserve(tenant, 100, 100)
        await service.reconcile(res, 100, 50)
        n += 1
        print("ack", n, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
