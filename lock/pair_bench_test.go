package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock"
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
	newBackend := func(b *testing.B) backend.Backend {
		c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true, DisableIdentity: true})
		rb, err := redisbackend.New(c, &redisbackend.Options{Prefix: fmt.Sprintf("bench:%d:", time.Now().UnixNano())})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { rb.Close() })
		return rb
	}
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
// the CPU of a TryAcquire + Release pair, on a real redis-server and on an
// embedded etcd, with g goroutines each on its own key: it alternates
// blocks of pairs through package lock with blocks through the backend's
// Acquire + Release alone (each with its own client, as the bench's), so
// that a load that comes and goes on the machine weighs on both alike, and
// reports each one's wall time and CPU per pair (the process's: with etcd,
// the embedded server's too) and the differences, lock-ns/op and
// lock-cpu-ns/op. The context is context.Background(), as the bench's.
//
//	go test -run '^$' -bench BenchmarkPairDiff -benchtime 20000x ./lock
func BenchmarkPairDiff(b *testing.B) {
	b.Run("redis", func(b *testing.B) {
		srv := testredis.Start(b)
		newBackend := func(b *testing.B) backend.Backend {
			c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true, DisableIdentity: true})
			rb, err := redisbackend.New(c, &redisbackend.Options{Prefix: fmt.Sprintf("bench:%d:", time.Now().UnixNano())})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { rb.Close() })
			return rb
		}
		for _, g := range []int{1, 16} {
			b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) { pairDiff(b, g, newBackend(b), newBackend(b)) })
		}
	})
	b.Run("etcd", func(b *testing.B) {
		cl := testetcd.Start(b)
		newBackend := func(b *testing.B) backend.Backend {
			eb, err := etcdbackend.New(testetcd.NewClient(b, cl.ClientConfig()), &etcdbackend.Options{Prefix: fmt.Sprintf("bench%d/", time.Now().UnixNano())})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { eb.Close() })
			return eb
		}
		for _, g := range []int{1, 16} {
			b.Run(fmt.Sprintf("g=%d", g), func(b *testing.B) { pairDiff(b, g, newBackend(b), newBackend(b)) })
		}
	})
}

// pairDiff runs b.N pairs through a Locker on lb and b.N through bb alone,
// with g goroutines, in alternating blocks, and reports both and their
// differences.
func pairDiff(b *testing.B, g int, lb, bb backend.Backend) {
	l, err := lock.New(lb, "bench", &lock.Options{TTL: 10 * time.Second, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	viaLock := func(key string) error {
		lk, err := l.TryAcquire(ctx, key, nil)
		if err != nil {
			return err
		}
		return lk.Release(ctx)
	}
	alone := func(key string) error {
		le, err := bb.Acquire(ctx, backend.AcquireRequest{Key: lock.Prefix + key, HolderID: "bench", TTL: 10 * time.Second})
		if err != nil {
			return err
		}
		return bb.Release(ctx, le)
	}
	keys := make([]string, g)
	for i := range keys {
		keys[i] = fmt.Sprintf("pair:%d", i)
	}
	// run makes n pairs with pair over the g goroutines.
	run := func(pair func(string) error, n int) error {
		if g == 1 {
			for range n {
				if err := pair(keys[0]); err != nil {
					return err
				}
			}
			return nil
		}
		var (
			left atomic.Int64
			wg   sync.WaitGroup
			errs = make([]error, g)
		)
		left.Store(int64(n))
		for i, k := range keys {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					if errs[i] = pair(k); errs[i] != nil {
						return
					}
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	for _, pair := range []func(string) error{viaLock, alone} {
		if err := run(pair, 20*g); err != nil { // warm-up: scripts, connections
			b.Fatal(err)
		}
	}
	block := 100 * g
	var wall, cpu [2]time.Duration
	b.ResetTimer()
	pairs := []func(string) error{viaLock, alone}
	for j, done := 0, 0; done < b.N; j, done = j+1, done+block {
		n := min(block, b.N-done)
		for k := range pairs {
			i := (j + k) % 2 // each first in turn: a block after a switch may pay for it
			c0, t0 := cpuTime(), time.Now()
			if err := run(pairs[i], n); err != nil {
				b.Fatal(err)
			}
			wall[i] += time.Since(t0)
			cpu[i] += cpuTime() - c0
		}
	}
	b.StopTimer()
	per := func(d time.Duration) float64 { return float64(d) / float64(b.N) }
	b.ReportMetric(per(wall[0]), "locker-ns/op")
	b.ReportMetric(per(wall[1]), "backend-ns/op")
	b.ReportMetric(per(wall[0]-wall[1]), "lock-ns/op")
	b.ReportMetric(per(cpu[0]), "locker-cpu-ns/op")
	b.ReportMetric(per(cpu[1]), "backend-cpu-ns/op")
	b.ReportMetric(per(cpu[0]-cpu[1]), "lock-cpu-ns/op")
}
