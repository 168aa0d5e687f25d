"""The lease allocator, one Lua script run atomically in Redis per (replica, backend) refresh.

Keys: 1 the backend's hash: one field `r:<replica>` per live replica, a JSON lease {e expiry ms, g grant,
p the grant before it, a active, k reserved KV tokens, w demand as [[band, n], ...], r the slots it keeps
for the top band, t the top band, s the top rank its shield saw within hold_s}; `owner` and
`limit`, the replica that owns the backend's adaptive limit and its value; `rec_until` and `rec_n`, the
recovery cap. 2 the registry of live replicas (gateway/coordination/registry.py), which the call beats. Time
is Redis's own `TIME`, so replicas on hosts with skewed clocks agree on every lease.

The call refreshes the caller's lease, drops expired ones (a killed replica's share returns), then splits
the limit L max-min fairly between the live replicas by demand, band by band from the highest (a band is
served before any lower one, on whichever replica it waits); while a replica keeps a reserve for the top
band (it saw top-band work lately), the bands below the top claim at most L − R, R the reserve, and the
unclaimed reserve goes to the replicas that keep one — where the top band arrives, as on one replica;
what no demand claims beyond that is split evenly as headroom. The caller gets min(its target, L − Σ
over the others of what they may hold). A replica's grant changes only in its own call, it dispatches
under its previous grant until the answer arrives, and running requests cannot be taken back, so a
replica may hold max(its grant, the grant before it (`p`), its active count when it called): the sum of
those never exceeds L. A shrinking share is thus free for the others one refresh later.

ARGV: replica, ttl_ms, own limit, active, reserved KV, seen replicas, returning (1 after a failed call),
demand JSON, reserve R (0: none held), top band, the top rank its shield saw ("": none). Returns: grant,
L, live replicas, peers' KV, peers' active, 1 if the caller owns the limit, the caller's target (its part
by demand, which its grant reaches as the others shrink), the peers' top shield rank ("": none), then
replica, grant pairs of every live lease.
"""

from __future__ import annotations

from gateway.coordination.registry import BEAT_FUNCTION

ALLOCATE = (
    BEAT_FUNCTION
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h, reg = KEYS[1], KEYS[2]
local rid, ttl = ARGV[1], tonumber(ARGV[2])
local own_limit, active, kv = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local seen_n, returning = tonumber(ARGV[6]), tonumber(ARGV[7])
local live_n = beat(reg, rid, now, ttl)

-- a fresh hash (new deployment, or Redis lost its data) or a replica back from its fallback: for one
-- lease TTL nobody gets more than L / N, the share each replica may hold while it cannot reach Redis
if redis.call('HSETNX', h, 'epoch', now) == 1 or returning == 1 then
  local n = seen_n
  if tonumber(redis.call('HGET', h, 'rec_until') or '0') > now then
    n = math.max(n, tonumber(redis.call('HGET', h, 'rec_n') or '1'))
  end
  redis.call('HSET', h, 'rec_until', now + ttl, 'rec_n', math.max(1, n))
end

local entries, ids, me_before = {}, {}, 0
local all = redis.call('HGETALL', h)
for i = 1, #all, 2 do
  local k = all[i]
  if string.sub(k, 1, 2) == 'r:' then
    local id = string.sub(k, 3)
    local e = cjson.decode(all[i + 1])
    if e.e < now then
      redis.call('HDEL', h, k)
    elseif id ~= rid then
      entries[id] = e
      ids[#ids + 1] = id
    else
      me_before = e.g
    end
  end
end
local me = {e = now + ttl, g = 0, p = 0, a = active, k = kv, w = cjson.decode(ARGV[8]),
  r = tonumber(ARGV[9]), t = tonumber(ARGV[10]), s = tonumber(ARGV[11])}
entries[rid] = me
ids[#ids + 1] = rid
table.sort(ids)

local owner = redis.call('HGET', h, 'owner')
local L
if (not owner) or owner == rid or entries[owner] == nil then
  owner = rid
  L = own_limit
  redis.call('HSET', h, 'owner', rid, 'limit', L)
else
  L = tonumber(redis.call('HGET', h, 'limit'))
end

local demand, bands, seen = {}, {}, {}
for _, id in ipairs(ids) do
  demand[id] = {}
  for _, p in ipairs(entries[id].w) do
    local b, n = p[1], p[2]
    demand[id][b] = (demand[id][b] or 0) + n
    if not seen[b] then seen[b] = true; bands[#bands + 1] = b end
  end
end
table.sort(bands, function(x, y) return x > y end)
-- the top band's reserve, engine-wide: while any replica keeps one (it saw top-band work lately), the
-- bands below the top claim no more than L - R, as on one replica, wherever the top band arrives next
local R, top, keepers = 0, math.huge, {}
for _, id in ipairs(ids) do
  local e = entries[id]
  if (e.r or 0) > 0 then
    R = math.max(R, math.min(e.r, L))
    top = math.min(top, e.t)
    keepers[#keepers + 1] = id
  end
end
local target = {}
for _, id in ipairs(ids) do target[id] = 0 end
local left = L
for _, b in ipairs(bands) do
  local kept = (b < top) and R or 0
  if left - kept <= 0 then break end
  local want = {}
  for _, id in ipairs(ids) do
    local d = demand[id][b] or 0
    if d > 0 then want[#want + 1] = {id, d} end
  end
  table.sort(want, function(x, y) if x[2] ~= y[2] then return x[2] < y[2] end return x[1] < y[1] end)
  local short = {}
  for i, p in ipairs(want) do
    local give = math.min(p[2], math.floor((left - kept) / (#want - i + 1)))
    target[p[1]] = target[p[1]] + give
    left = left - give
    if give < p[2] then short[#short + 1] = p[1] end
  end
  for _, id in ipairs(short) do  -- the remainder of the integer split, one each
    if left - kept <= 0 then break end
    target[id] = target[id] + 1
    left = left - 1
  end
end
local function spread(n, among)  -- n slots evenly, the remainder one each in id order
  local each, extra = math.floor(n / #among), n % #among
  for i, id in ipairs(among) do
    target[id] = target[id] + each + ((i <= extra) and 1 or 0)
  end
end
if left > 0 and #keepers > 0 then  -- the unclaimed reserve: where the top band arrives
  local r = math.min(left, R)
  spread(r, keepers)
  left = left - r
end
if left > 0 then  -- unclaimed: even headroom, so a new request starts without waiting for a refresh
  spread(left, ids)
end

local others, peer_kv, peer_active, peer_rank = 0, 0, 0, nil
for _, id in ipairs(ids) do
  if id ~= rid then
    local e = entries[id]
    others = others + math.max(e.g, e.a, e.p or 0)
    peer_kv = peer_kv + e.k
    peer_active = peer_active + e.a
    if e.s and (peer_rank == nil or e.s > peer_rank) then peer_rank = e.s end
  end
end
local g = math.max(0, math.min(target[rid], L - others))
if tonumber(redis.call('HGET', h, 'rec_until') or '0') > now then
  g = math.min(g, math.floor(L / tonumber(redis.call('HGET', h, 'rec_n'))))
end
me.g = g
me.p = me_before
redis.call('HSET', h, 'r:' .. rid, cjson.encode(me))
redis.call('PEXPIRE', h, ttl * 100)
local out = {g, L, live_n, peer_kv, peer_active, (owner == rid) and 1 or 0, target[rid],
  peer_rank and tostring(peer_rank) or ''}
for _, id in ipairs(ids) do
  out[#out + 1] = id
  out[#out + 1] = entries[id].g
end
return out
"""
)

LEAVE = """
redis.call('ZREM', KEYS[#KEYS], ARGV[1])
for i = 1, #KEYS - 1 do
  redis.call('HDEL', KEYS[i], 'r:' .. ARGV[1])
  if redis.call('HGET', KEYS[i], 'owner') == ARGV[1] then redis.call('HDEL', KEYS[i], 'owner') end
end
return 1
"""
"""A replica that stops cleanly gives its leases back at once (a killed one's expire within the TTL).
KEYS: the backend hashes, then the registry; ARGV: the replica."""

VTC = """
for i = 1, #ARGV, 2 do
  redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], 86400000)
return redis.call('HGETALL', KEYS[1])
"""
"""The tenants' virtual token counters of one pool, summed over the replicas: KEYS the pool's hash
(tenant → counter); ARGV tenant, delta pairs (this replica's changes since its last call). Returns every
tenant's sum. A day without any call forgets them (idle time banks no credit anyway)."""

RECENT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tau = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local v, at = 0, now
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if cur then
    local e = cjson.decode(cur)
    v, at = e[1], e[2]
  end
  v = v * math.exp(-math.max(0, now - at) / tau) + tonumber(ARGV[i + 1])
  redis.call('HSET', KEYS[1], ARGV[i], cjson.encode({v, now}))
end
local out, all = {}, redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local e = cjson.decode(all[i + 1])
  local v = e[1] * math.exp(-math.max(0, now - e[2]) / tau)
  if v < 1e-6 then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = tostring(v)
  end
end
redis.call('PEXPIRE', KEYS[1], 86400000)
return out
"""
"""The tenants' recent service of one pool (the standing's decayed charges), summed over the replicas on
Redis's clock: KEYS the pool's hash (tenant → [decayed charge, as of ms]); ARGV the decay's time constant
in ms, then tenant, charge pairs (this replica's since its last call, decayed to the call). Returns every
tenant's sum decayed to now; a sum decayed to nothing is dropped."""
