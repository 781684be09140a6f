package redisbackend

import "github.com/redis/go-redis/v9"

// The scripts of backend.Modes (see modes.go for the layout they share).
//
// A key with entries ("a modes hash") keeps them as fields of its lease
// hash, next to the marker field modes=1:
//
//	h:<token>  a holder: holder ID, term, mode (x or s), limit, acquired_at,
//	           renewed_at (unix ms), ttl (ms), expiry (unix ms, server
//	           clock), then metadata name/value pairs
//	i:<token>  an intent of the lock <token> below: expiry (unix ms), 1 when
//	           that lock is Exclusive (0: Shared), its term, holder ID, key
//	           and lease hash name
//
// each value a list of strings, each written as <length>:<bytes> (binary
// safe, no JSON). The hash's own expiry (PEXPIREAT) is the latest expiry of
// its entries, so the hash exists while at least one entry may live, and an
// entry past its expiry is dead wherever it is read (it is deleted when a
// script next writes the hash). Waiters live in a second hash of the key,
// <name>:waiters: field w:<wait ID> = "<seq> <expiry> <x|s>" and the ticket
// counter seq; its expiry is its latest waiter's.
//
// Replies carry records as nested arrays: key ("" for the script's own
// key), holder, token, term, acquired_at, renewed_at, TTL (ms), mode,
// limit, heartbeat at, granted TTL and PTTL (-1 when none), then metadata
// name/value pairs.

// modesLua holds the helpers of the entry scripts; it follows luaBase and
// luaChunked, and is also valid inside a block (acquireScript defines it
// only on its way to HELDM).
const modesLua = `
-- enc writes a list of strings as <length>:<bytes>...; dec reads it back
-- (nil when malformed).
local function enc(list)
  local out = {}
  for i, s in ipairs(list) do out[i] = #s .. ':' .. s end
  return table.concat(out)
end
local function dec(v)
  local out, i = {}, 1
  while i <= #v do
    local j = string.find(v, ':', i, true)
    if not j then return nil end
    local n = tonumber(string.sub(v, i, j - 1))
    if not n or j + n > #v then return nil end
    out[#out + 1] = string.sub(v, j + 1, j + n)
    i = j + n + 1
  end
  return out
end
local function holder_of(tok, v)
  local l = dec(v)
  if not l or #l < 8 or not tonumber(l[8]) then return nil end
  local e = {tok = tok, id = l[1], t = l[2], m = l[3], l = l[4], a = l[5], r = l[6], d = l[7],
    e = tonumber(l[8]), md = {}}
  for i = 9, #l do e.md[#e.md + 1] = l[i] end
  return e
end
local function holder_enc(e)
  local l = {e.id, e.t, e.m, e.l, e.a, e.r, e.d, fmt(e.e)}
  for _, s in ipairs(e.md) do l[#l + 1] = s end
  return enc(l)
end
local function intent_of(tok, v)
  local l = dec(v)
  if not l or #l < 6 or not tonumber(l[1]) then return nil end
  return {tok = tok, e = tonumber(l[1]), x = l[2], t = l[3], id = l[4], k = l[5], n = l[6]}
end
-- intent_exp reads only the expiry of an intent (its first string), so that
-- a key with many intents below it is cheap to read; full decodes the rest
-- of an intent from load when it is needed.
local function intent_exp(v)
  local n, p = string.match(v, '^(%d+):()')
  if not n then return nil end
  return tonumber(string.sub(v, p, p + tonumber(n) - 1))
end
local function full(ie)
  if not ie.k then
    local d = intent_of(ie.tok, ie.v)
    if d then ie.x, ie.t, ie.id, ie.k, ie.n = d.x, d.t, d.id, d.k, d.n end
  end
  return ie
end
local function intent_enc(ie)
  return enc({fmt(ie.e), ie.x, ie.t, ie.id, ie.k, ie.n})
end
local function by_term(a, b) return tonumber(a.t) < tonumber(b.t) end
-- by_term_key orders records {t = term, r = record} by term, then key
-- (terms of different keys come from different counters and may tie).
local function by_term_key(a, b)
  local x, y = tonumber(a.t), tonumber(b.t)
  if x ~= y then return x < y end
  return a.r[1] < b.r[1]
end
local malformed = 'a hash with a malformed entry'
-- load reads the lease hash at k with one HGETALL (or takes its reply h,
-- when the caller has it already). It returns nil and the
-- WRONGTYPE reply when k holds foreign data, otherwise the key's state:
-- holders (live, in term order; a plain lease is one Exclusive holder and
-- sets plain), intents (live), dead (names of expired entry fields), maxe
-- (the latest live expiry, 0 when none) and modes (k is a modes hash).
local function load(k, now, h)
  h = h or redis.pcall('HGETALL', k)
  if failed(h) then return nil, foreign(k) end
  local st = {holders = {}, intents = {}, dead = {}, maxe = 0}
  if #h == 0 then return st end
  local f = {}
  for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
  if f['holder'] and f['token'] and tonumber(f['term'] or '') then
    local p = redis.call('PTTL', k)
    -- renewed_at: the field, in a record of an earlier version; otherwise
    -- derived from the expiry, as in acquireScript's HELD reply.
    local a = f['acquired_at'] or '0'
    local r = f['renewed_at']
    if not r then
      local an, d = tonumber(a) or 0, tonumber(f['ttl'] or '')
      r = fmt(an)
      if d and p >= 0 then r = fmt(math.max(an, math.min(now, now - d + p))) end
    end
    if p < 0 then p = 1099511627776 end
    local e = {tok = f['token'], id = f['holder'], t = f['term'], m = 'x', l = '0',
      a = a, r = r, d = f['ttl'] or '0', e = now + p, md = {}}
    for i = 1, #h, 2 do
      if string.sub(h[i], 1, 5) == 'meta:' then
        e.md[#e.md + 1] = string.sub(h[i], 6)
        e.md[#e.md + 1] = h[i + 1]
      end
    end
    st.plain, st.holders[1], st.maxe = true, e, e.e
    return st
  end
  if f['modes'] ~= '1' then return nil, {'WRONGTYPE', k, no_lease_fields} end
  st.modes = true
  for i = 1, #h, 2 do
    local kind, tok = string.sub(h[i], 1, 2), string.sub(h[i], 3)
    local e, list = nil, nil
    if kind == 'h:' then
      e, list = holder_of(tok, h[i + 1]), st.holders
    elseif kind == 'i:' then
      local x = intent_exp(h[i + 1])
      if x then e = {tok = tok, e = x, v = h[i + 1]} end
      list = st.intents
    end
    if list then
      if not e then return nil, {'WRONGTYPE', k, malformed} end
      if e.e <= now then
        st.dead[#st.dead + 1] = h[i]
      else
        list[#list + 1] = e
        if e.e > st.maxe then st.maxe = e.e end
      end
    end
  end
  table.sort(st.holders, by_term)
  return st
end
-- settle deletes the dead entries of the modes hash k (state st) and sets
-- its expiry to its latest live entry's, or deletes it when none is left.
local function settle(k, st)
  if #st.holders == 0 and #st.intents == 0 then
    redis.call('DEL', k)
    return
  end
  if #st.dead > 0 then call_chunked('HDEL', k, st.dead) end
  redis.call('PEXPIREAT', k, fmt(st.maxe))
end
-- rec is the record reply of holder e of the key named name (key: the
-- key's name for the caller, '' for the script's own key).
local function rec(key, name, e, now)
  local out = {key, e.id, e.tok, e.t, e.a, e.r, math.max(0, e.e - now), e.m, e.l, -1, -1, -1}
  local hbk = name .. ':heartbeat:' .. e.id
  local v = redis.pcall('HMGET', hbk, 'at', 'ttl')
  if not failed(v) and tonumber(v[1] or '') and tonumber(v[2] or '') then
    local p = redis.call('PTTL', hbk)
    out[10], out[11], out[12] = v[1], v[2], p
    -- The last heartbeat, derived from the record's expiry (see Heartbeats
    -- in redisbackend.go).
    if p >= 0 then out[10] = now - tonumber(v[2]) + p end
  end
  for _, s in ipairs(e.md) do out[#out + 1] = s end
  return out
end
-- intent_rec is the record of the lock below that holds intent ie: read
-- from that lock's own entry, or made of the intent when it is gone.
local function intent_rec(ie, now)
  ie = full(ie)
  if not ie.k then return rec('', '', {tok = ie.tok, id = '', t = '0', m = 'x', l = '0', a = '0', r = '0', e = ie.e, md = {}}, now) end
  local v = redis.pcall('HGET', ie.n, 'h:' .. ie.tok)
  local e = nil
  if type(v) == 'string' then e = holder_of(ie.tok, v) end
  if not e then
    local m = 's'
    if ie.x == '1' then m = 'x' end
    e = {tok = ie.tok, id = ie.id, t = ie.t, m = m, l = '0', a = '0', r = '0', e = ie.e, md = {}}
  end
  return rec(ie.k, ie.n, e, now)
end
-- held_reply lists every live holder and intent of the modes hash k, the
-- reply of a plain Acquire that finds the key held by entries.
local function held_reply(k, st, now)
  local all = {}
  for _, e in ipairs(st.holders) do all[#all + 1] = {t = e.t, r = rec('', k, e, now)} end
  for _, ie in ipairs(st.intents) do all[#all + 1] = {t = full(ie).t or '0', r = intent_rec(ie, now)} end
  table.sort(all, by_term_key)
  local out = {'HELDM', 0, #all}
  for _, x in ipairs(all) do out[#out + 1] = x.r end
  return out
end
-- load_waiters reads the waiters hash k: nil and the WRONGTYPE reply for
-- foreign data, otherwise the live waiters (id, seq, e, m), the names of
-- the dead ones' fields and the latest live expiry.
local function load_waiters(k, now)
  local h = redis.pcall('HGETALL', k)
  if failed(h) then return nil, foreign(k) end
  local ws, dead, maxe = {}, {}, 0
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 2) == 'w:' then
      local seq, e, m = string.match(h[i + 1], '^(%d+) (%d+) ([xs])$')
      if not seq then return nil, {'WRONGTYPE', k, 'a hash with a malformed waiter'} end
      e = tonumber(e)
      if e <= now then
        dead[#dead + 1] = h[i]
      else
        ws[#ws + 1] = {id = string.sub(h[i], 3), seq = tonumber(seq), e = e, m = m}
        if e > maxe then maxe = e end
      end
    elseif h[i] ~= 'seq' then
      return nil, {'WRONGTYPE', k, 'a hash with a field that is not a waiter'}
    end
  end
  return {ws = ws, dead = dead, maxe = maxe, n = #h}
end
-- drop_waiters removes the waiters whose IDs are keys of the table ids
-- (and the dead ones) from the waiters hash k with state w; the hash goes
-- with its last live waiter. It returns how many of ids were live waiters.
local function drop_waiters(k, w, ids)
  local found, maxe, left, del = 0, 0, 0, {}
  for _, x in ipairs(w.ws) do
    if ids[x.id] then
      found = found + 1
      del[#del + 1] = 'w:' .. x.id
    else
      left = left + 1
      if x.e > maxe then maxe = x.e end
    end
  end
  if left == 0 then
    if w.n > 0 then redis.call('DEL', k) end
    return found
  end
  for _, f in ipairs(w.dead) do del[#del + 1] = f end
  if #del > 0 then
    call_chunked('HDEL', k, del)
    redis.call('PEXPIREAT', k, fmt(maxe))
  end
  return found
end
-- drop_waiter is drop_waiters of the one waiter id; it returns whether id
-- was a live waiter.
local function drop_waiter(k, w, id)
  return drop_waiters(k, w, {[id] = true}) > 0
end
-- check_entry is the owner check of an entry: the holder entry of token
-- ARGV[2] in the modes hash k, if it is holder ARGV[1]'s and live; else nil
-- and the reply (LOST or WRONGTYPE).
local function check_entry(k, now)
  local v = redis.pcall('HGET', k, 'h:' .. ARGV[2])
  if failed(v) then return nil, foreign(k) end
  if not v then return nil, {'LOST'} end
  local e = holder_of(ARGV[2], v)
  if not e then return nil, {'WRONGTYPE', k, malformed} end
  if e.id ~= ARGV[1] or e.e <= now then return nil, {'LOST'} end
  return e
end
`

// acquireModeScript: KEYS lease hash, term counter, waiters, then each
// ancestor's lease hash, then each ancestor's waiters hash; ARGV holder,
// token, ttl ms, TermRetention ms, mode (x or s), limit, fair (1 or 0), wait
// ID (empty: none), publish command (empty: none), channel, the key, the
// number of ancestors, the ancestors' keys, the number of lost tokens and of
// lost wait IDs, each lost token's kind (p: a plain lease, e: an entry) and
// token, the lost wait IDs (see lostreply.go), metadata name/value pairs,
// then the register-only flag (1 or empty: backend.ModeRequest.RegisterOnly)
// and the RestartGuard flag (1 or empty). Returns OK and the term; FREE (register
// only, and nothing in the way: nothing written but the registration); RESTARTED and
// the milliseconds of the refusal (see luaRestartWait) or NOINFO; HELD, the number of waiters yielded to, the
// number of conflicting records, those records in term order, then, when no
// record conflicts, the record of the key's oldest holder or, when the
// acquisition yielded to the Exclusive waiters of an ancestor, that
// ancestor's oldest holder's record (or just the ancestor's key, a string,
// when it has none); or MISMATCH and the live holders' limit.
//
// When it found and deleted the lease or entry of a lost token, the reply
// begins with RECLAIMED, the number of such tokens and the tokens, before
// the above.
//
// The Exclusive waiters of an ancestor (those of the first ancestor,
// outermost first, that has any) refuse a hierarchical acquisition that is
// not Fair, whatever its mode: backend.ModeSupport.AncestorWaiters. The
// ancestors' waiter tickets are in the tree's hash slot, read in the same
// script.
var acquireModeScript = redis.NewScript(luaBase + luaChunked + modesLua + `
local max_term = 9007199254740991
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now = sec * 1000 + math.floor(usec / 1000)
local mode, limit, fair, wid = ARGV[5], ARGV[6], ARGV[7] == '1', ARGV[8]
local na = tonumber(ARGV[12])
local nt, nw = tonumber(ARGV[13 + na]), tonumber(ARGV[14 + na])
local lb = 14 + na -- lost token j: kind ARGV[lb + 2j - 1], token ARGV[lb + 2j]
local md = lb + 2 * nt + nw + 1 -- the first metadata argument
local ronly = ARGV[#ARGV - 1] == '1'
-- Lost acquisitions of this holder (see lostreply.go): their lease or
-- entry (with its intents), owner-checked by holder and token, and their
-- waiter registrations, deleted with the events of Release and CancelWait.
local found = {}
if nt > 0 then
  local pub, entries = ARGV[9], false
  for j = 1, nt do
    local tok = ARGV[lb + 2 * j]
    if ARGV[lb + 2 * j - 1] == 'p' then
      local f = redis.pcall('HMGET', KEYS[1], 'holder', 'token', 'term')
      if not failed(f) and f[1] == ARGV[1] and f[2] == tok and tonumber(f[3] or '') then
        redis.call('DEL', KEYS[1])
        if pub ~= '' then redis.call(pub, ARGV[10], 'released:' .. f[3]) end
        found[#found + 1] = tok
      end
    else
      local v = redis.pcall('HGET', KEYS[1], 'h:' .. tok)
      local e = nil
      if type(v) == 'string' then e = holder_of(tok, v) end
      if e and e.id == ARGV[1] then
        redis.call('HDEL', KEYS[1], 'h:' .. tok)
        for i = 1, na do redis.pcall('HDEL', KEYS[3 + i], 'i:' .. tok) end
        if pub ~= '' and e.e > now then
          -- The channels are the lease hashes' names with :events.
          redis.call(pub, ARGV[10], 'released:' .. e.t)
          for i = 1, na do redis.call(pub, KEYS[3 + i] .. ':events', 'released:' .. e.t) end
        end
        found[#found + 1] = tok
        entries = true
      end
    end
  end
  if entries then
    for i = 0, na do
      local k = KEYS[1]
      if i > 0 then k = KEYS[3 + i] end
      local s = load(k, now)
      if s and s.modes then settle(k, s) end
    end
  end
end
if nw > 0 then
  local w0 = load_waiters(KEYS[3], now)
  if w0 and w0.n > 0 then
    local ids = {}
    for j = 1, nw do ids[ARGV[lb + 2 * nt + j]] = true end
    if drop_waiters(KEYS[3], w0, ids) > 0 and ARGV[9] ~= '' then
      redis.call(ARGV[9], ARGV[10], 'waiter:cancelled')
    end
  end
end
-- acquire is the acquisition proper; its reply is the script's, after
-- RECLAIMED and the tokens found above, if any.
local function acquire()
local st, bad = load(KEYS[1], now)
if bad then return bad end
if mode == 's' then
  for _, e in ipairs(st.holders) do
    if e.m == 's' and e.l ~= limit then return {'MISMATCH', e.l} end
  end
end
local conflicts = {}
local function add(t, r) conflicts[#conflicts + 1] = {t = t, r = r} end
local nshared = 0
for _, e in ipairs(st.holders) do
  if e.m == 's' then nshared = nshared + 1 end
  if mode == 'x' or e.m == 'x' then add(e.t, rec('', KEYS[1], e, now)) end
end
if mode == 's' and tonumber(limit) > 0 and nshared >= tonumber(limit) then
  for _, e in ipairs(st.holders) do
    if e.m == 's' then add(e.t, rec('', KEYS[1], e, now)) end
  end
end
for _, ie in ipairs(st.intents) do
  if mode == 'x' or full(ie).x == '1' then add(full(ie).t or '0', intent_rec(ie, now)) end
end
local anc = {}
for i = 1, na do
  local ast, abad = load(KEYS[3 + i], now)
  if abad then return abad end
  anc[i] = ast
  for _, e in ipairs(ast.holders) do
    if mode == 'x' or e.m == 'x' then add(e.t, rec(ARGV[12 + i], KEYS[3 + i], e, now)) end
  end
end
local w, wbad = load_waiters(KEYS[3], now)
if wbad then return wbad end
local mine = nil
for _, x in ipairs(w.ws) do
  if x.id == wid then mine = x end
end
local waiting = 0
for _, x in ipairs(w.ws) do
  if x.id ~= wid then
    if fair then
      if mine == nil or x.seq < mine.seq then waiting = waiting + 1 end
    elseif mode == 's' and x.m == 'x' then
      waiting = waiting + 1
    end
  end
end
-- above: the first ancestor, outermost first, with live Exclusive waiters.
local above = nil
if not fair then
  for i = 1, na do
    local aw, awbad = load_waiters(KEYS[3 + na + i], now)
    if awbad then return awbad end
    local nx = 0
    for _, x in ipairs(aw.ws) do
      if x.m == 'x' then nx = nx + 1 end
    end
    if nx > 0 then
      above, waiting = i, waiting + nx
      break
    end
  end
end
if #conflicts > 0 or waiting > 0 or ronly then
  if wid ~= '' and (fair or mode == 'x') then
    local exp = now + tonumber(ARGV[3])
    local seq
    if mine then seq = mine.seq else seq = redis.call('HINCRBY', KEYS[3], 'seq', 1) end
    if #w.dead > 0 then call_chunked('HDEL', KEYS[3], w.dead) end
    redis.call('HSET', KEYS[3], 'w:' .. wid, fmt(seq) .. ' ' .. fmt(exp) .. ' ' .. mode)
    redis.call('PEXPIREAT', KEYS[3], fmt(math.max(w.maxe, exp)))
  end
  if #conflicts == 0 and waiting == 0 then return {'FREE'} end
  table.sort(conflicts, by_term_key)
  local out = {'HELD', waiting, #conflicts}
  for _, x in ipairs(conflicts) do out[#out + 1] = x.r end
  if #conflicts == 0 and above then
    local ast = anc[above]
    if #ast.holders > 0 then
      out[#out + 1] = rec(ARGV[12 + above], KEYS[3 + above], ast.holders[1], now)
    else
      out[#out + 1] = ARGV[12 + above]
    end
  elseif #conflicts == 0 and #st.holders > 0 then
    out[#out + 1] = rec('', KEYS[1], st.holders[1], now)
  end
  return out
end
if ARGV[#ARGV] == '1' then
` + luaRestartWait + `
  local rw, rwerr = restart_wait(tonumber(ARGV[3]))
  if rwerr then return rwerr end
  if rw > 0 then return {'RESTARTED', rw} end
end
local cur = redis.pcall('GET', KEYS[2])
if failed(cur) then return foreign(KEYS[2]) end
local n = 0
if cur then
  if cur ~= '0' and not string.match(cur, '^[1-9]%d*$') then
    return {'WRONGTYPE', KEYS[2], 'a string that is not a non-negative integer'}
  end
  n = tonumber(cur)
  if n >= max_term then return {'WRONGTYPE', KEYS[2], 'an integer at or above 2^53-1'} end
end
-- The term as in a plain Acquire: the counter plus one, at least the
-- server's clock in microseconds.
local term = fmt(math.max(n + 1, sec * 1000000 + usec))
redis.call('SET', KEYS[2], term, 'PX', ARGV[4])
local exp = now + tonumber(ARGV[3])
local e = {tok = ARGV[2], id = ARGV[1], t = term, m = mode, l = limit, a = fmt(now), r = fmt(now),
  d = ARGV[3], e = exp, md = {}}
for i = md, #ARGV - 2 do e.md[#e.md + 1] = ARGV[i] end
if #st.dead > 0 then call_chunked('HDEL', KEYS[1], st.dead) end
redis.call('HSET', KEYS[1], 'modes', '1', 'h:' .. ARGV[2], holder_enc(e))
redis.call('PEXPIREAT', KEYS[1], fmt(math.max(st.maxe, exp)))
local x = '0'
if mode == 'x' then x = '1' end
for i = 1, na do
  local ast = anc[i]
  if #ast.dead > 0 then call_chunked('HDEL', KEYS[3 + i], ast.dead) end
  redis.call('HSET', KEYS[3 + i], 'modes', '1', 'i:' .. ARGV[2],
    intent_enc({e = exp, x = x, t = term, id = ARGV[1], k = ARGV[11], n = KEYS[1]}))
  redis.call('PEXPIREAT', KEYS[3 + i], fmt(math.max(ast.maxe, exp)))
end
if w.n > 0 then drop_waiter(KEYS[3], w, wid) end
if ARGV[9] ~= '' then redis.call(ARGV[9], ARGV[10], 'acquired:' .. term) end
return {'OK', term}
end
local out = acquire()
if #found == 0 then return out end
local r = {'RECLAIMED', #found}
for _, tok in ipairs(found) do r[#r + 1] = tok end
for _, v in ipairs(out) do r[#r + 1] = v end
return r
`)

// renewEntryScript: KEYS lease hash, then each ancestor's lease hash; ARGV
// holder, token, ttl ms, publish command (empty: none), then the renewals
// channel of the key and of each ancestor. It extends the entry and its
// intents to now + ttl, and publishes "renewed:<term>:<ttl ms>" on every
// channel (for
// backend.RenewalWatcher: a waiter of the key, or of an ancestor blocked by
// the intent, learns how long the entry lives at least); an intent that is
// gone makes the entry LOST (nothing is written or published). Unlike
// a plain lease's renewal, it rewrites the entry, whose expiry is part of
// its value (the hash's own expiry is the latest of its entries'), so
// writing renewed_at there (the field r) costs nothing more, and the entry
// keeps it: RenewedAt is not derived for entries.
var renewEntryScript = redis.NewScript(luaBase + luaChunked + modesLua + `
local now = now_ms()
local e, bad = check_entry(KEYS[1], now)
if bad then return bad end
local ints = {}
for i = 2, #KEYS do
  local v = redis.pcall('HGET', KEYS[i], 'i:' .. ARGV[2])
  if failed(v) then return foreign(KEYS[i]) end
  local ie = nil
  if v then ie = intent_of(ARGV[2], v) end
  if not ie or ie.e <= now then return {'LOST'} end
  ints[i] = ie
end
local exp = now + tonumber(ARGV[3])
-- extend sets k's expiry to exp unless it is later already.
local function extend(k)
  if now + redis.call('PTTL', k) < exp then redis.call('PEXPIREAT', k, fmt(exp)) end
end
e.e, e.r, e.d = exp, fmt(now), ARGV[3]
redis.call('HSET', KEYS[1], 'h:' .. ARGV[2], holder_enc(e))
extend(KEYS[1])
for i = 2, #KEYS do
  ints[i].e = exp
  redis.call('HSET', KEYS[i], 'i:' .. ARGV[2], intent_enc(ints[i]))
  extend(KEYS[i])
end
if ARGV[4] ~= '' then
  for i = 5, #ARGV do redis.call(ARGV[4], ARGV[i], 'renewed:' .. e.t .. ':' .. ARGV[3]) end
end
return {'OK'}
`)

// releaseEntryScript: KEYS lease hash, then each ancestor's lease hash;
// ARGV holder, token, publish command (empty: none), then the channel of
// the key and of each ancestor. It deletes the entry and its intents, and
// publishes the release on every channel.
var releaseEntryScript = redis.NewScript(luaBase + luaChunked + modesLua + `
local now = now_ms()
local e, bad = check_entry(KEYS[1], now)
if bad then return bad end
for i = 1, #KEYS do
  local f = 'h:'
  if i > 1 then f = 'i:' end
  redis.pcall('HDEL', KEYS[i], f .. ARGV[2])
  local st = load(KEYS[i], now)
  if st and st.modes then settle(KEYS[i], st) end
end
if ARGV[3] ~= '' then
  for i = 4, #ARGV do redis.call(ARGV[3], ARGV[i], 'released:' .. e.t) end
end
return {'OK'}
`)

// setEntryMetadataScript: KEYS lease hash; ARGV holder, token, then
// metadata name/value pairs, which replace the entry's.
var setEntryMetadataScript = redis.NewScript(luaBase + luaChunked + modesLua + `
local e, bad = check_entry(KEYS[1], now_ms())
if bad then return bad end
e.md = {}
for i = 3, #ARGV do e.md[#e.md + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], 'h:' .. ARGV[2], holder_enc(e))
return {'OK'}
`)

// holdersScript: KEYS lease hash; ARGV all (1: every live holder; 0: the
// oldest only). Returns OK and the records of the key's live holders (a
// plain lease or entries; never intents), in term order.
var holdersScript = redis.NewScript(luaBase + luaChunked + modesLua + `
local now = now_ms()
local st, bad = load(KEYS[1], now)
if bad then return bad end
local out = {'OK'}
for _, e in ipairs(st.holders) do
  out[#out + 1] = rec('', KEYS[1], e, now)
  if ARGV[1] ~= '1' then break end
end
return out
`)

// cancelWaitScript: KEYS waiters; ARGV wait ID, publish command (empty:
// none), channel. It withdraws the registration and, when it was live,
// publishes a change so the next waiter in line looks again.
var cancelWaitScript = redis.NewScript(luaBase + luaChunked + modesLua + `
local w, bad = load_waiters(KEYS[1], now_ms())
if bad then return bad end
if w.n == 0 then return {'OK'} end
if drop_waiter(KEYS[1], w, ARGV[1]) and ARGV[2] ~= '' then
  redis.call(ARGV[2], ARGV[3], 'waiter:cancelled')
end
return {'OK'}
`)
