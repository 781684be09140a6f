package redisbackend_test

import (
	"context"
	"fmt"
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
