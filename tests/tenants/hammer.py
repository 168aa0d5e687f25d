"""One "replica" for the shared-quota test: hammer a tenant through its own TenantService on Redis.

Run as `python -m tests.tenants.hammer <redis url> <prefix> <key> <scale> <span>`. Once connected it prints
`ready` and reads the shared `epoch` from stdin, so a slow start on a busy machine cannot eat the run. The
clock is scaled (`epoch + (time.time() - epoch) * scale`) so a quota minute passes in 60/scale real seconds;
both processes share `epoch`, hence agree on `now`, and hammer until `epoch + span` (scaled). Prints one JSON
list of [reserved_at, charged_tokens].
"""

from __future__ import annotations

import asyncio
import random
import sys
import time

import orjson

from gateway.tenants.redis_store import RedisStore
from gateway.tenants.service import QuotaExceeded, TenantService

REQUEST_TOKENS = 600


async def hammer(url: str, prefix: str, key: str, scale: float, span: float) -> list[tuple[float, int]]:
    epoch = time.time()

    def clock() -> float:
        return epoch + (time.time() - epoch) * scale

    service = TenantService(RedisStore(url, prefix, clock=clock), clock=clock)
    await service.start()
    tenant = await service.authenticate(f"Bearer {key}")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    epoch = float(await asyncio.to_thread(sys.stdin.readline))
    end = epoch + span
    rng = random.Random()
    charged: list[tuple[float, int]] = []
    await asyncio.sleep(max(0.0, epoch - time.time()))
    while (now := clock()) < end:
        try:
            res = await service.reserve(tenant, 400, 200, now)
        except QuotaExceeded as e:
            await asyncio.sleep(min(e.retry_after / scale, 0.05))
            continue
        actual_out = rng.randint(100, 300)  # usage differs from the estimate: reconcile returns or charges
        await service.reconcile(res, 400, actual_out)
        charged.append((now, 400 + actual_out))
    await service.close()
    return charged


if __name__ == "__main__":
    url, prefix, key = sys.argv[1:4]
    scale, span = map(float, sys.argv[4:6])
    sys.stdout.write(orjson.dumps(asyncio.run(hammer(url, prefix, key, scale, span))).decode())
