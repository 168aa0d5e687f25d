"""Lua scripts for the Redis store: one round trip per admission and per reconcile, atomic in Redis.

They port QuotaBook.try_reserve / settle (quota.py) line by line; the shared test suite runs both against
the same expectations. Times come from the caller's clock so all replicas and tests agree on `now`
(replicas need NTP-synchronised clocks, as every distributed rate limiter does).

Keys: 1 bucket hash (`<limit>:l` level, `<limit>:t` stamp), 2 concurrency zset (reservation id scored by
its lease deadline, so a crashed replica's slots expire), 3 day ledger hash, 4 month ledger hash
(fields in, out, req, aud: audio milliseconds), 5 the reservation's applied mark: a settle or record that
finds it set does nothing, so a retried reconcile or a replayed fail-open charge is applied once. A
reserve finds its own id in the concurrency set when it is a retry (a reply lost to a broken connection)
and takes nothing again; it takes nothing either once its id was recorded (a reserve the caller gave up on
at its deadline that reaches Redis late). Every script may therefore be retried. A limit of -1 means "not
set".
"""

from __future__ import annotations

_LEVEL = """
local function level(limit, now, name)
  local raw = redis.call('HMGET', KEYS[1], name .. ':l', name .. ':t')
  if not raw[1] then return nil end
  local elapsed = now - tonumber(raw[2])
  if elapsed < 0 then elapsed = 0 end
  return math.min(limit, tonumber(raw[1]) + elapsed * limit / 60.0)
end
local function fmt(x) return string.format('%.17g', x) end
local NAMES = {'input_tpm', 'output_tpm', 'total_tpm', 'rpm', 'audio_spm'}
"""

# ARGV: now, in, out, lim_in, lim_out, lim_total, lim_rpm, max_concurrent, daily, monthly,
#       reservation_id, lease_until, to_next_day, to_next_month, ledger_ttl, bucket_ttl, audio_ms, lim_audio,
#       daily_audio_ms, monthly_audio_ms
# -> {0, limit, wait} or {1, the five bucket levels after it ('' unset), tokens used today, this month,
#    audio ms spoken today, this month}: the last known state a replica's fail-open limits start from
RESERVE = (
    _LEVEL
    + """
if redis.call('ZSCORE', KEYS[2], ARGV[11]) then return {1, '', '', '', '', '', 0, 0, 0, 0} end  -- a retry
if redis.call('EXISTS', KEYS[5]) == 1 then return {0, 'abandoned', '0'} end  -- recorded: given up on
local now = tonumber(ARGV[1])
local amt_in, amt_out, amt_aud = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[17])
local amounts = {amt_in, amt_out, amt_in + amt_out, 1, amt_aud / 1000.0}
local limits = {ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[18]}
local worst, worst_wait = nil, -1
local function deny(name, wait)
  if wait > worst_wait then worst, worst_wait = name, wait end
end
local levels = {}
for i = 1, 5 do
  local limit = tonumber(limits[i])
  if limit >= 0 then
    local lvl = level(limit, now, NAMES[i]) or limit
    levels[i] = lvl
    local need = math.min(amounts[i], limit)
    if lvl < need and (need > 0 or i ~= 5) then deny(NAMES[i], (need - lvl) * 60.0 / limit) end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local max_conc = tonumber(ARGV[8])
if max_conc >= 0 and redis.call('ZCARD', KEYS[2]) >= max_conc then deny('max_concurrent', 1.0) end
local function used(key)
  local r = redis.call('HMGET', key, 'in', 'out')
  return (tonumber(r[1]) or 0) + (tonumber(r[2]) or 0)
end
local total = amt_in + amt_out
local daily, monthly = tonumber(ARGV[9]), tonumber(ARGV[10])
if daily >= 0 and used(KEYS[3]) + math.min(total, daily) > daily then
  deny('daily_tokens', tonumber(ARGV[13]))
end
if monthly >= 0 and used(KEYS[4]) + math.min(total, monthly) > monthly then
  deny('monthly_tokens', tonumber(ARGV[14]))
end
local function spoken(key) return tonumber(redis.call('HGET', key, 'aud')) or 0 end
local daily_aud, monthly_aud = tonumber(ARGV[19]), tonumber(ARGV[20])
if amt_aud > 0 and daily_aud >= 0 and spoken(KEYS[3]) + math.min(amt_aud, daily_aud) > daily_aud then
  deny('daily_audio_seconds', tonumber(ARGV[13]))
end
if amt_aud > 0 and monthly_aud >= 0 and spoken(KEYS[4]) + math.min(amt_aud, monthly_aud) > monthly_aud then
  deny('monthly_audio_seconds', tonumber(ARGV[14]))
end
if worst then return {0, worst, fmt(worst_wait)} end
local after = {'', '', '', '', ''}
for i = 1, 5 do
  if levels[i] then
    after[i] = fmt(levels[i] - amounts[i])
    redis.call('HSET', KEYS[1], NAMES[i] .. ':l', after[i], NAMES[i] .. ':t', ARGV[1])
  end
end
redis.call('EXPIRE', KEYS[1], ARGV[16])
redis.call('ZADD', KEYS[2], ARGV[12], ARGV[11])
redis.call('EXPIRE', KEYS[2], ARGV[16])
for k = 3, 4 do
  redis.call('HINCRBY', KEYS[k], 'in', amt_in)
  redis.call('HINCRBY', KEYS[k], 'out', amt_out)
  redis.call('HINCRBY', KEYS[k], 'req', 1)
  redis.call('HINCRBY', KEYS[k], 'aud', amt_aud)
  redis.call('EXPIRE', KEYS[k], ARGV[15])
end
return {1, after[1], after[2], after[3], after[4], after[5], used(KEYS[3]), used(KEYS[4]), spoken(KEYS[3]),
        spoken(KEYS[4])}
"""
)

# The reconcile of a reservation Redis holds: refunds what was reserved and not used (or takes the
# excess) and frees the slot. ARGV: now, res_in, res_out, act_in, act_out, lim_in, lim_out, lim_total,
# reservation_id, mark_ttl, res_audio_ms, act_audio_ms, lim_audio
_RECONCILE = """
local now = tonumber(ARGV[1])
local res_in, res_out = tonumber(ARGV[2]), tonumber(ARGV[3])
local act_in, act_out = tonumber(ARGV[4]), tonumber(ARGV[5])
local res_aud, act_aud = tonumber(ARGV[11]), tonumber(ARGV[12])
local refunds = {res_in - act_in, res_out - act_out, res_in + res_out - act_in - act_out, 0,
                 (res_aud - act_aud) / 1000.0}
local limits = {ARGV[6], ARGV[7], ARGV[8], '-1', ARGV[13]}
for i = 1, 5 do
  local limit = tonumber(limits[i])
  if limit >= 0 then
    local lvl = level(limit, now, NAMES[i])
    if lvl then
      local new = math.min(limit, lvl + refunds[i])
      redis.call('HSET', KEYS[1], NAMES[i] .. ':l', fmt(new), NAMES[i] .. ':t', ARGV[1])
    end
  end
end
redis.call('ZREM', KEYS[2], ARGV[9])
for k = 3, 4 do
  redis.call('HINCRBY', KEYS[k], 'in', act_in - res_in)
  redis.call('HINCRBY', KEYS[k], 'out', act_out - res_out)
  redis.call('HINCRBY', KEYS[k], 'aud', act_aud - res_aud)
end
"""

SETTLE = (
    _LEVEL
    + """
if not redis.call('SET', KEYS[5], '1', 'NX', 'EX', ARGV[10]) then return 0 end
"""
    + _RECONCILE
    + """
return 1
"""
)

# A request admitted under local limits (fail-open), or refused there (ARGV[15] requests = 0), for the
# day/month ledger. Its reserve may have reached Redis after all (sent, then given up on at the deadline):
# then it is in the concurrency set and is reconciled to the usage instead, so it counts once; otherwise
# the usage is added as a request of its own, and the mark stops a reserve still on its way.
# ARGV: SETTLE's, then ledger_ttl, requests -> 1 recorded, 2 reconciled, 0 applied before
RECORD = (
    _LEVEL
    + """
if not redis.call('SET', KEYS[5], '1', 'NX', 'EX', ARGV[10]) then return 0 end
if redis.call('ZSCORE', KEYS[2], ARGV[9]) then
"""
    + _RECONCILE
    + """
  for k = 3, 4 do redis.call('HINCRBY', KEYS[k], 'req', tonumber(ARGV[15]) - 1) end
  return 2
end
for k = 3, 4 do
  redis.call('HINCRBY', KEYS[k], 'in', ARGV[4])
  redis.call('HINCRBY', KEYS[k], 'out', ARGV[5])
  redis.call('HINCRBY', KEYS[k], 'req', ARGV[15])
  redis.call('HINCRBY', KEYS[k], 'aud', ARGV[12])
  redis.call('EXPIRE', KEYS[k], ARGV[14])
end
return 1
"""
)

# ARGV: now, lim_in, lim_out, lim_total, lim_rpm, lim_audio -> levels as strings ('' for unset limits),
# active count
LEVELS = (
    _LEVEL
    + """
local now = tonumber(ARGV[1])
local out = {}
for i = 1, 5 do
  local limit = tonumber(ARGV[1 + i])
  if limit >= 0 then out[i] = fmt(level(limit, now, NAMES[i]) or limit) else out[i] = '' end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
out[6] = redis.call('ZCARD', KEYS[2])
return out
"""
)
