package redisbackend_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// benchBackend returns a Backend on a fresh real server and the hook that
// counts its round trips.
func benchBackend(b *testing.B) (*redisbackend.Backend, *countHook) {
	b.Helper()
	srv := testredis.Start(b)
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true, PoolSize: 64})
	hook := &countHook{}
	c.AddHook(hook)
	return newBackend(b, c, &redisbackend.Options{Prefix: fmt.Sprintf("bench:%d:", time.Now().UnixNano())}), hook
}

func acquireRelease(ctx context.Context, b *redisbackend.Backend, key string) error {
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "bench", TTL: 10 * time.Second})
	if err != nil {
		return err
	}
	return b.Release(ctx, l)
}

// BenchmarkAcquireRelease measures acquire+release pairs on one key from one
// goroutine against a real redis-server.
func BenchmarkAcquireRelease(b *testing.B) {
	be, hook := benchBackend(b)
	ctx := context.Background()
	if err := acquireRelease(ctx, be, "k"); err != nil { // loads the scripts
		b.Fatal(err)
	}
	hook.n.Store(0)
	start := time.Now()
	n := 0
	for b.Loop() {
		if err := acquireRelease(ctx, be, "k"); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "pairs/s")
	b.ReportMetric(float64(hook.n.Load())/float64(n), "roundtrips/pair")
}

// BenchmarkAcquireReleaseParallel measures acquire+release pairs from
// GOMAXPROCS goroutines (times -cpu), each on its own key.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	be, hook := benchBackend(b)
	ctx := context.Background()
	if err := acquireRelease(ctx, be, "warm"); err != nil {
		b.Fatal(err)
	}
	hook.n.Store(0)
	var id, pairs atomic.Int64
	start := time.Now()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("k%d", id.Add(1))
		for pb.Next() {
			if err := acquireRelease(ctx, be, key); err != nil {
				b.Error(err)
				return
			}
			pairs.Add(1)
		}
	})
	b.ReportMetric(float64(pairs.Load())/time.Since(start).Seconds(), "pairs/s")
	b.ReportMetric(float64(hook.n.Load())/float64(pairs.Load()), "roundtrips/pair")
}

// BenchmarkRenew measures one leader's renewals.
func BenchmarkRenew(b *testing.B) {
	be, hook := benchBackend(b)
	ctx := context.Background()
	l, err := be.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "bench", TTL: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	if err := be.Renew(ctx, l); err != nil {
		b.Fatal(err)
	}
	hook.n.Store(0)
	n := 0
	for b.Loop() {
		if err := be.Renew(ctx, l); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(hook.n.Load())/float64(n), "roundtrips/op")
}

// BenchmarkModes measures AcquireMode+Release pairs from one goroutine
// against a real redis-server, next to plain Acquire+Release on a lock
// key: an Exclusive entry, a Shared entry among 3 live readers of a
// semaphore of 5, and an Exclusive page lock with 2 ancestors whose root
// holds 10 intents of other pages. server-µs/pair is the scripts' time on
// the server (INFO commandstats), which the load of the machine disturbs
// less than the wall-clock rate.
func BenchmarkModes(b *testing.B) {
	ctx := context.Background()
	srv := testredis.Start(b)
	admin := srv.NewClient(b, nil)
	scriptUsec := func() float64 {
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
	req := func(key string, m backend.Mode, limit int, anc ...string) backend.ModeRequest {
		return backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: key, HolderID: "bench", TTL: 10 * time.Second},
			Mode: m, Limit: limit, Ancestors: anc}
	}
	cases := []struct {
		name  string
		setup []backend.ModeRequest
		req   *backend.ModeRequest // nil: plain Acquire
	}{
		{"plain", nil, nil},
		{"exclusive", nil, &backend.ModeRequest{}},
		{"shared 4 of 5", []backend.ModeRequest{req("lock/k", backend.Shared, 5), req("lock/k", backend.Shared, 5), req("lock/k", backend.Shared, 5)},
			ptr(req("lock/k", backend.Shared, 5))},
		{"page of a tree with 10 pages held", nil, ptr(req("lock/k/set/page", backend.Exclusive, 0, "lock/k", "lock/k/set"))},
	}
	for i := range 10 {
		cases[3].setup = append(cases[3].setup, req(fmt.Sprintf("lock/k/set/p%d", i), backend.Exclusive, 0, "lock/k", "lock/k/set"))
	}
	cases[1].req = ptr(req("lock/k", backend.Exclusive, 0))
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true})
			hook := &countHook{}
			c.AddHook(hook)
			be := newBackend(b, c, &redisbackend.Options{Prefix: fmt.Sprintf("bench:%d:", time.Now().UnixNano())})
			for _, r := range tc.setup {
				if _, err := be.AcquireMode(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			pair := func() error {
				if tc.req == nil {
					return acquireRelease(ctx, be, "lock/k")
				}
				l, err := be.AcquireMode(ctx, *tc.req)
				if err != nil {
					return err
				}
				return be.Release(ctx, l)
			}
			if err := pair(); err != nil { // loads the scripts
				b.Fatal(err)
			}
			hook.n.Store(0)
			usec := scriptUsec()
			start := time.Now()
			n := 0
			for b.Loop() {
				if err := pair(); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64(n)/time.Since(start).Seconds(), "pairs/s")
			b.ReportMetric(float64(hook.n.Load())/float64(n), "roundtrips/pair")
			b.ReportMetric((scriptUsec()-usec)/float64(n), "server-µs/pair")
		})
	}
}

func ptr[T any](v T) *T { return &v }
