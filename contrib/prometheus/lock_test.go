package sovereignprom_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sovereignprom "github.com/sovereign-go/sovereign/contrib/prometheus"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

const tally = `class="tally"`

// Lock metrics over two Lockers sharing one Metrics: an acquisition, a
// refusal, a waiter that gives up, a loss by partition, the release of the
// lost lock and a waiter that gets it; every series is by class, and no
// series carries the key.
func TestLockMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t, nil)
		store := memorybackend.NewStore()
		ac, bc := store.Client(), store.Client()
		defer ac.Close()
		defer bc.Close()
		opts := &lock.Options{TTL: time.Second, Metrics: m, Logger: slog.New(slog.DiscardHandler)}
		alice, err := lock.New(ac, "alice", opts)
		if err != nil {
			t.Fatal(err)
		}
		defer alice.Close()
		bob, err := lock.New(bc, "bob", opts)
		if err != nil {
			t.Fatal(err)
		}
		defer bob.Close()
		const entity = "election-4711"
		key := lock.Key("tally", entity)

		t0 := time.Now()
		lk, err := alice.TryAcquire(t.Context(), key, nil)
		if err != nil {
			t.Fatalf("alice's TryAcquire: %v", err)
		}
		s := scrape(t, reg)
		wantValue(t, s, "sovereign_lock_acquisitions_total", tally+`,result="acquired"`, 1)
		wantValue(t, s, "sovereign_lock_acquisitions_total", tally+`,result="held"`, 0)
		wantValue(t, s, "sovereign_locks_held", tally, 1)
		wantValue(t, s, "sovereign_lock_wait_seconds", tally, 1)
		wantValue(t, s, "sovereign_locks_lost_total", tally+`,reason="deadline"`, 0)

		var he *lock.HeldError
		if _, err := bob.TryAcquire(t.Context(), key, nil); !errors.As(err, &he) {
			t.Fatalf("bob's TryAcquire of a held lock: got %v, want a HeldError", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		_, err = bob.Acquire(ctx, key, nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("bob's Acquire with a 100ms deadline: got %v, want DeadlineExceeded", err)
		}
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_lock_acquisitions_total", tally+`,result="held"`, 1)
		wantValue(t, s, "sovereign_lock_acquisitions_total", tally+`,result="cancelled"`, 1)
		wantValue(t, s, "sovereign_lock_wait_seconds", tally, 1) // only acquisitions are observed
		wantValue(t, s, "sovereign_locks_held", tally, 1)

		type result struct {
			lk     *lock.Lock
			err    error
			waited time.Duration
		}
		bobs := make(chan result, 1)
		go func() {
			tb := time.Now()
			lk, err := bob.Acquire(t.Context(), key, nil) // until alice's lease expires at the store
			bobs <- result{lk, err, time.Since(tb)}
		}()
		synctest.Wait()

		ac.Partition()
		<-lk.Done()
		synctest.Wait() // the Locker reports the loss once the hold has stepped down
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_locks_lost_total", tally+`,reason="deadline"`, 1)
		wantValue(t, s, "sovereign_locks_held", tally, 1) // until released

		b := <-bobs
		if b.err != nil {
			t.Fatalf("bob's Acquire: %v", b.err)
		}
		if b.waited < 500*time.Millisecond {
			t.Fatalf("bob waited %v, want until alice's lease expired", b.waited)
		}
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_lock_acquisitions_total", tally+`,result="acquired"`, 2)
		wantValue(t, s, "sovereign_lock_wait_seconds", tally, 2)
		if got := value(t, s, "sovereign_lock_wait_seconds_sum", tally); math.Abs(got-b.waited.Seconds()) > 1e-3 {
			t.Errorf("wait_seconds sum: got %v, want %v (alice's 0 + bob's %v)", got, b.waited.Seconds(), b.waited)
		}
		wantValue(t, s, "sovereign_locks_held", tally, 2) // alice's lost lock is not released yet

		ac.Heal()
		if err := lk.Release(t.Context()); !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("Release of a lost lock: got %v, want ErrLockLost", err)
		}
		held := time.Since(t0)
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_locks_held", tally, 1)
		wantValue(t, s, "sovereign_lock_hold_seconds", tally, 1)
		if got := value(t, s, "sovereign_lock_hold_seconds_sum", tally); math.Abs(got-held.Seconds()) > 1e-3 {
			t.Errorf("hold_seconds sum: got %v, want %v", got, held.Seconds())
		}
		if err := b.lk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_locks_held", tally, 0)
		wantValue(t, s, "sovereign_lock_hold_seconds", tally, 2)

		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, sm := range mf.GetMetric() {
				for _, l := range sm.GetLabel() {
					if l.GetName() == "key" || strings.Contains(l.GetValue(), entity) {
						t.Errorf("%s carries the lock key: %s=%q", mf.GetName(), l.GetName(), l.GetValue())
					}
				}
			}
		}
	})
}

// The lock hooks called directly: a class's first acquisition attempt
// creates every result and every loss reason at zero; each loss is counted
// under its own reason.
func TestLockHooks(t *testing.T) {
	m, reg := newMetrics(t, nil)
	m.Acquired("tally", "held", 0)
	s := scrape(t, reg)
	wantValue(t, s, "sovereign_lock_acquisitions_total", tally+`,result="held"`, 1)
	for _, r := range []string{"acquired", "error", "cancelled"} {
		wantValue(t, s, "sovereign_lock_acquisitions_total", tally+`,result="`+r+`"`, 0)
	}
	for _, r := range []string{"deadline", "lease lost", "max hold"} {
		wantValue(t, s, "sovereign_locks_lost_total", tally+`,reason="`+r+`"`, 0)
	}
	wantValue(t, s, "sovereign_locks_held", tally, 0)

	m.Lost("tally", "max hold")
	m.Lost("tally", "lease lost")
	m.Lost("tally", "lease lost")
	s = scrape(t, reg)
	wantValue(t, s, "sovereign_locks_lost_total", tally+`,reason="deadline"`, 0)
	wantValue(t, s, "sovereign_locks_lost_total", tally+`,reason="max hold"`, 1)
	wantValue(t, s, "sovereign_locks_lost_total", tally+`,reason="lease lost"`, 2)
}

// bucketBounds returns the upper bounds of the buckets of histogram name in
// reg (its only series).
func bucketBounds(t *testing.T, reg prometheus.Gatherer, name string) []float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var bounds []float64
		for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		return bounds
	}
	t.Fatalf("no histogram %s", name)
	return nil
}

// The wait and hold histograms have their own buckets: the defaults, or
// those of Options.
func TestLockBuckets(t *testing.T) {
	tests := []struct {
		name       string
		opts       *sovereignprom.Options
		wait, hold []float64
	}{
		{name: "defaults", wait: sovereignprom.DefaultLockWaitBuckets, hold: sovereignprom.DefaultLockHoldBuckets},
		{
			name: "options",
			opts: &sovereignprom.Options{LockWaitBuckets: []float64{0.5, 2}, LockHoldBuckets: []float64{10}},
			wait: []float64{0.5, 2}, hold: []float64{10},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, reg := newMetrics(t, tt.opts)
			m.Acquired("tally", "acquired", time.Second)
			m.Released("tally", 5*time.Second)
			if got := bucketBounds(t, reg, "sovereign_lock_wait_seconds"); !slices.Equal(got, tt.wait) {
				t.Errorf("wait buckets: got %v, want %v", got, tt.wait)
			}
			if got := bucketBounds(t, reg, "sovereign_lock_hold_seconds"); !slices.Equal(got, tt.hold) {
				t.Errorf("hold buckets: got %v, want %v", got, tt.hold)
			}
		})
	}
}
