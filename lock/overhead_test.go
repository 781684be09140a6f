package lock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// Close ends a TryAcquire in flight at once, with ErrClosed, rather than
// waiting for its RequestTimeout.
func TestCloseEndsTryAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l, err := lock.New(c, "a", &lock.Options{TTL: 10 * time.Second, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		c.Hang()
		done := make(chan error, 1)
		go func() {
			_, err := l.TryAcquire(context.Background(), "k", nil)
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, lock.ErrClosed) {
			t.Errorf("TryAcquire in flight at Close: got %v, want ErrClosed", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("Close took %v with a TryAcquire in flight, want at once (not its 2s RequestTimeout)", d)
		}
		c.Heal()
	})
}

// A TryAcquire + Release pair allocates little beyond what the backend's
// own Acquire + Release do: the lock and its hold in one object, one timer
// for the hold, and no context for the hold nor for the store calls (with a
// context never cancelled, they share the Locker's bounded contexts).
func TestPairAllocations(t *testing.T) {
	ctx := context.Background()
	m := memorybackend.New()
	defer m.Close()
	l, err := lock.New(m, "me", &lock.Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	pair := testing.AllocsPerRun(200, func() {
		lk, err := l.TryAcquire(ctx, "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
	req := backend.AcquireRequest{Key: lock.Prefix + "k", HolderID: "me", TTL: 10 * time.Second}
	bare := testing.AllocsPerRun(200, func() {
		le, err := m.Acquire(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Release(ctx, le); err != nil {
			t.Fatal(err)
		}
	})
	// 4 at the time of writing: the Lock (hold inside), its backend key,
	// the hold's timer and its callback; it was 12 with a bounded context
	// (and a timer) per store call, and 45 with a context, three timers, an
	// AfterFunc and closures per hold.
	t.Logf("allocations per pair: %v, backend alone: %v", pair, bare)
	if extra := pair - bare; extra > 6 {
		t.Errorf("allocations per TryAcquire + Release: %v beyond the backend's %v, want at most 6", extra, bare)
	}
}

// Locks held on a backend that renews in batches share one scheduler: 500
// locks cost one batch call per RenewInterval and no goroutine but the
// Locker's reset watch, and a store restart seen by that watch loses them
// all at once, through one batch.
func TestBatchedLocksShareOneScheduler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		b := &batchingMemory{Backend: client(t, store)}
		l := newLocker(t, b, "a", fastOpts())
		base := bubbleGoroutines()
		held := make([]*lock.Lock, 500)
		for i := range held {
			var err error
			if held[i], err = l.TryAcquire(t.Context(), fmt.Sprintf("k/%d", i), nil); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond) // the first batch is at +200ms
		b.batches.Store(0)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := b.batches.Load(); n != 10 {
			t.Errorf("batch calls for 500 locks in 2s: %d, want 10 (one per 200ms)", n)
		}
		if n := bubbleGoroutines(); n != base+1 {
			t.Errorf("goroutines while 500 locks are held: %d, want %d (the reset watch alone)", n, base+1)
		}
		for _, lk := range held {
			if !lk.Held() {
				t.Fatal("a lock was not held after 2s of batched renewals")
			}
		}
		before := b.batches.Load()
		store.Restart(nil)
		at := time.Now()
		for _, lk := range held {
			<-lk.Done()
			if !errors.Is(lk.Err(), lock.ErrLockLost) {
				t.Fatalf("lock lost with %v, want ErrLockLost", lk.Err())
			}
		}
		if d := time.Since(at); d != 0 {
			t.Errorf("locks lost %v after the restart, want at once", d)
		}
		if n := b.batches.Load() - before; n != 1 {
			t.Errorf("batch calls to find 500 locks lost: %d, want 1", n)
		}
		for _, lk := range held {
			_ = lk.Release(t.Context())
		}
		synctest.Wait()
		if n := bubbleGoroutines(); n != base {
			t.Errorf("goroutines after every lock was released: %d, want %d", n, base)
		}
	})
}

// TestPairIsTwoRoundTrips: a plain lock taken with TryAcquire or TryDo
// costs two store calls, Acquire and Release, with no read-back (the
// README: "costs two round trips"); Do subscribes to the key's watch first,
// one call more.
func TestPairIsTwoRoundTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		nop := func(context.Context, *lock.Lock) error { return nil }
		for _, tc := range []struct {
			name string
			f    func() error
			want map[string]int64
		}{
			{"TryAcquire+Release", func() error {
				lk, err := l.TryAcquire(t.Context(), "k", nil)
				if err != nil {
					return err
				}
				return lk.Release(t.Context())
			}, map[string]int64{"Acquire": 1, "Release": 1}},
			{"TryDo", func() error { return l.TryDo(t.Context(), "k", nil, nop) }, map[string]int64{"Acquire": 1, "Release": 1}},
			{"Do", func() error { return l.Do(t.Context(), "k", nil, nop) }, map[string]int64{"Watch": 1, "Acquire": 1, "Release": 1}},
		} {
			c.ResetCalls()
			if err := tc.f(); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if got := noIO(c.Calls()); !maps.Equal(got, tc.want) {
				t.Errorf("store calls of %s: got %v, want %v", tc.name, got, tc.want)
			}
		}
	})
}
