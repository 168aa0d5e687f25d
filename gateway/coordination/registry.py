"""Which replicas are alive: one registry in the shared Redis that quotas and engine budgets both read.

Each replica is one member of one sorted set, `<prefix>replicas`, scored by when its heartbeat expires in
Redis's own clock (ms), so hosts with skewed clocks agree. The tenant store beats on its health check and
the coordinator on every lease refresh; a beat only ever pushes the expiry later, so the shorter TTL of
one does not cut the other's. A replica that stops beating drops out when its last beat expires.

Fail-open quotas (gateway/tenants/failopen.py) and the coordinator's fallback (gateway/coordination) both
divide by the count read here, so they never disagree on N.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

REGISTRY = "replicas"
"""The registry's key, after the store's prefix."""

BEAT_FUNCTION = """
local function beat(reg, rid, now, ttl)
  local expires = now + ttl
  local before = tonumber(redis.call('ZSCORE', reg, rid) or '0')
  if expires > before then redis.call('ZADD', reg, expires, rid) end
  redis.call('ZREMRANGEBYSCORE', reg, '-inf', now)
  return redis.call('ZCARD', reg)
end
"""
"""Lua: renew `rid`'s heartbeat in `reg` until `now + ttl` (ms) and count the live replicas. Scripts that
beat as part of a larger step embed it."""

# KEYS: the registry. ARGV: replica, ttl ms -> live replicas (this one included)
BEAT = (
    BEAT_FUNCTION
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return beat(KEYS[1], ARGV[1], now, tonumber(ARGV[2]))
"""
)
TTL_S = 5.0


def replica_name() -> str:
    """Host, process and a random suffix: readable in /admin/state, unique across restarts."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


async def beat(script: Any, key: str, replica: str, ttl_s: float = TTL_S) -> int:
    """Renew this replica's heartbeat; the number of live replicas. `script`: `BEAT`, registered."""
    return int(await script(keys=[key], args=[replica, int(ttl_s * 1000)]))
