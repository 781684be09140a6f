package etcdbackend_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
)

// pairTTL is the lock TTL of the pair benchmarks, the bench's (bench/lock.go).
const pairTTL = 10 * time.Second

// pairWorker returns, for goroutine i, a function that acquires and
// releases one key once, and a function freeing what it holds.
type pairWorker func(tb testing.TB, i int) (pair func(ctx context.Context) error, done func())

// runPairs runs b.N acquire+release pairs spread over g goroutines, each on
// its own key, and reports pairs/s and requests per pair.
func runPairs(b *testing.B, g int, n *counter, worker pairWorker) {
	ctx := b.Context()
	pairs := make([]func(context.Context) error, g)
	for i := range g {
		p, done := worker(b, i)
		b.Cleanup(done)
		pairs[i] = p
		// Warm up: connections, the session, the markers' lease.
		for range 3 {
			if err := p(ctx); err != nil {
				b.Fatalf("warm-up pair: %v", err)
			}
		}
	}
	n.reset()
	var left atomic.Int64
	left.Store(int64(b.N))
	var firstErr atomic.Pointer[error]
	b.ResetTimer()
	cpu0 := cpuTime()
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range pairs {
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				if err := p(ctx); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	if p := firstErr.Load(); p != nil {
		b.Fatalf("pair: %v", *p)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "pairs/s")
	b.ReportMetric(float64(n.total())/float64(b.N), "requests/op")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
	if g == 1 && b.N >= 100 {
		b.Logf("requests by method over %d pairs: %v", b.N, n.byMethod())
	}
}

// cpuTime returns the CPU time (user and system) this process has used: the
// client's and the embedded server's.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkPairs measures TryAcquire+Release pairs per second on distinct
// keys through package lock, through the backend contract alone, and with
// etcd's concurrency.Mutex (TryLock+Unlock on a session per goroutine), on
// the shared embedded server: the bench's lock scenario in miniature, for
// profiling (-cpuprofile) and request counts.
func BenchmarkPairs(b *testing.B) {
	for _, g := range []int{1, 16} {
		b.Run(fmt.Sprintf("lock/g=%d", g), func(b *testing.B) {
			be, n := benchBackend(b)
			lk, err := lock.New(be, "bench", &lock.Options{TTL: pairTTL, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { lk.Close() })
			runPairs(b, g, n, func(tb testing.TB, i int) (func(context.Context) error, func()) {
				key := fmt.Sprintf("k%d", i)
				return func(ctx context.Context) error {
					h, err := lk.TryAcquire(ctx, key, nil)
					if err != nil {
						return err
					}
					return h.Release(ctx)
				}, func() {}
			})
		})
		b.Run(fmt.Sprintf("contract/g=%d", g), func(b *testing.B) {
			be, n := benchBackend(b)
			runPairs(b, g, n, func(tb testing.TB, i int) (func(context.Context) error, func()) {
				req := backend.AcquireRequest{Key: fmt.Sprintf("lock/k%d", i), HolderID: "bench", TTL: pairTTL}
				return func(ctx context.Context) error {
					l, err := be.Acquire(ctx, req)
					if err != nil {
						return err
					}
					return be.Release(ctx, l)
				}, func() {}
			})
		})
		b.Run(fmt.Sprintf("mutex/g=%d", g), func(b *testing.B) {
			var n counter
			cli := newClient(b, nil, n.configure)
			pfx := "/" + newPrefix()
			runPairs(b, g, &n, func(tb testing.TB, i int) (func(context.Context) error, func()) {
				s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(pairTTL/time.Second)))
				if err != nil {
					tb.Fatal(err)
				}
				m := concurrency.NewMutex(s, fmt.Sprintf("%sk%d", pfx, i))
				return func(ctx context.Context) error {
					if err := m.TryLock(ctx); err != nil {
						return err
					}
					return m.Unlock(ctx)
				}, func() { s.Close() }
			})
		})
	}
}
