package redisbackend

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// prevRenewManyScript is renewManyScript as it was before renewals stopped
// writing renewed_at (commit 77a0225), without its heartbeat refresh,
// which the leases it is measured on do not ask for: owner check, PEXPIRE,
// TIME once per script, HSET renewed_at and ttl.
var prevRenewManyScript = redis.NewScript(luaBase + `
local out = {}
local now
for i = 1, #ARGV / 4 do
  local a = (i - 1) * 4
  local holder, token, ttl = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local lk = KEYS[i]
  local f = redis.pcall('HMGET', lk, 'holder', 'token', 'term', 'modes')
  if failed(f) then
    out[i] = {'WRONGTYPE', lk, 'a ' .. ktype(lk)}
  elseif f[4] == '1' and not f[1] then
    out[i] = 'LOST'
  elseif f[1] and f[2] and tonumber(f[3] or '') then
    if f[1] == holder and f[2] == token then
      redis.call('PEXPIRE', lk, ttl)
      now = now or fmt(now_ms())
      redis.call('HSET', lk, 'renewed_at', now, 'ttl', ttl)
      out[i] = 'OK'
    else
      out[i] = 'LOST'
    end
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

// BenchmarkRenewVariantsServerCPU compares, on one real redis-server and
// interleaved (the order rotating every round), the server's CPU time per
// renewal of batch scripts over 1,024 lock leases (4 scripts of 256, one
// pipeline): "current" (renewManyScript), "previous" (which wrote
// renewed_at and ttl: prevRenewManyScript) and "pexpire" (no owner
// check: the floor). Each variant renews its own leases, so that the
// hashes are those it would find (the previous version's have the field
// renewed_at). Rounds alternate so that a change of the machine's load
// falls on every variant alike; each row is the median over rounds of the
// CPU time (INFO cpu, the INFO calls' own cost subtracted) per renewal.
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
		calls  []batchScriptCall
		cpu    []float64
	}
	variants := []*variant{
		{name: "current", script: renewManyScript},
		{name: "previous", script: prevRenewManyScript},
		{name: "pexpire", script: pexpireManyScript},
	}
	for vi, v := range variants {
		for i := range n {
			if i%per == 0 {
				v.calls = append(v.calls, newBatchScriptCall(per, 1, 4))
			}
			l, err := be.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("lock/%s/%d/%d", base, vi, i), HolderID: "bench", TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			cl := &v.calls[len(v.calls)-1]
			cl.keys = append(cl.keys, be.keyBase(l.Key))
			cl.args = append(cl.args, l.HolderID, l.Token, strconv.FormatInt(ttlMillis(l.TTL), 10), "0")
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
				if r != "OK" {
					b.Fatalf("%s: got %v, want OK", v.name, r)
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
