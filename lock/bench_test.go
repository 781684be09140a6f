package lock_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// BenchmarkPair measures what package lock adds to a TryAcquire + Release
// pair, on the memory backend (no network): compare "locker" with
// "backend", the backend's Acquire + Release alone.
//
//	go test -run '^$' -bench BenchmarkPair -benchmem ./lock
func BenchmarkPair(b *testing.B) {
	ctx := context.Background()
	b.Run("locker", func(b *testing.B) {
		m := memorybackend.New()
		defer m.Close()
		l, err := lock.New(m, "me", &lock.Options{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		b.ReportAllocs()
		for b.Loop() {
			lk, err := l.TryAcquire(ctx, "k", nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// On a backend that renews in batches (Redis, etcd), every held lock
	// joins the keeper's shared scheduler: this is the path of a pair there.
	b.Run("locker batching", func(b *testing.B) {
		m := &batchingMemory{Backend: memorybackend.New()}
		defer m.Close()
		l, err := lock.New(m, "me", &lock.Options{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		b.ReportAllocs()
		for b.Loop() {
			lk, err := l.TryAcquire(ctx, "k", nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// A context that may be cancelled (a request's) takes the other path:
	// a context.WithTimeout of its own per store call.
	b.Run("locker batching, cancellable context", func(b *testing.B) {
		m := &batchingMemory{Backend: memorybackend.New()}
		defer m.Close()
		l, err := lock.New(m, "me", &lock.Options{Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		b.ReportAllocs()
		for b.Loop() {
			lk, err := l.TryAcquire(ctx, "k", nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("backend", func(b *testing.B) {
		m := memorybackend.New()
		defer m.Close()
		req := backend.AcquireRequest{Key: backend.LockKeyPrefix + "k", HolderID: "me", TTL: 10 * time.Second}
		b.ReportAllocs()
		for b.Loop() {
			l, err := m.Acquire(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if err := m.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// batchingMemory is a memory backend that renews in batches, as Redis and
// etcd do, so that held locks go through the keeper's shared scheduler.
type batchingMemory struct {
	*memorybackend.Backend
	batches atomic.Int64
}

func (m *batchingMemory) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	m.batches.Add(1)
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = m.Backend.Renew(ctx, l)
	}
	return errs
}

// BenchmarkHeld measures what N locks held by one process cost at rest, in
// real time, on the memory backend renewing in batches (no network, so the
// figures are the client's alone): CPU, goroutines, heap, batch calls.
//
//	SOVEREIGN_HELD_N=100000 go test -run '^$' -bench BenchmarkHeld -benchtime 1x ./lock
//
// SOVEREIGN_HELD_N sets the number of locks (default 10000).
func BenchmarkHeld(b *testing.B) {
	n := 10000
	if v := os.Getenv("SOVEREIGN_HELD_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("SOVEREIGN_HELD_N: %v", err)
		}
	}
	for range b.N {
		heldRun(b, n)
	}
}

func heldRun(b *testing.B, n int) {
	m := &batchingMemory{Backend: memorybackend.New()}
	defer m.Close()
	l, err := lock.New(m, "me", &lock.Options{TTL: 10 * time.Second, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	held := make([]*lock.Lock, n)
	for i := range held {
		if held[i], err = l.TryAcquire(context.Background(), fmt.Sprintf("held/%d", i), nil); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(3 * time.Second) // settle: a measurement's window, not synchronisation
	const window = 10 * time.Second
	c0, n0 := cpuTime(), m.batches.Load()
	time.Sleep(window)
	c1, n1 := cpuTime(), m.batches.Load()
	for i, lk := range held {
		if !lk.Held() {
			b.Fatalf("lock %d of %d not held at the end", i, n)
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(100*float64(c1-c0)/float64(window), "client-%core")
	b.ReportMetric(float64(n1-n0)*float64(time.Second)/float64(window), "batches/s")
	b.ReportMetric(float64(runtime.NumGoroutine()), "goroutines")
	b.ReportMetric(float64(ms.HeapAlloc>>20), "heap-MiB")
}

// cpuTime is the CPU time this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
