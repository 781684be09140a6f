package redisbackend

import "github.com/redis/go-redis/v9"

// Every operation is one of these scripts, sent with EVALSHA (and EVAL after
// a NOSCRIPT reply, which go-redis's Script.Run does). Each script returns an
// array whose first element is a status:
//
//	OK        success; the rest depends on the script
//	HELD      Acquire only: the key is held; the rest is the record
//	NONE      Get only: the key is free
//	LOST      Renew, Release and SetMetadata: the lease is not the one stored
//	WRONGTYPE a key at our path holds foreign data; the rest is the key name
//	          and what was found there. Nothing was written.
//
// A record is, after the status: holder, token, term, acquired_at (unix ms),
// renewed_at (unix ms), PTTL of the lease (ms), then the holder's heartbeat:
// at (unix ms, -1 when none), granted ttl (ms), PTTL (ms); then metadata
// name/value pairs.

// luaPrelude holds the helpers every script shares.
const luaPrelude = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- now_us is the server's clock in microseconds since 1970: about 1.8e15,
-- exact in a Lua number (a double) until 2^53 (the year 2255).
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- fmt writes an integer as decimal digits, never with an exponent
-- (tostring would write 1.7637812345679e+15).
local function fmt(n) return string.format('%d', n) end
local function ktype(k)
  local t = redis.call('TYPE', k)
  if type(t) == 'table' then t = t['ok'] end
  return t
end
-- lease_state is 'none', 'ok', or a description of the foreign data at k.
local function lease_state(k)
  local t = ktype(k)
  if t == 'none' then return 'none' end
  if t ~= 'hash' then return 'a ' .. t end
  local f = redis.call('HMGET', k, 'holder', 'token', 'term')
  if not f[1] or not f[2] or not f[3] or not tonumber(f[3]) then
    return 'a hash without the fields holder, token and term'
  end
  return 'ok'
end
-- hb_state is 'none', 'ok', or a description of the foreign data at k.
local function hb_state(k)
  local t = ktype(k)
  if t == 'none' then return 'none' end
  if t ~= 'hash' then return 'a ' .. t end
  local f = redis.call('HMGET', k, 'at', 'ttl')
  if not f[1] or not f[2] or not tonumber(f[1]) or not tonumber(f[2]) then
    return 'a hash without the fields at and ttl'
  end
  return 'ok'
end
-- set_state is 'none', 'ok', or a description of the foreign data at k.
local function set_state(k)
  local t = ktype(k)
  if t == 'none' then return 'none' end
  if t ~= 'set' then return 'a ' .. t end
  return 'ok'
end
-- max_term is the largest integer a Lua number holds exactly (2^53 - 1).
local max_term = 9007199254740991
-- term_state is 'none', 'ok', or a description of the foreign data at k.
local function term_state(k)
  local t = ktype(k)
  if t == 'none' then return 'none' end
  if t ~= 'string' then return 'a ' .. t end
  local s = redis.call('GET', k)
  if s ~= '0' and not string.match(s, '^[1-9]%d*$') then
    return 'a string that is not a non-negative integer'
  end
  if tonumber(s) >= max_term then return 'an integer at or above 2^53-1' end
  return 'ok'
end
-- record returns status followed by the record of the lease at lease.
local function record(status, lease, hbbase)
  local h = redis.call('HGETALL', lease)
  local f = {}
  for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
  local out = {status, f['holder'], f['token'], f['term'], f['acquired_at'] or '0',
    f['renewed_at'] or '0', redis.call('PTTL', lease), -1, -1, -1}
  local hbk = hbbase .. f['holder']
  if hb_state(hbk) == 'ok' then
    local v = redis.call('HMGET', hbk, 'at', 'ttl')
    out[8] = v[1]
    out[9] = v[2]
    out[10] = redis.call('PTTL', hbk)
  end
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 5) == 'meta:' then
      out[#out + 1] = string.sub(h[i], 6)
      out[#out + 1] = h[i + 1]
    end
  end
  return out
end
`

// acquireScript: KEYS lease, term, heartbeat base; ARGV holder, token,
// ttl ms, term counter lifetime ms (TermRetention), publish command (empty for none), channel, then metadata
// name/value pairs. Returns OK and the new term as a decimal string, or
// HELD and the holder's record.
var acquireScript = redis.NewScript(luaPrelude + `
local ls = lease_state(KEYS[1])
if ls ~= 'ok' and ls ~= 'none' then return {'WRONGTYPE', KEYS[1], ls} end
local ts = term_state(KEYS[2])
if ts ~= 'ok' and ts ~= 'none' then return {'WRONGTYPE', KEYS[2], ts} end
if ls == 'ok' then return record('HELD', KEYS[1], KEYS[3]) end
-- The term is the counter plus one, but at least the server's clock in
-- microseconds: a counter that expired or was lost with the data starts
-- again above every earlier term, as long as the clock is past the last
-- acquisition (see Fencing terms in the package doc). The counter keeps the
-- term for ARGV[4] ms.
local term = math.max((tonumber(redis.call('GET', KEYS[2])) or 0) + 1, now_us())
redis.call('SET', KEYS[2], fmt(term), 'PX', ARGV[4])
local now = fmt(now_ms())
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', ARGV[2], 'term', fmt(term),
  'acquired_at', now, 'renewed_at', now, 'ttl', ARGV[3])
for i = 7, #ARGV, 2 do
  redis.call('HSET', KEYS[1], 'meta:' .. ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if ARGV[5] ~= '' then redis.call(ARGV[5], ARGV[6], 'acquired:' .. fmt(term)) end
return {'OK', fmt(term)}
`)

// renewScript: KEYS lease; ARGV holder, token, ttl ms.
var renewScript = redis.NewScript(luaPrelude + `
local ls = lease_state(KEYS[1])
if ls == 'none' then return {'LOST'} end
if ls ~= 'ok' then return {'WRONGTYPE', KEYS[1], ls} end
local f = redis.call('HMGET', KEYS[1], 'holder', 'token')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then return {'LOST'} end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('HSET', KEYS[1], 'renewed_at', fmt(now_ms()), 'ttl', ARGV[3])
return {'OK'}
`)

// releaseScript: KEYS lease; ARGV holder, token, publish command (empty for
// none), channel.
var releaseScript = redis.NewScript(luaPrelude + `
local ls = lease_state(KEYS[1])
if ls == 'none' then return {'LOST'} end
if ls ~= 'ok' then return {'WRONGTYPE', KEYS[1], ls} end
local f = redis.call('HMGET', KEYS[1], 'holder', 'token', 'term')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then return {'LOST'} end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then redis.call(ARGV[3], ARGV[4], 'released:' .. f[3]) end
return {'OK'}
`)

// getScript: KEYS lease, heartbeat base.
var getScript = redis.NewScript(luaPrelude + `
local ls = lease_state(KEYS[1])
if ls == 'none' then return {'NONE'} end
if ls ~= 'ok' then return {'WRONGTYPE', KEYS[1], ls} end
return record('OK', KEYS[1], KEYS[2])
`)

// setMetadataScript: KEYS lease; ARGV holder, token, then metadata
// name/value pairs. Replaces every meta:* field; the TTL is left as it is.
var setMetadataScript = redis.NewScript(luaPrelude + `
local ls = lease_state(KEYS[1])
if ls == 'none' then return {'LOST'} end
if ls ~= 'ok' then return {'WRONGTYPE', KEYS[1], ls} end
local f = redis.call('HMGET', KEYS[1], 'holder', 'token')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] then return {'LOST'} end
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(name, 1, 5) == 'meta:' then redis.call('HDEL', KEYS[1], name) end
end
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], 'meta:' .. ARGV[i], ARGV[i + 1])
end
return {'OK'}
`)

// heartbeatScript: KEYS heartbeat key, members; ARGV id, ttl ms.
var heartbeatScript = redis.NewScript(luaPrelude + `
local hs = hb_state(KEYS[1])
if hs ~= 'ok' and hs ~= 'none' then return {'WRONGTYPE', KEYS[1], hs} end
local ms = set_state(KEYS[2])
if ms ~= 'ok' and ms ~= 'none' then return {'WRONGTYPE', KEYS[2], ms} end
redis.call('HSET', KEYS[1], 'at', fmt(now_ms()), 'ttl', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return {'OK'}
`)

// membersScript: KEYS members, heartbeat base. Returns OK followed by id,
// at, ttl, pttl per live member; prunes IDs whose heartbeat key is gone and
// skips (without touching) foreign data at a heartbeat path.
var membersScript = redis.NewScript(luaPrelude + `
local ms = set_state(KEYS[1])
if ms == 'none' then return {'OK'} end
if ms ~= 'ok' then return {'WRONGTYPE', KEYS[1], ms} end
local out = {'OK'}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local k = KEYS[2] .. id
  local s = hb_state(k)
  if s == 'none' then
    redis.call('SREM', KEYS[1], id)
  elseif s == 'ok' then
    local v = redis.call('HMGET', k, 'at', 'ttl')
    out[#out + 1] = id
    out[#out + 1] = v[1]
    out[#out + 1] = v[2]
    out[#out + 1] = redis.call('PTTL', k)
  end
end
return out
`)

// removeMemberScript: KEYS heartbeat key, members, heartbeat base; ARGV id.
// After removing id, the members set's expiry is recomputed as the longest
// PTTL of the remaining heartbeat records (IDs without one are dropped), so
// the set goes when the last of them does, not when the removed one would
// have.
var removeMemberScript = redis.NewScript(luaPrelude + `
local hs = hb_state(KEYS[1])
if hs ~= 'ok' and hs ~= 'none' then return {'WRONGTYPE', KEYS[1], hs} end
local ms = set_state(KEYS[2])
if ms ~= 'ok' and ms ~= 'none' then return {'WRONGTYPE', KEYS[2], ms} end
if hs == 'ok' then redis.call('DEL', KEYS[1]) end
if ms == 'ok' then
  redis.call('SREM', KEYS[2], ARGV[1])
  local keep = 0
  for _, id in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    local p = redis.call('PTTL', KEYS[3] .. id)
    if p == -2 then
      redis.call('SREM', KEYS[2], id)
    elseif p > keep then
      keep = p
    end
  end
  if keep > 0 then redis.call('PEXPIRE', KEYS[2], keep) end
end
return {'OK'}
`)
