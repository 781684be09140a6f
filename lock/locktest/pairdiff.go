package locktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
)

// PairDiff measures what package lock adds to the wall time and the CPU of
// a TryAcquire + Release pair: it runs b.N pairs through a Locker on lb and
// b.N through bb's Acquire + Release alone (give each its own client, as the
// bench does), with g goroutines each on its own key, in alternating blocks
// (each first in turn), so that a load that comes and goes on the machine
// weighs on both alike. It reports each one's wall time and CPU per pair
// (the process's: with an embedded server, the server's too) and the
// differences, lock-ns/op and lock-cpu-ns/op. The context is
// context.Background(), as the bench's.
func PairDiff(b *testing.B, g int, lb, bb backend.Backend) {
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

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
