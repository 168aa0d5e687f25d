"""Which replicas are alive, through the shared Redis: each replica's heartbeat is one member of one sorted
set, scored by when it expires. One round trip both beats and counts; a replica that stops beating drops
out after `ttl_s`. Replica clocks must be NTP-synchronised, as for the quota scripts.

Fail-open limits divide a tenant's quota by the count last seen (gateway/tenants/failopen.py); anything
else that needs the number of live replicas may read it here.
"""

from __future__ import annotations

from typing import Any

# KEYS: the heartbeat zset. ARGV: replica id, now, ttl -> live replicas (this one included)
BEAT = """
redis.call('ZADD', KEYS[1], tonumber(ARGV[2]) + tonumber(ARGV[3]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
return redis.call('ZCARD', KEYS[1])
"""
TTL_S = 5.0


async def beat(script: Any, key: str, replica_id: str, now: float, ttl_s: float = TTL_S) -> int:
    """Renew this replica's heartbeat; the number of live replicas. `script`: `BEAT`, registered."""
    return int(await script(keys=[key], args=[replica_id, repr(now), repr(ttl_s)]))
