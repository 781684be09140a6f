package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// evalUsec returns the server time spent so far in EVALSHA and EVAL, in
// microseconds, as INFO commandstats reports it.
func evalUsec(ctx context.Context, admin *redis.Client) float64 {
	info := admin.Info(ctx, "commandstats").Val()
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				for _, kv := range strings.Split(rest, ",") {
					if v, ok := strings.CutPrefix(kv, "usec="); ok {
						n, _ := strconv.ParseFloat(v, 64)
						total += n
					}
				}
			}
		}
	}
	return total
}

// Scripts of bsm/redislock v0.9.4 (Obtain and Release), run here on the
// same server as a reference for what a minimal lock costs there.
var (
	refObtain = redis.NewScript(`
if redis.call("set", KEYS[1], ARGV[1], "NX", "PX", ARGV[3]) then return redis.status_reply("OK") end

local offset = tonumber(ARGV[2])
if redis.call("getrange", KEYS[1], 0, offset-1) == string.sub(ARGV[1], 1, offset) then return redis.call("set", KEYS[1], ARGV[1], "PX", ARGV[3]) end
`)
	refRelease = redis.NewScript(`if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) else return 0 end`)
)

// BenchmarkScriptServerTime measures the server time of each plain script
// on its own against a real redis-server: Acquire of a free lock key (whose
// term counter exists, as in a loop of pairs), Release, and Acquire of a
// key another holder has (the HELD reply with the record), next to
// bsm/redislock's Obtain and Release scripts. server-µs/op is the
// difference of INFO commandstats around each call, so the load of the
// machine and the round trip do not enter it (the server's own CPU speed
// does: compare rows of one run). Only the fastest half of the calls
// counts: on a loaded machine the others include time the server was
// preempted in.
func BenchmarkScriptServerTime(b *testing.B) {
	ctx := context.Background()
	srv := testredis.Start(b)
	admin := srv.NewClient(b, nil)
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true})
	be := newBackend(b, c, nil)
	key := "lock/bench/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	req := backend.AcquireRequest{Key: key, HolderID: "bench", TTL: 10 * time.Second}
	other := backend.AcquireRequest{Key: key + "/held", HolderID: "other", TTL: time.Hour, // outlives the benchmark, however long it runs
		Metadata: map[string]string{"op": "tally"}}
	if _, err := be.Acquire(ctx, other); err != nil {
		b.Fatal(err)
	}
	// measure runs op b.N times between the steps before and after it and
	// reports op's own server time.
	measure := func(b *testing.B, before, op, after func() error) {
		var us []float64
		for b.Loop() {
			if before != nil {
				if err := before(); err != nil {
					b.Fatal(err)
				}
			}
			u := evalUsec(ctx, admin)
			if err := op(); err != nil {
				b.Fatal(err)
			}
			us = append(us, evalUsec(ctx, admin)-u)
			if after != nil {
				if err := after(); err != nil {
					b.Fatal(err)
				}
			}
		}
		// The fastest half: a script preempted by another process on a
		// loaded machine takes longer by the wall clock, which is what
		// commandstats counts.
		slices.Sort(us)
		us = us[:max(1, len(us)/2)]
		total := 0.0
		for _, u := range us {
			total += u
		}
		b.ReportMetric(total/float64(len(us)), "server-µs/op")
	}
	var l backend.Lease
	acquire := func() (err error) { l, err = be.Acquire(ctx, req); return err }
	release := func() error { return be.Release(ctx, l) }
	if err := acquire(); err != nil { // loads the scripts, creates the counter
		b.Fatal(err)
	}
	if err := release(); err != nil {
		b.Fatal(err)
	}
	b.Run("acquire", func(b *testing.B) { measure(b, nil, acquire, release) })
	b.Run("release", func(b *testing.B) { measure(b, acquire, release, nil) })
	b.Run("acquire held", func(b *testing.B) {
		measure(b, nil, func() error {
			_, err := be.Acquire(ctx, other)
			if !errors.Is(err, backend.ErrHeld) {
				return fmt.Errorf("Acquire of a held key: got %v, want ErrHeld", err)
			}
			return nil
		}, nil)
	})
	rk := []string{"bench:redislock:" + key}
	obtain := func() error { return refObtain.Run(ctx, c, rk, "tokentokentokentokent", 21, "10000").Err() }
	unlock := func() error { return refRelease.Run(ctx, c, rk, "tokentokentokentokent").Err() }
	if err := obtain(); err != nil {
		b.Fatal(err)
	}
	if err := unlock(); err != nil {
		b.Fatal(err)
	}
	b.Run("redislock obtain", func(b *testing.B) { measure(b, nil, obtain, unlock) })
	b.Run("redislock release", func(b *testing.B) { measure(b, obtain, unlock, nil) })
}

// serverCPU returns the CPU time the server's main thread has used so far
// (INFO cpu), in microseconds.
func serverCPU(ctx context.Context, admin *redis.Client) float64 {
	info := admin.Info(ctx, "cpu").Val()
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_sys_main_thread:", "used_cpu_user_main_thread:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += n * 1e6
			}
		}
	}
	return total
}

// BenchmarkScriptServerCPU measures the server's CPU time per plain call
// against a real redis-server, the calls sent in pipelines of 500 (the
// backend's batcher pipelines concurrent calls; bsm/redislock's scripts are
// pipelined by hand), so that reading and writing the socket is shared and
// the scripts' own cost dominates. Unlike the wall-clock time that
// commandstats reports, CPU time does not grow when the server is
// preempted, so it is steadier on a loaded machine. Rows: Acquire of free
// lock keys (term counters present), Release, Acquire of a key another
// holder has (HELD with the record), bsm/redislock's Obtain and Release.
// The INFO calls around each pipeline are measured alone and subtracted.
func BenchmarkScriptServerCPU(b *testing.B) {
	const batch = 500
	ctx := context.Background()
	srv := testredis.Start(b)
	admin := srv.NewClient(b, nil)
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true, PoolSize: 4})
	be := newBackend(b, c, nil)
	base := "lock/bench/" + strconv.FormatInt(time.Now().UnixNano(), 36)
	reqs := make([]backend.AcquireRequest, batch)
	for i := range reqs {
		reqs[i] = backend.AcquireRequest{Key: fmt.Sprintf("%s/%d", base, i), HolderID: "bench", TTL: 10 * time.Second}
	}
	other := backend.AcquireRequest{Key: base + "/held", HolderID: "other", TTL: time.Hour, // outlives the benchmark, however long it runs
		Metadata: map[string]string{"op": "tally"}}
	if _, err := be.Acquire(ctx, other); err != nil {
		b.Fatal(err)
	}
	leases := make([]backend.Lease, batch)
	// all runs f(i) for every i of the batch concurrently, so that the
	// batcher sends them as pipelines.
	all := func(f func(i int) error) error {
		errs := make([]error, batch)
		var wg sync.WaitGroup
		for i := range batch {
			wg.Go(func() { errs[i] = f(i) })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	acquire := func() error {
		return all(func(i int) (err error) { leases[i], err = be.Acquire(ctx, reqs[i]); return err })
	}
	release := func() error { return all(func(i int) error { return be.Release(ctx, leases[i]) }) }
	held := func() error {
		return all(func(int) error {
			if _, err := be.Acquire(ctx, other); !errors.Is(err, backend.ErrHeld) {
				return fmt.Errorf("Acquire of a held key: got %v, want ErrHeld", err)
			}
			return nil
		})
	}
	refKeys := make([]string, batch)
	for i := range refKeys {
		refKeys[i] = "bench:redislock:" + reqs[i].Key
	}
	ref := func(s *redis.Script, args ...any) func() error {
		return func() error {
			p := c.Pipeline()
			for _, k := range refKeys {
				s.EvalSha(ctx, p, []string{k}, args...)
			}
			_, err := p.Exec(ctx)
			return err
		}
	}
	obtain := ref(refObtain, "tokentokentokentokent", 21, "10000")
	unlock := ref(refRelease, "tokentokentokentokent")
	// Warm up: load the scripts, create the term counters.
	for _, f := range []func() error{acquire, release, held} {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	if err := refObtain.Run(ctx, c, refKeys[:1], "x", 1, "1").Err(); err != nil {
		b.Fatal(err)
	}
	if err := refRelease.Run(ctx, c, refKeys[:1], "x").Err(); err != nil {
		b.Fatal(err)
	}
	// infoCost is the CPU time of the two INFO calls around a measurement.
	infoCost := 0.0
	for range 20 {
		u := serverCPU(ctx, admin)
		infoCost += (serverCPU(ctx, admin) - u) / 20
	}
	measure := func(b *testing.B, before, op, after func() error) {
		total, n := 0.0, 0
		for b.Loop() {
			if before != nil {
				if err := before(); err != nil {
					b.Fatal(err)
				}
			}
			u := serverCPU(ctx, admin)
			if err := op(); err != nil {
				b.Fatal(err)
			}
			total += serverCPU(ctx, admin) - u - infoCost
			n += batch
			if after != nil {
				if err := after(); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(total/float64(n), "server-cpu-µs/op")
	}
	b.Run("acquire", func(b *testing.B) { measure(b, nil, acquire, release) })
	b.Run("release", func(b *testing.B) { measure(b, acquire, release, nil) })
	b.Run("acquire held", func(b *testing.B) { measure(b, nil, held, nil) })
	b.Run("redislock obtain", func(b *testing.B) { measure(b, nil, obtain, unlock) })
	b.Run("redislock release", func(b *testing.B) { measure(b, obtain, unlock, nil) })
}
