package lock_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// A lock released before a quarter of RenewInterval starts no goroutine and
// no subscription: TryAcquire and Release run in the caller's goroutine,
// whether their context may be cancelled (a context of its own per call) or
// not (a context shared by the calls of a slice of RequestTimeout).
func TestShortLocksStartNoGoroutine(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func(t *testing.T) context.Context
	}{
		{"cancellable context", func(t *testing.T) context.Context { return t.Context() }},
		{"context never cancelled", func(*testing.T) context.Context { return context.Background() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := tc.ctx(t)
				store := memorybackend.NewStore()
				c := client(t, store)
				l := newLocker(t, c, "a", fastOpts())
				base := bubbleGoroutines()
				for i := range 100 {
					lk, err := l.TryAcquire(ctx, fmt.Sprintf("k/%d", i), nil)
					if err != nil {
						t.Fatalf("TryAcquire: %v", err)
					}
					if n := bubbleGoroutines(); n != base {
						t.Fatalf("goroutines while a lock is held: %d, want %d (none per lock)", n, base)
					}
					if err := lk.Release(ctx); err != nil {
						t.Fatalf("Release: %v", err)
					}
					if n := bubbleGoroutines(); n != base {
						t.Fatalf("goroutines after TryAcquire+Release: %d, want %d", n, base)
					}
					// The pairs span slices of RequestTimeout; timers that
					// fire meanwhile (the Locker's watch check) run in
					// goroutines of their own, which end.
					time.Sleep(time.Millisecond)
					synctest.Wait()
				}
				time.Sleep(time.Second) // every timer the locks set would have fired
				synctest.Wait()
				if n := bubbleGoroutines(); n != base {
					t.Errorf("goroutines 1s after 100 TryAcquire+Release pairs: %d, want %d", n, base)
				}
				if got := c.Calls()["Watch"]; got != 0 {
					t.Errorf("Watch calls for locks released at once: %d, want 0", got)
				}
			})
		})
	}
}

// Held locks run on timers: 100 locks held through ten renewals each (on a
// backend that cannot watch, so no reset watch) add no goroutine.
func TestHeldLocksStartNoGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, noWatch{c}, "a", fastOpts())
		base := bubbleGoroutines()
		held := make([]*lock.Lock, 0, 100)
		for i := range 100 {
			lk, err := l.TryAcquire(t.Context(), fmt.Sprintf("k/%d", i), nil)
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			held = append(held, lk)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := bubbleGoroutines(); n != base {
			t.Errorf("goroutines while 100 locks are held: %d, want %d (none per lock)", n, base)
		}
		if got := c.Calls()["Renew"]; got != 1000 {
			t.Errorf("renewals of 100 locks in 2s: %d, want 1000 (every 200ms)", got)
		}
		for _, lk := range held {
			if !lk.Held() {
				t.Fatal("a lock was not held after 2s of healthy renewals")
			}
		}
	})
}

// bubbleGoroutines counts the goroutines of the running synctest bubble (of
// every bubble, but tests in this package do not run in parallel), so that
// goroutines other tests left winding down outside it do not count.
func bubbleGoroutines() int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return bytes.Count(buf[:n], []byte(", synctest bubble "))
		}
		buf = make([]byte, 2*len(buf))
	}
}

// Held locks share one watch: 100 locks held on a backend that can watch
// add one goroutine and one subscription in all (the Locker's reset watch),
// and releasing the last of them ends it.
func TestHeldLocksShareOneWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		base := bubbleGoroutines()
		held := make([]*lock.Lock, 0, 100)
		for i := range 100 {
			lk, err := l.TryAcquire(t.Context(), fmt.Sprintf("k/%d", i), nil)
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			held = append(held, lk)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := bubbleGoroutines(); n != base+1 {
			t.Errorf("goroutines while 100 locks are held: %d, want %d (one reset watch for all)", n, base+1)
		}
		if got := c.Calls()["Watch"]; got != 1 {
			t.Errorf("Watch calls for 100 held locks: %d, want 1", got)
		}
		// A restart is noticed by every lock at once through that one watch.
		store.Restart(nil)
		at := time.Now()
		for _, lk := range held {
			<-lk.Done()
		}
		if d := time.Since(at); d != 0 {
			t.Errorf("locks lost %v after the restart, want at once", d)
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
