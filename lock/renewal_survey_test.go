package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// Tests of the lock waiter's use of renewal events (backend.RenewalWatcher):
// the README's "When the store's clock is stepped". They run in a synctest
// bubble on electortest.Renewals, a memory store whose watches tell of
// renewals as Redis's do and whose Drop ends a lease with no event, as a
// forward step of the Redis server's clock does. A mutation survey (X42)
// found each behaviour checked here unchecked by the tests on a real
// redis-server, or checked only by chance.

// surveyKey is the lock the tests wait for; surveyBK its backend key.
const surveyKey = "job"

var surveyBK = lock.Prefix + surveyKey

// waiterRig is the lock "job" held by z, a holder the test drives by hand
// (zc, its lease zl), and a Locker w (fastOpts: TTL 1 s) on client wc
// whose Acquire of "job" runs in a goroutine from the start.
type waiterRig struct {
	store *memorybackend.Store
	rn    *electortest.Renewals
	zc    *electortest.Renewing
	wc    *electortest.Renewing
	zl    backend.Lease
	got   atomic.Pointer[time.Time] // when w's Acquire returned the lock
}

// newWaiterRig acquires the lock for z with zTTL, then starts w's Acquire;
// hook, when set, sets wc's hooks first. The Acquire ends (and its lock
// is released) when the test ends.
func newWaiterRig(t *testing.T, zTTL time.Duration, hook func(wc *electortest.Renewing)) *waiterRig {
	t.Helper()
	r := &waiterRig{store: memorybackend.NewStore(), rn: &electortest.Renewals{}}
	r.zc = r.rn.Client(client(t, r.store))
	r.wc = r.rn.Client(client(t, r.store))
	if hook != nil {
		hook(r.wc)
	}
	var err error
	r.zl, err = r.zc.Acquire(t.Context(), backend.AcquireRequest{Key: surveyBK, HolderID: "z", TTL: zTTL})
	if err != nil {
		t.Fatal(err)
	}
	w := newLocker(t, r.wc, "w", fastOpts())
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		lk, err := w.Acquire(ctx, surveyKey, nil)
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("w: Acquire: %v", err)
			}
			return
		}
		now := time.Now()
		r.got.Store(&now)
		<-ctx.Done()
		_ = lk.Release(context.WithoutCancel(ctx))
	}()
	synctest.Wait() // w's first attempt found z
	return r
}

// gotAt returns when w got the lock, and whether it did.
func (r *waiterRig) gotAt() (time.Time, bool) {
	p := r.got.Load()
	if p == nil {
		return time.Time{}, false
	}
	return *p, true
}

// check fails t unless w got the lock, and not before from: in [from, by].
func (r *waiterRig) check(t *testing.T, start time.Time, from, by time.Duration, why string) {
	t.Helper()
	time.Sleep(time.Until(start.Add(by)))
	synctest.Wait()
	got, ok := r.gotAt()
	switch {
	case !ok:
		t.Errorf("w does not hold the lock at %v, want it by then: %s", by, why)
	case got.Before(start.Add(from)):
		t.Errorf("w got the lock at %v, want not before %v: %s", got.Sub(start), from, why)
	}
}

// sleepTo sleeps until d after start and lets the bubble settle.
func sleepTo(start time.Time, d time.Duration) {
	time.Sleep(time.Until(start.Add(d)))
	synctest.Wait()
}

// TestSurveyWaiterWaitsOutRenewal: z renews at 0.5 s (TTL 1 s), and at
// 0.6 s the store loses the lease with no event. w's look was due at 1 s
// (a TTL after its first attempt); it must not take the lock before the
// renewal's TTL is up (1.5 s), and must take it soon after.
func TestSurveyWaiterWaitsOutRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newWaiterRig(t, time.Second, nil)
		sleepTo(start, 500*time.Millisecond)
		if err := r.zc.Renew(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		sleepTo(start, 600*time.Millisecond)
		if !r.zc.Drop(t.Context(), surveyBK) {
			t.Fatal("Drop: no lease")
		}
		r.check(t, start, 1500*time.Millisecond, 1600*time.Millisecond, "z renewed at 0.5 s for 1 s")
	})
}

// TestSurveyWaiterWaitsOutRenewalAcrossWakeUps: z's TTL (3 s) is longer
// than w's (1 s). z renews at 0.5 s (its lease lives until 3.5 s at
// least); a change of the key at 0.55 s (a Fair waiter leaving the line,
// say) wakes w, which waits again; the store loses z's lease at 0.6 s. Neither the change nor a new wait may forget the
// renewal: w takes the lock at 3.5 s, not at its next look.
func TestSurveyWaiterWaitsOutRenewalAcrossWakeUps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newWaiterRig(t, 3*time.Second, nil)
		sleepTo(start, 500*time.Millisecond)
		if err := r.zc.Renew(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		sleepTo(start, 550*time.Millisecond)
		// The change wakes w. Since X41 a waiter that knows its holder
		// lives on (z's TTL, from its first attempt) makes no attempt then,
		// so no attempt count can show the wake-up.
		r.rn.Publish(surveyBK, backend.Event{Type: backend.EventChanged})
		sleepTo(start, 600*time.Millisecond)
		if !r.zc.Drop(t.Context(), surveyBK) {
			t.Fatal("Drop: no lease")
		}
		r.check(t, start, 3500*time.Millisecond, 3600*time.Millisecond, "z renewed at 0.5 s for 3 s")
	})
}

// TestSurveyWaiterQuietWhileRenewed: while z renews every 300 ms, w makes
// no attempt (on Redis waiters used to look once a TTL).
func TestSurveyWaiterQuietWhileRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newWaiterRig(t, time.Second, nil)
		before := r.wc.Acquires.Load()
		for i := 1; i <= 10; i++ {
			sleepTo(start, time.Duration(i)*300*time.Millisecond)
			if err := r.zc.Renew(t.Context(), r.zl); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if n := r.wc.Acquires.Load() - before; n != 0 {
			t.Errorf("w made %d attempts in 3 s while z renewed every 300 ms, want 0", n)
		}
	})
}

// TestSurveyWaiterReleaseClearsBound: z (TTL 3 s) renews at 0.5 s and
// releases at 0.6 s, and y takes the key just before w's attempt (TTL
// 1 s), then stops. The release ends what z's renewal told: w takes the
// lock when y's TTL is up (1.6 s), not when z's renewal would be (3.5 s).
func TestSurveyWaiterReleaseClearsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var steal atomic.Bool
		var yc *memorybackend.Backend
		r := newWaiterRig(t, 3*time.Second, func(wc *electortest.Renewing) {
			wc.BeforeAcquire = func(req backend.AcquireRequest) error {
				if steal.CompareAndSwap(true, false) {
					if _, err := yc.Acquire(context.Background(), backend.AcquireRequest{Key: req.Key, HolderID: "y", TTL: time.Second}); err != nil {
						t.Errorf("y: Acquire: %v", err)
					}
				}
				return nil
			}
		})
		yc = client(t, r.store)
		sleepTo(start, 500*time.Millisecond)
		if err := r.zc.Renew(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		sleepTo(start, 600*time.Millisecond)
		steal.Store(true)
		if err := r.zc.Release(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if steal.Load() {
			t.Fatal("w made no attempt at the release: the test tests nothing")
		}
		r.check(t, start, 1600*time.Millisecond, 1700*time.Millisecond, "y took the key at 0.6 s for 1 s and never renewed")
	})
}

// TestSurveyWaiterRenewalSeenAtACrossedReset: z's TTL (3 s) is longer than
// w's (1 s). While w's attempt is in flight (at 3 s, when z's TTL as its
// first attempt saw it is up), a renewal of z's lease is told and w's
// watch breaks, the store no longer holding the lease: w gets the free
// key, finds the renewal and the break in its channel, and gives the
// acquisition up (it crossed a reset). The
// renewal it found there must count: w takes the lock when it is up (6 s),
// not when its own wait after the reset ends (4 s).
func TestSurveyWaiterRenewalSeenAtACrossedReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var cross atomic.Bool
		var r *waiterRig
		r = newWaiterRig(t, 3*time.Second, func(wc *electortest.Renewing) {
			wc.BeforeAcquire = func(backend.AcquireRequest) error {
				if cross.CompareAndSwap(true, false) {
					// z's lease (3 s) is up by the time w looks, and is
					// no longer in the store: what a renewal of it just
					// before the end, then a step of the store's clock,
					// would leave, told here as the event z's renewal sends.
					r.rn.Publish(surveyBK, backend.Event{Type: backend.EventRenewed, TTL: 3 * time.Second, Term: r.zl.Term})
					r.rn.Break(surveyBK)
				}
				return nil
			}
		})
		cross.Store(true)
		sleepTo(start, 3100*time.Millisecond)
		if cross.Load() {
			t.Fatal("w made no attempt by 3.1 s: the test tests nothing")
		}
		if _, ok := r.gotAt(); ok {
			t.Fatal("w took the lock at 3 s although its attempt crossed a break of its watch")
		}
		r.check(t, start, 6*time.Second, 6100*time.Millisecond, "z renewed at 3 s for 3 s")
	})
}

// TestSurveyWaitFreeWaitsOutRenewal: WaitFree, like Acquire, does not
// report the key free before the last renewal it heard of is up: z renews
// at 0.5 s (TTL 1 s) and the store loses the lease at 0.6 s; WaitFree's
// look was due at 1 s.
func TestSurveyWaitFreeWaitsOutRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		store := memorybackend.NewStore()
		rn := &electortest.Renewals{}
		zc := rn.Client(client(t, store))
		zl, err := zc.Acquire(t.Context(), backend.AcquireRequest{Key: surveyBK, HolderID: "z", TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		w := newLocker(t, rn.Client(client(t, store)), "w", fastOpts())
		var free atomic.Pointer[time.Time]
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := w.WaitFree(t.Context(), surveyKey); err != nil {
				t.Errorf("WaitFree: %v", err)
				return
			}
			now := time.Now()
			free.Store(&now)
		}()
		sleepTo(start, 500*time.Millisecond)
		if err := zc.Renew(t.Context(), zl); err != nil {
			t.Fatal(err)
		}
		sleepTo(start, 600*time.Millisecond)
		if !zc.Drop(t.Context(), surveyBK) {
			t.Fatal("Drop: no lease")
		}
		sleepTo(start, 1600*time.Millisecond)
		switch p := free.Load(); {
		case p == nil:
			t.Errorf("WaitFree has not returned at 1.6 s: z's last renewal (0.5 s, TTL 1 s) is up and the key is free")
		case p.Before(start.Add(1500 * time.Millisecond)):
			t.Errorf("WaitFree returned at %v: z renewed at 0.5 s for 1 s, want not before 1.5 s", p.Sub(start))
		}
		<-done
	})
}

// TestSurveyAncestorRenewalsDoNotWake: a hierarchical waiter blocked by
// the holder of an ancestor watches the ancestor's key too; that holder's
// renewals (every 200 ms) are no reason to look. With a TTL of 1 s the
// waiter, registered through backend.Modes, looks when it refreshes its
// registration (every TTL/3: 11 attempts in 3 s, its first two
// included), not at each renewal as well (17).
func TestSurveyAncestorRenewalsDoNotWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		rn := &electortest.Renewals{}
		z := newLocker(t, rn.Client(client(t, store)), "z", fastOpts())
		zl, err := z.TryAcquire(t.Context(), "files", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer zl.Release(context.WithoutCancel(t.Context()))
		raw := client(t, store)
		w := newLocker(t, rn.Client(raw), "w", fastOpts())
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		if _, err := w.Acquire(ctx, "files/a", hier); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire below a held ancestor: got %v, want the deadline", err)
		}
		if n := raw.Calls()["AcquireMode"]; n > 13 {
			t.Errorf("the waiter made %d attempts in 3 s while the ancestor's holder renewed every 200 ms, want about 11 (at each refresh of its registration)", n)
		}
	})
}
