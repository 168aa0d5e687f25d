"""One budget per engine however many replicas: capacity leases in the shared Redis store.

- `scripts.py`: the allocator (Lua, atomic in Redis): heartbeat, leases, the split by band, limit owner;
- `shares.py`: `Shares`, this replica's leases and the share it may use now (leased, or 1/N without Redis);
- `coordinator.py`: `Coordinator`, the refresh loop (one pipelined round trip for all backends);
- `registry.py`: the live replicas (heartbeats in Redis), which the tenant store's fail-open quotas count too.

See README.md here and docs/decisions/0700-shared-engine-budgets.md.
"""
