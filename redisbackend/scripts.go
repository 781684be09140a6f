package redisbackend

import "github.com/redis/go-redis/v9"

// Every operation is one of these scripts, sent with EVALSHA (and EVAL after
// a NOSCRIPT reply, which go-redis's Script.Run does). A plain Acquire that
// takes the key returns the new term as an integer, a plain Release that
// frees it returns 1: the two calls of every lock, with the smallest
// replies. Otherwise each script returns an array whose first element is a
// status:
//
//	OK        success; the rest depends on the script
//	HELD      Acquire only: the key is held; the rest is the record
//	HELDM     Acquire and AcquireMode: the key is held by entries of
//	          backend.Modes; the rest is described in modes_scripts.go
//	MISMATCH  AcquireMode only: the limits of Shared holders differ
//	LOST      Renew, Release and SetMetadata: the lease is not the one stored
//	WRONGTYPE a key at our path holds foreign data; the rest is the key name
//	          and what was found there. Nothing was written.
//
// A record is, after the status: holder, token, term, acquired_at (unix ms),
// renewed_at (unix ms), PTTL of the lease (ms), then the holder's heartbeat:
// at (unix ms, -1 when none), granted ttl (ms), PTTL (ms); then metadata
// name/value pairs.

// The helpers the scripts share follow.
//
// The scripts that run all the time (acquire, renew, release, heartbeat)
// find foreign data at our paths from the WRONGTYPE error of the
// command they need anyway (redis.pcall), and from the fields they read,
// instead of asking TYPE first; TYPE runs only to describe foreign data in
// the error. Each reads the server's clock (TIME) at most once.
//
// The helpers are split so that each script defines only what it uses:
// every EVALSHA runs its script's top level, and each helper defined there
// is a closure made (and later collected) on every run. The hot scripts
// (acquire, renew, release) therefore define none on their way to success:
// their common case is written out at the top level with no helper, and
// the helpers are defined inside the branches that need them (a key held
// by entries of backend.Modes, foreign data, a lost lease).
const (
	luaBase = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- fmt writes an integer as decimal digits, never with an exponent
-- (tostring would write 1.7637812345679e+15).
local function fmt(n) return string.format('%d', n) end
local function ktype(k)
  local t = redis.call('TYPE', k)
  if type(t) == 'table' then t = t['ok'] end
  return t
end
-- failed reports whether r, a result of redis.pcall, is an error.
local function failed(r) return type(r) == 'table' and r['err'] ~= nil end
-- foreign is the WRONGTYPE reply for k, which holds data of another kind.
local function foreign(k) return {'WRONGTYPE', k, 'a ' .. ktype(k)} end
local no_lease_fields = 'a hash without the fields holder, token and term'
`
	luaChunked = `
-- call_chunked runs cmd on k with the arguments in list, a few thousand at
-- a time: unpack is limited by Lua's C stack (about 8000 values).
local function call_chunked(cmd, k, list)
  for i = 1, #list, 4000 do
    redis.call(cmd, k, unpack(list, i, math.min(i + 3999, #list)))
  end
end
`
	luaCheckOwner = `
-- check_owner is the owner check of Renew, Release and SetMetadata of a
-- plain lease: one HMGET of the lease at k. It returns nil and the lease's
-- term when the lease is holder ARGV[1]'s with token ARGV[2]; otherwise
-- the reply: LOST (also when k holds entries of backend.Modes: the marker
-- field modes), or WRONGTYPE when k holds foreign data (EXISTS runs only
-- when none of the fields is there, to tell a missing key from a foreign
-- hash).
local function check_owner(k)
  local f = redis.pcall('HMGET', k, 'holder', 'token', 'term', 'modes')
  if failed(f) then return foreign(k) end
  if f[1] and f[2] and tonumber(f[3] or '') then
    if f[1] == ARGV[1] and f[2] == ARGV[2] then return nil, f[3] end
    return {'LOST'}
  end
  if f[4] == '1' then return {'LOST'} end
  if f[1] or f[2] or f[3] or redis.call('EXISTS', k) == 1 then
    return {'WRONGTYPE', k, no_lease_fields}
  end
  return {'LOST'}
end
`
	luaHeartbeatState = `
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
`
)

// luaPrelude holds every helper, for the scripts that run rarely.
const luaPrelude = luaBase + luaChunked + luaCheckOwner + luaHeartbeatState

// acquireScript: KEYS lease, term; ARGV holder, token,
// ttl ms, term counter lifetime ms (TermRetention), publish command (empty
// for none), the RestartGuard flag (1 or empty), then metadata name/value
// pairs. The watch channel is the lease hash's name followed by ":events",
// the holder's heartbeat record its name followed by ":heartbeat:<holder>"
// (only read). Returns the new term (an integer reply: below 2^53, so the
// Lua number converts exactly), or HELD and the holder's record, or, with
// the flag, RESTARTED and the milliseconds of the refusal, or NOINFO (see
// luaRestartWait). The flag adds LASTSAVE, TIME and at times INFO to the
// free path.
//
// On a free key it makes seven calls: HGETALL (the key is free), GET (the
// counter), TIME, SET PX (the counter), HSET (every field at once; no
// renewed_at, which readers derive from the expiry: see Renewals in
// redisbackend.go), PEXPIRE and PUBLISH (the watch contract promises an
// event for every acquisition; without subscribers it costs a dictionary
// lookup), and defines no helper. On a key held by a plain lease it makes
// four or five: HGETALL, PTTL, TIME (for RenewedAt; not for a record of an
// earlier version, which has the field renewed_at), and HMGET (and PTTL)
// of the holder's heartbeat. A key held by entries of
// backend.Modes (holders, or intents of locks below) returns HELDM with the
// record of each; the helpers that read entries are defined inside that
// branch, so the way to success costs what it did.
//
// What the calls cost (redis-server 7.0, server CPU of an acquisition and
// release of a free lock key, 500 of each pipelined, medians of 7 to 9
// interleaved rounds on a loaded 2-core VM, 2026-11-23): 13.5 µs a pair,
// against 5.6 for bsm/redislock's two scripts (SET NX PX; GET, DEL) and 4.5
// for two empty scripts. Leaving out one call at a time: the counter's GET
// and SET 2.4 µs, PEXPIRE 1.1, the two PUBLISHes 1.3, TIME about 1,
// HGETALL 0.7, the renewed_at and ttl fields 0.4; the Lua around the calls
// (validation, formatting) about 0.4. Each call is one the guarantees
// need (the counter and TIME: terms above every earlier one; PUBLISH: the
// watch contract; PEXPIRE: a hash takes its TTL in a second command), so
// the free path is at its floor for this key layout. Since then the field
// renewed_at is no longer written: BenchmarkAcquireVariantsServerCPU (an
// acquisition alone, 512 pipelined, interleaved with the previous script
// on one server; load average 5 on 2 cores) gives 9.1-9.3 µs against
// 9.5-9.6 before. Reading and writing the counter in one SET ... GET
// (Redis 6.2) would save another 0.5 µs (8.7), but it overwrites foreign
// data found in the counter before it can tell, and needs Redis 6.2: not
// done. A HELD reply costs a TIME more than it did (for RenewedAt and
// HeartbeatAt, no longer stored), about 0.8 µs (BenchmarkScriptServerCPU
// "acquire held": 9.1-9.7 µs against 8.5-8.6).
var acquireScript = redis.NewScript(acquireSrc)

// acquireSrc is acquireScript's source (benchmarks make variants of it).
const acquireSrc = `
local h = redis.pcall('HGETALL', KEYS[1])
if h['err'] or #h > 0 then
  local f = {}
  for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
  if f['holder'] and f['token'] and tonumber(f['term'] or '') then
    -- Held: the holder's record (see the top of this file).
    -- The times are derived from expiries (see Renewals and Heartbeats in
    -- redisbackend.go), by the server's clock (TIME) when needed: the
    -- last renewal at now - (ttl - PTTL) of the lease, within
    -- [acquired_at, now] (or the field renewed_at, in a record of an
    -- earlier version, which wrote it at every renewal), and the holder's
    -- last heartbeat likewise from its record.
    local p = redis.call('PTTL', KEYS[1])
    local out = {'HELD', f['holder'], f['token'], f['term'], f['acquired_at'] or '0',
      f['renewed_at'], p, -1, -1, -1}
    local now
    -- The holder's heartbeat, when it is a record of ours; foreign data
    -- there is not reported here (HMGET's error reply has no [1]).
    local hbk = KEYS[1] .. ':heartbeat:' .. f['holder']
    local v = redis.pcall('HMGET', hbk, 'at', 'ttl')
    if tonumber(v[1] or '') and tonumber(v[2] or '') then
      local hp = redis.call('PTTL', hbk)
      out[8], out[9], out[10] = v[1], v[2], hp
      if hp >= 0 then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        out[8] = now - tonumber(v[2]) + hp
      end
    end
    if not out[6] then
      local a, d = tonumber(f['acquired_at'] or '') or 0, tonumber(f['ttl'] or '')
      out[6] = a
      if d and p >= 0 then
        if not now then
          local t = redis.call('TIME')
          now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        end
        out[6] = math.max(a, math.min(now, now - d + p))
      end
    end
    for i = 1, #h, 2 do
      if string.sub(h[i], 1, 5) == 'meta:' then
        out[#out + 1] = string.sub(h[i], 6)
        out[#out + 1] = h[i + 1]
      end
    end
    return out
  end
` + luaBase + luaChunked + `
  if failed(h) then return foreign(KEYS[1]) end
  if f['modes'] ~= '1' then return {'WRONGTYPE', KEYS[1], no_lease_fields} end
` + modesLua + `
  local now = now_ms()
  local st, sbad = load(KEYS[1], now, h)
  if sbad then return sbad end
  if #st.holders > 0 or #st.intents > 0 then return held_reply(KEYS[1], st, now) end
  -- Every entry expired this very millisecond, before the hash did.
  redis.call('DEL', KEYS[1])
end
if ARGV[6] == '1' then
` + luaRestartWait + `
  local w, werr = restart_wait(tonumber(ARGV[3]))
  if werr then return werr end
  if w > 0 then return {'RESTARTED', w} end
end
local cur = redis.pcall('GET', KEYS[2])
local n = 0
if cur then
  if type(cur) == 'table' then
    local t = redis.call('TYPE', KEYS[2])
    return {'WRONGTYPE', KEYS[2], 'a ' .. (t['ok'] or t)}
  end
  if cur ~= '0' and not string.match(cur, '^[1-9]%d*$') then
    return {'WRONGTYPE', KEYS[2], 'a string that is not a non-negative integer'}
  end
  n = tonumber(cur)
  -- The largest integer a Lua number holds exactly is 2^53 - 1.
  if n >= 9007199254740991 then return {'WRONGTYPE', KEYS[2], 'an integer at or above 2^53-1'} end
end
-- The term is the counter plus one, but at least the server's clock in
-- microseconds (about 1.8e15, exact in a Lua number until 2^53, the year
-- 2255): a counter that expired or was lost with the data starts again
-- above every earlier term, as long as the clock is past the last
-- acquisition (see Fencing terms in the package doc). The counter keeps the
-- term for ARGV[4] ms. string.format writes the integers as decimal
-- digits, never with an exponent.
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local tn = math.max(n + 1, sec * 1000000 + usec)
local term = string.format('%d', tn)
local now = string.format('%d', sec * 1000 + math.floor(usec / 1000))
redis.call('SET', KEYS[2], term, 'PX', ARGV[4])
if #ARGV == 6 then
  redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', ARGV[2], 'term', term,
    'acquired_at', now, 'ttl', ARGV[3])
else
  local fields = {'holder', ARGV[1], 'token', ARGV[2], 'term', term,
    'acquired_at', now, 'ttl', ARGV[3]}
  for i = 7, #ARGV, 2 do
    fields[#fields + 1] = 'meta:' .. ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
  end
  -- A few thousand at a time: unpack is limited by Lua's C stack.
  for i = 1, #fields, 4000 do
    redis.call('HSET', KEYS[1], unpack(fields, i, math.min(i + 3999, #fields)))
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if ARGV[5] ~= '' then redis.call(ARGV[5], KEYS[1] .. ':events', 'acquired:' .. term) end
return tn
`

// luaRestartWait defines restart_wait(ttl) for Options.RestartGuard: how
// many milliseconds the server still refuses a free key to an acquisition
// of TTL ttl ms (0: it does not), or nil and a NOINFO reply when it cannot
// tell. The server refuses until its uptime reaches the TTL: every lease
// it could have lost was renewed at the latest before it started, so each
// has expired by then (if its TTL was at most this one). LASTSAVE, cheap,
// is the time of the server's start or of a later save: when that is more
// than a TTL ago, so is the start. Otherwise INFO tells the two apart; its
// uptime is in whole seconds, counted from a start time in whole seconds,
// so it may run ahead by up to a second, which the wait adds back.
const luaRestartWait = `
local function restart_wait(ttl)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local ls = redis.pcall('LASTSAVE')
  if type(ls) == 'number' and (ls + 1) * 1000 + ttl <= now then return 0 end
  local s = redis.pcall('INFO', 'server')
  if type(s) ~= 'string' then
    return nil, {'NOINFO', type(s) == 'table' and s['err'] or 'no reply'}
  end
  local up = tonumber(string.match(s, 'uptime_in_seconds:(%d+)'))
  if not up then return nil, {'NOINFO', 'no uptime_in_seconds in its reply'} end
  return math.max(ttl + 1000 - up * 1000, 0)
end
`

// renewScript: KEYS lease; ARGV holder, token, ttl ms, publish command
// (empty for none). Three calls: HMGET (of holder, token, term and ttl),
// PEXPIRE and PUBLISH ("renewed:<term>:<ttl ms>" on the renewals channel,
// the lease hash's name followed by ":renewals", for
// backend.RenewalWatcher), and a fourth, HSET of the field ttl, only when
// the renewal changes the lease's TTL: the time of the renewal is not
// written, readers derive it from the expiry PEXPIRE sets (see Renewals in
// redisbackend.go). The owner check's helpers are defined only when the
// lease is not the caller's (check_owner then reads the lease again, with
// the marker field modes).
var renewScript = redis.NewScript(`
local f = redis.pcall('HMGET', KEYS[1], 'holder', 'token', 'term', 'ttl')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] or not tonumber(f[3] or '') then
` + luaBase + luaCheckOwner + `
  return check_owner(KEYS[1]) or {'LOST'}
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if f[4] ~= ARGV[3] then redis.call('HSET', KEYS[1], 'ttl', ARGV[3]) end
if ARGV[4] and ARGV[4] ~= '' then
  redis.call(ARGV[4], KEYS[1] .. ':renewals', 'renewed:' .. f[3] .. ':' .. ARGV[3])
end
return {'OK'}
`)

// releaseScript: KEYS lease; ARGV holder, token, publish command (empty for
// none). The watch channel is the lease hash's name followed by ":events".
// Returns 1 once released. Three calls: HMGET (of holder, token and term),
// DEL, PUBLISH; the owner check's helpers are defined only when the lease
// is not the caller's (check_owner then reads the lease again, with the
// marker field modes).
var releaseScript = redis.NewScript(`
local f = redis.pcall('HMGET', KEYS[1], 'holder', 'token', 'term')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] or not tonumber(f[3] or '') then
` + luaBase + luaCheckOwner + `
  return check_owner(KEYS[1]) or {'LOST'}
end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then redis.call(ARGV[3], KEYS[1] .. ':events', 'released:' .. f[3]) end
return 1
`)

// setMetadataScript: KEYS lease; ARGV holder, token, then metadata
// name/value pairs. Replaces every meta:* field; the TTL is left as it is.
var setMetadataScript = redis.NewScript(luaPrelude + `
local bad = check_owner(KEYS[1])
if bad then return bad end
local old = {}
for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(name, 1, 5) == 'meta:' then old[#old + 1] = name end
end
call_chunked('HDEL', KEYS[1], old)
if #ARGV > 2 then
  local fields = {}
  for i = 3, #ARGV, 2 do
    fields[#fields + 1] = 'meta:' .. ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
  end
  call_chunked('HSET', KEYS[1], fields)
end
return {'OK'}
`)

// heartbeatScript: KEYS heartbeat key, members; ARGV id, ttl ms. On the
// way to success it makes five calls: HMGET (the record is ours or
// absent), SADD (the members set is a set), PEXPIRE, PTTL and PEXPIRE (the
// set's expiry covers the record); and TIME and HSET (the fields at and
// ttl) only when it creates the record or changes its TTL: the time of a
// heartbeat is derived from the record's expiry (see Heartbeats in
// redisbackend.go).
var heartbeatScript = redis.NewScript(luaPrelude + `
local v = redis.pcall('HMGET', KEYS[1], 'at', 'ttl')
if failed(v) then return foreign(KEYS[1]) end
if not (tonumber(v[1] or '') and tonumber(v[2] or '')) then
  if v[1] or v[2] or redis.call('EXISTS', KEYS[1]) == 1 then
    return {'WRONGTYPE', KEYS[1], 'a hash without the fields at and ttl'}
  end
end
-- SADD fails, writing nothing, when the members key holds foreign data.
if failed(redis.pcall('SADD', KEYS[2], ARGV[1])) then return foreign(KEYS[2]) end
if v[2] ~= ARGV[2] then redis.call('HSET', KEYS[1], 'at', fmt(now_ms()), 'ttl', ARGV[2]) end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return {'OK'}
`)

// membersScript: KEYS members, heartbeat base. Returns OK followed by id,
// at, ttl, pttl per live member, at derived from the record's expiry (now
// - (ttl - PTTL)); prunes IDs whose heartbeat key is gone and skips
// (without touching) foreign data at a heartbeat path.
var membersScript = redis.NewScript(luaPrelude + `
local ms = set_state(KEYS[1])
if ms == 'none' then return {'OK'} end
if ms ~= 'ok' then return {'WRONGTYPE', KEYS[1], ms} end
local out = {'OK'}
local now
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local k = KEYS[2] .. id
  local s = hb_state(k)
  if s == 'none' then
    redis.call('SREM', KEYS[1], id)
  elseif s == 'ok' then
    local v = redis.call('HMGET', k, 'at', 'ttl')
    local p = redis.call('PTTL', k)
    local at = v[1]
    if p >= 0 then
      now = now or now_ms()
      at = now - tonumber(v[2]) + p
    end
    out[#out + 1] = id
    out[#out + 1] = at
    out[#out + 1] = v[2]
    out[#out + 1] = p
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
