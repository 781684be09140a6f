package redisbackend

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// prevRenewManyScript is renewManyScript as it was before renewals stopped
// writing renewed_at and heartbeat refreshes stopped writing at (commit
// 77a0225): owner check, PEXPIRE, TIME once per script, HSET renewed_at
// and ttl; and for a heartbeat refresh HMGET, PTTL, HSET at and ttl,
// PEXPIRE.
var prevRenewManyScript = redis.NewScript(luaBase + `
local out = {}
local now
local k = 0
for i = 1, #ARGV / 4 do
  local a = (i - 1) * 4
  local holder, token, ttl, hbttl = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  k = k + 1
  local lk, hk, mk = KEYS[k], nil, nil
  if hbttl ~= '0' then
    hk, mk = KEYS[k + 1], KEYS[k + 2]
    k = k + 2
  end
  local f = redis.pcall('HMGET', lk, 'holder', 'token', 'term', 'modes')
  if failed(f) then
    out[i] = {'WRONGTYPE', lk, 'a ' .. ktype(lk)}
  elseif f[4] == '1' and not f[1] then -- entries of backend.Modes, as in check_owner
    out[i] = 'LOST'
  elseif f[1] and f[2] and tonumber(f[3] or '') then
    if f[1] == holder and f[2] == token then
      redis.call('PEXPIRE', lk, ttl)
      now = now or fmt(now_ms())
      redis.call('HSET', lk, 'renewed_at', now, 'ttl', ttl)
      out[i] = 'OK'
      if hk then
        -- The holder's record, when it is there and ours (an error reply,
        -- for foreign data, has no [1] either). The members set must
        -- outlive it: when the set has less than the record's TTL left,
        -- SADD (which fails on foreign data, writing nothing) and extend
        -- it to twice that TTL, so that most refreshes leave it alone.
        local v = redis.pcall('HMGET', hk, 'at', 'ttl')
        if tonumber(v[1] or '') and tonumber(v[2] or '') then
          local hbms = tonumber(hbttl)
          local covered = redis.call('PTTL', mk) >= hbms
          if not covered and not failed(redis.pcall('SADD', mk, holder)) then
            redis.call('PEXPIRE', mk, fmt(2 * hbms))
            covered = true
          end
          if covered then
            redis.call('HSET', hk, 'at', now, 'ttl', hbttl)
            redis.call('PEXPIRE', hk, hbttl)
            out[i] = 'OKH'
          end
        end
      end
    else
      out[i] = 'LOST'
    end
  elseif f[1] or f[2] or f[3] or redis.call('EXISTS', lk) == 1 then
    out[i] = {'WRONGTYPE', lk, no_lease_fields}
  else
    out[i] = 'LOST'
  end
end
return out
`)

// pexpireManyScript is the floor of a renewal in a script: PEXPIRE alone,
// with no owner check.
var pexpireManyScript = redis.NewScript(`
local out = {}
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[4 * i - 1])
  out[i] = 'OK'
end
return out
`)

// hmget4ManyScript, hmget2ManyScript and hgetManyScript are renewals
// written as small as they go, for measurement only: HMGET of holder,
// token, term and ttl (renewManyScript's fields) with the owner check and
// PEXPIRE, and nothing else (no foreign data, no heartbeat); HMGET of
// holder and token; HGET of the token alone.
var (
	hmget2ManyScript = redis.NewScript(`
local out = {}
for i = 1, #KEYS do
  local a = (i - 1) * 4
  local f = redis.pcall('HMGET', KEYS[i], 'holder', 'token')
  if f[1] == ARGV[a + 1] and f[2] == ARGV[a + 2] then
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 3])
    out[i] = 'OK'
  else
    out[i] = 'LOST'
  end
end
return out
`)
	hmget4ManyScript = redis.NewScript(`
local out = {}
for i = 1, #KEYS do
  local a = (i - 1) * 4
  local f = redis.pcall('HMGET', KEYS[i], 'holder', 'token', 'term', 'ttl')
  if f[1] == ARGV[a + 1] and f[2] == ARGV[a + 2] and tonumber(f[3] or '') then
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 3])
    if f[4] ~= ARGV[a + 3] then redis.call('HSET', KEYS[i], 'ttl', ARGV[a + 3]) end
    out[i] = 'OK'
  else
    out[i] = 'LOST'
  end
end
return out
`)
	hgetManyScript = redis.NewScript(`
local out = {}
for i = 1, #KEYS do
  local a = (i - 1) * 4
  if redis.pcall('HGET', KEYS[i], 'token') == ARGV[a + 2] then
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 3])
    out[i] = 'OK'
  else
    out[i] = 'LOST'
  end
end
return out
`)
)

// BenchmarkRenewVariantsServerCPU compares, on one real redis-server and
// interleaved (the order rotating every round), the server's CPU time per
// renewal of batch scripts over 1,024 leases (4 scripts of 256, one
// pipeline): "current" (renewManyScript), "previous" (which wrote
// renewed_at and ttl: prevRenewManyScript), "pexpire" (no owner check:
// the floor) and the smaller owner checks of hmget4ManyScript and its
// kin, on locks (no heartbeat record) and, with the suffix "hb", on
// leaders whose renewal refreshes their heartbeat record (the members set
// covering it, as it mostly does). Each variant renews its own leases, so
// that the hashes are those it would find (the previous version's have the
// field renewed_at). Rounds alternate so that a change of the machine's
// load falls on every variant alike; each row is the median over rounds
// of the CPU time (INFO cpu, the INFO calls' own cost subtracted) per
// renewal.
func BenchmarkRenewVariantsServerCPU(b *testing.B) {
	const n, per = 1024, 256
	ctx := context.Background()
	srv := testredis.Start(b)
	admin := srv.NewClient(b, nil)
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true})
	be, err := New(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	base := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	type variant struct {
		name   string
		script *redis.Script
		hb     bool // leaders: the renewal refreshes the holder's record
		want   string
		calls  []batchScriptCall
		cpu    []float64
	}
	variants := []*variant{
		{name: "current", script: renewManyScript, want: "OK"},
		{name: "previous", script: prevRenewManyScript, want: "OK"},
		{name: "pexpire", script: pexpireManyScript, want: "OK"},
		{name: "hmget2", script: hmget2ManyScript, want: "OK"},
		{name: "hget", script: hgetManyScript, want: "OK"},
		{name: "hmget4", script: hmget4ManyScript, want: "OK"},
		{name: "current-hb", script: renewManyScript, hb: true, want: "OKH"},
		{name: "previous-hb", script: prevRenewManyScript, hb: true, want: "OKH"},
	}
	const hbTTL = 15 * time.Second
	for vi, v := range variants {
		for i := range n {
			if i%per == 0 {
				v.calls = append(v.calls, be.newBatchScriptCall(per, 3, 4, false))
			}
			key := fmt.Sprintf("%s/%d/%d", base, vi, i)
			if !v.hb {
				key = "lock/" + key
			}
			l, err := be.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "bench", TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			cl := &v.calls[len(v.calls)-1]
			cl.keys = append(cl.keys, be.keyBase(l.Key))
			hb := "0"
			if v.hb {
				if err := be.Heartbeat(ctx, key, "bench", hbTTL); err != nil {
					b.Fatal(err)
				}
				cl.keys = append(cl.keys, be.keyBase(key)+":heartbeat:bench", be.keyBase(key)+":members")
				hb = strconv.FormatInt(hbTTL.Milliseconds(), 10)
			}
			cl.args = append(cl.args, l.HolderID, l.Token, strconv.FormatInt(ttlMillis(l.TTL), 10), hb)
			cl.items = append(cl.items, i)
		}
	}
	renew := func(v *variant) {
		p := c.Pipeline()
		cmds := make([]*redis.Cmd, len(v.calls))
		for i := range v.calls {
			cmds[i] = v.calls[i].evalSha(ctx, v.script)
			_ = p.Process(ctx, cmds[i])
		}
		_, _ = p.Exec(ctx)
		for _, cmd := range cmds {
			arr, err := cmd.Slice()
			if err != nil || len(arr) != per {
				b.Fatalf("%s: got %d replies, %v; want %d", v.name, len(arr), err, per)
			}
			for _, r := range arr {
				if r != v.want {
					b.Fatalf("%s: got %v, want %s", v.name, r, v.want)
				}
			}
		}
	}
	for _, v := range variants { // load the scripts; the previous version's hashes get renewed_at
		if err := v.script.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		renew(v)
	}
	infoCost := 0.0
	for range 20 {
		u := mainThreadCPU(ctx, admin)
		infoCost += (mainThreadCPU(ctx, admin) - u) / 20
	}
	round := 0
	for b.Loop() {
		for k := range variants {
			v := variants[(round+k)%len(variants)]
			u := mainThreadCPU(ctx, admin)
			renew(v)
			v.cpu = append(v.cpu, (mainThreadCPU(ctx, admin)-u-infoCost)/n)
		}
		round++
	}
	for _, v := range variants {
		slices.Sort(v.cpu)
		b.ReportMetric(v.cpu[len(v.cpu)/2], v.name+"-server-cpu-µs/renewal")
	}
}

// acquireVariants are acquireScript and variants of its free path, made
// by replacing part of its source (each replacement must match).
func acquireVariants(b *testing.B) map[string]*redis.Script {
	variant := func(old, new string) *redis.Script {
		if !strings.Contains(acquireSrc, old) {
			b.Fatalf("acquireSrc has no %q", old)
		}
		return redis.NewScript(strings.Replace(acquireSrc, old, new, 1))
	}
	return map[string]*redis.Script{
		"current": acquireScript,
		// previous: it also wrote renewed_at.
		"previous": variant(`'acquired_at', now, 'ttl', ARGV[3])`, `'acquired_at', now, 'renewed_at', now, 'ttl', ARGV[3])`),
		// setget: the counter read and written in one SET ... GET (Redis
		// 6.2), the term taken from the clock and corrected (a second SET)
		// only when the counter is at or above it. Foreign data in the
		// counter is not restored: a measurement only.
		"setget": variant(acquireSrc[strings.Index(acquireSrc, "local cur = redis.pcall('GET', KEYS[2])"):strings.Index(acquireSrc, "if #ARGV == 6 then")], `
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local tn = sec * 1000000 + usec
local cur = redis.pcall('SET', KEYS[2], string.format('%d', tn), 'PX', ARGV[4], 'GET')
if cur then
  if type(cur) == 'table' then return {'WRONGTYPE', KEYS[2], 'not a string'} end
  local n = tonumber(cur)
  if not n then return {'WRONGTYPE', KEYS[2], 'a string that is not a non-negative integer'} end
  if n >= tn then
    tn = n + 1
    redis.call('SET', KEYS[2], string.format('%d', tn), 'PX', ARGV[4])
  end
end
local term = string.format('%d', tn)
local now = string.format('%d', sec * 1000 + math.floor(usec / 1000))
`),
	}
}

// BenchmarkAcquireVariantsServerCPU compares, as
// BenchmarkRenewVariantsServerCPU does (one server, interleaved rounds,
// medians), the server's CPU time of acquireScript's free path and its
// variants (acquireVariants), each acquiring 512 free lock keys (term
// counters present) in one pipeline; the keys are released after each
// round, outside the measurement.
func BenchmarkAcquireVariantsServerCPU(b *testing.B) {
	const n = 512
	ctx := context.Background()
	srv := testredis.Start(b)
	admin := srv.NewClient(b, nil)
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true})
	be, err := New(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	base := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	type variant struct {
		name   string
		script *redis.Script
		keys   [][]string
		cpu    []float64
	}
	var variants []*variant
	for name, s := range acquireVariants(b) {
		v := &variant{name: name, script: s}
		for i := range n {
			kb := be.keyBase(fmt.Sprintf("lock/%s/%s/%d", base, name, i))
			v.keys = append(v.keys, []string{kb, kb + ":term"})
		}
		variants = append(variants, v)
	}
	slices.SortFunc(variants, func(x, y *variant) int { return strings.Compare(x.name, y.name) })
	const holder, token = "bench", "0123456789abcdef0123456789abcdef"
	run := func(v *variant, s *redis.Script, args ...any) {
		p := c.Pipeline()
		cmds := make([]*redis.Cmd, n)
		for i, k := range v.keys {
			cmds[i] = s.EvalSha(ctx, p, k, args...)
		}
		_, _ = p.Exec(ctx)
		for _, cmd := range cmds {
			if err := cmd.Err(); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
	}
	acquire := func(v *variant) { run(v, v.script, holder, token, 10000, 60000, "PUBLISH", "") }
	release := func(v *variant) { run(v, releaseScript, holder, token, "PUBLISH") }
	for _, v := range variants { // load the scripts, create the counters
		for _, s := range []*redis.Script{v.script, releaseScript} {
			if err := s.Load(ctx, c).Err(); err != nil {
				b.Fatal(err)
			}
		}
		acquire(v)
		release(v)
	}
	infoCost := 0.0
	for range 20 {
		u := mainThreadCPU(ctx, admin)
		infoCost += (mainThreadCPU(ctx, admin) - u) / 20
	}
	round := 0
	for b.Loop() {
		for k := range variants {
			v := variants[(round+k)%len(variants)]
			u := mainThreadCPU(ctx, admin)
			acquire(v)
			v.cpu = append(v.cpu, (mainThreadCPU(ctx, admin)-u-infoCost)/n)
			release(v)
		}
		round++
	}
	for _, v := range variants {
		slices.Sort(v.cpu)
		b.ReportMetric(v.cpu[len(v.cpu)/2], v.name+"-server-cpu-µs/acquire")
	}
}

// pairFloorRelease is bsm/redislock's release: GET, compare, DEL.
var pairFloorRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end`)

// pairFloorAcquire is the least a script can do to take a lease hash with
// a TTL: HSET and PEXPIRE, no check that the key is free, no term.
var pairFloorAcquire = redis.NewScript(`redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', ARGV[2]) redis.call('PEXPIRE', KEYS[1], ARGV[3]) return 1`)

// BenchmarkPairFloor measures the wall time of an acquisition and a
// release of one free key from one goroutine (the bench's "1 goroutine"
// lock row) on one real redis-server, in interleaved rounds, for these
// pairs:
//
//	setnx      bsm/redislock's: SET NX PX, then a script of GET and DEL
//	script     the least a script writing a lease hash can do
//	           (pairFloorAcquire), then our releaseScript
//	backend    this package's Acquire and Release
//	scripts    acquireScript and releaseScript run with Script.Run and
//	           the Backend's arguments, without the Backend's code
//	lean       scripts with three calls fewer: no PUBLISH in either, and
//	           the term counter read and written by one SET ... GET
//	           (acquireVariants' "setget")
//	conn       scripts sent on a connection held for them (go-redis
//	           Client.Conn) instead of through the pool, which checks a
//	           connection's health (a syscall) each time it hands it out
//
// It reports the median over rounds of each pair's µs, and each one's
// pairs/s against setnx's: "script" is what running a script for the
// acquisition costs at all, whatever the script does; "lean" and "conn"
// against "scripts" what fewer calls, or no pool, would save.
//
//	go test -run '^$' -bench BenchmarkPairFloor -benchtime 9x ./redisbackend
func BenchmarkPairFloor(b *testing.B) {
	const pairs = 4000 // per pair kind and round
	ctx := context.Background()
	srv := testredis.Start(b)
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true, DisableIdentity: true})
	be, err := New(c, &Options{Prefix: "floor:"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	const holder = "bench"
	conn := c.Conn()
	b.Cleanup(func() { _ = conn.Close() })
	// scripts is a pair of acquireScript (or a variant of it) and
	// releaseScript, on key, sent through c.
	scripts := func(c redis.Scripter, acquire *redis.Script, publish any, key string) func() error {
		lease := be.keyBase(backend.LockKeyPrefix + key)
		return func() error {
			tok := backend.NewToken()
			if err := acquire.Run(ctx, c, []string{lease, lease + ":term"}, holder, tok, int64(10000), be.termKeepArg, publish, be.guardArg).Err(); err != nil {
				return err
			}
			return releaseScript.Run(ctx, c, []string{lease}, holder, tok, publish).Err()
		}
	}
	kinds := []struct {
		name string
		pair func() error
	}{
		{"setnx", func() error {
			tok := backend.NewToken()
			ok, err := c.SetNX(ctx, "floor:setnx", tok, 10*time.Second).Result()
			if err != nil || !ok {
				return fmt.Errorf("SET NX: %v %v", ok, err)
			}
			return pairFloorRelease.Run(ctx, c, []string{"floor:setnx"}, tok).Err()
		}},
		{"script", func() error {
			tok := backend.NewToken()
			if err := pairFloorAcquire.Run(ctx, c, []string{"floor:script"}, holder, tok, 10000).Err(); err != nil {
				return err
			}
			return releaseScript.Run(ctx, c, []string{"floor:script"}, holder, tok, "").Err()
		}},
		{"backend", func() error {
			l, err := be.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: holder, TTL: 10 * time.Second})
			if err != nil {
				return err
			}
			return be.Release(ctx, l)
		}},
		{"scripts", scripts(c, acquireScript, be.publishArg, "scripts")},
		{"lean", scripts(c, acquireVariants(b)["setget"], "", "lean")},
		{"conn", scripts(conn, acquireScript, be.publishArg, "conn")},
	}
	us := make([][]float64, len(kinds))
	for _, k := range kinds { // load the scripts, warm the connection
		for range 100 {
			if err := k.pair(); err != nil {
				b.Fatalf("%s: %v", k.name, err)
			}
		}
	}
	round := 0
	for b.Loop() {
		for j := range kinds {
			i := (round + j) % len(kinds)
			start := time.Now()
			for range pairs {
				if err := kinds[i].pair(); err != nil {
					b.Fatalf("%s: %v", kinds[i].name, err)
				}
			}
			us[i] = append(us[i], float64(time.Since(start).Microseconds())/pairs)
		}
		round++
	}
	med := make([]float64, len(kinds))
	for i, k := range kinds {
		slices.Sort(us[i])
		med[i] = us[i][len(us[i])/2]
		b.ReportMetric(med[i], k.name+"-µs/pair")
	}
	for i, k := range kinds[1:] {
		b.ReportMetric(med[0]/med[i+1], k.name+"÷setnx-pairs/s")
	}
}
