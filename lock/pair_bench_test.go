package lock_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/lock/locktest"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// BenchmarkRedisPair measures the wall time of a TryAcquire + Release pair
// through package lock ("locker") and of the backend's Acquire + Release
// alone ("backend") on one real redis-server, in the same run, each with
// its own client configured as the bench's (bench/counters.go): the
// difference of their ns/op is what package lock adds to a pair's wall
// time. Each sub-benchmark runs with g goroutines, each on its own key.
//
//	go test -run '^$' -bench BenchmarkRedisPair -benchtime 20000x ./lock
func BenchmarkRedisPair(b *testing.B) {
	srv := testredis.Start(b)
	newBackend := func(b *testing.B) backend.Backend { return benchRedis(b, srv) }
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("locker/g=%d", g), func(b *testing.B) {
			rb := newBackend(b)
			l, err := lock.New(rb, "bench", &lock.Options{TTL: 10 * time.Second, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			runPairs(b, g, func(ctx context.Context, key string) error {
				lk, err := l.TryAcquire(ctx, key, nil)
				if err != nil {
					return err
				}
				return lk.Release(ctx)
			})
		})
		b.Run(fmt.Sprintf("backend/g=%d", g), func(b *testing.B) {
			rb := newBackend(b)
			runPairs(b, g, func(ctx context.Context, key string) error {
				le, err := rb.Acquire(ctx, backend.AcquireRequest{Key: lock.Prefix + key, HolderID: "bench", TTL: 10 * time.Second})
				if err != nil {
					return err
				}
				return rb.Release(ctx, le)
			})
		})
	}
}

// runPairs runs b.N pairs over g goroutines, each on its own key, after a
// warm-up, and reports pairs/s and the process's CPU per pair.
func runPairs(b *testing.B, g int, pair func(ctx context.Context, key string) error) {
	ctx := context.Background()
	keys := make([]string, g)
	for i := range keys {
		keys[i] = fmt.Sprintf("pair:%d", i)
		for range 10 {
			if err := pair(ctx, keys[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ferr error
	)
	if g == 1 {
		for range b.N {
			if err := pair(ctx, keys[0]); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		var left atomic.Int64
		left.Store(int64(b.N))
		for _, k := range keys {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					if err := pair(ctx, k); err != nil {
						mu.Lock()
						ferr = err
						mu.Unlock()
						return
					}
				}
			})
		}
		wg.Wait()
	}
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	if ferr != nil {
		b.Fatal(ferr)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "pairs/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
}

// BenchmarkPairDiff measures what package lock adds to the wall time and
// the CPU of a TryAcquire + Release pair on a real redis-server, with 1 and
// 16 goroutines (locktest.PairDiff; the etcd module has the same on an
// embedded etcd).
//
//	go test -run '^$' -bench BenchmarkPairDiff -benchtime 20000x ./lock
func BenchmarkPairDiff(b *testing.B) {
	b.Run("redis", func(b *testing.B) {
		srv := testredis.Start(b)
		newBackend := func(b *testing.B) backend.Backend { return benchRedis(b, srv) }
		for _, g := range []int{1, 16} {
			b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) { locktest.PairDiff(b, g, newBackend(b), newBackend(b)) })
		}
	})
}

// benchRedis returns a Redis backend on srv with a client of its own,
// configured as the bench's, and keys of its own, closed after b.
func benchRedis(b *testing.B, srv *testredis.Server) backend.Backend {
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true, DisableIdentity: true})
	rb, err := redisbackend.New(c, &redisbackend.Options{Prefix: fmt.Sprintf("bench:%d:", time.Now().UnixNano())})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rb.Close() })
	return rb
}
