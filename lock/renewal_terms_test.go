package lock_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestWaiterLateReleaseKeepsOtherTerms: a release event ends what the
// waiter knows of its own term only. z (TTL 1 s) leaves at 0.9 s, its
// release event still on its way; y takes the key (TTL 1 s) just before
// w's attempt at z's TTL, so w learns that y lives until about 2 s; the
// store then loses y's lease with no event (a forward step of its clock),
// and z's late release arrives. Were it to end every term's bound, w would
// take the key at once while y still holds it; it must wait out y's TTL.
func TestWaiterLateReleaseKeepsOtherTerms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var steal atomic.Bool
		var yc *memorybackend.Backend
		var yl backend.Lease
		var yAt atomic.Pointer[time.Time]
		r := newWaiterRig(t, time.Second, func(wc *electortest.Renewing) {
			wc.BeforeAcquire = func(req backend.AcquireRequest) error {
				if steal.CompareAndSwap(true, false) {
					l, err := yc.Acquire(context.Background(), backend.AcquireRequest{Key: req.Key, HolderID: "y", TTL: time.Second})
					if err != nil {
						t.Errorf("y: Acquire: %v", err)
					}
					yl = l
					now := time.Now()
					yAt.Store(&now)
				}
				return nil
			}
		})
		yc = client(t, r.store)
		sleepTo(start, 900*time.Millisecond)
		// z leaves; its release event is late (delivered below).
		if !r.zc.Drop(t.Context(), surveyBK) {
			t.Fatal("Drop z: no lease")
		}
		steal.Store(true)
		sleepTo(start, 1200*time.Millisecond)
		at := yAt.Load()
		if at == nil {
			t.Fatal("w made no attempt by 1.2 s: the test tests nothing")
		}
		if _, ok := r.gotAt(); ok {
			t.Fatal("w took the lock that y holds")
		}
		if !r.zc.Drop(t.Context(), surveyBK) {
			t.Fatal("Drop y: no lease")
		}
		r.rn.Publish(surveyBK, backend.Event{Type: backend.EventReleased, Term: r.zl.Term})
		if yl.Term == r.zl.Term {
			t.Fatalf("y's term %d is z's", yl.Term)
		}
		from := at.Sub(start) + time.Second
		r.check(t, start, from, from+100*time.Millisecond, "y took the key for 1 s; z's late release says nothing of y")
	})
}

// crossRig is a waiter rig whose w, at its attempt when z's TTL (3 s) is
// up (z's lease is then gone from the store), is told with the reply that
// z renewed it for 3 s: as when z renewed and the store then lost the lease
// (a forward step of its clock). What follows: nothing ("lost"), or z's
// release, told before the reply ("released") or 1 ms after it ("late").
func crossRig(t *testing.T, what string) (*waiterRig, time.Time) {
	t.Helper()
	start := time.Now()
	var cross atomic.Bool
	var r *waiterRig
	r = newWaiterRig(t, 3*time.Second, func(wc *electortest.Renewing) {
		wc.BeforeAcquire = func(backend.AcquireRequest) error {
			if !cross.CompareAndSwap(true, false) {
				return nil
			}
			r.rn.Publish(surveyBK, backend.Event{Type: backend.EventRenewed, TTL: 3 * time.Second, Term: r.zl.Term})
			released := backend.Event{Type: backend.EventReleased, Term: r.zl.Term}
			switch what {
			case "released":
				r.rn.Publish(surveyBK, released)
			case "late":
				time.AfterFunc(time.Millisecond, func() { r.rn.Publish(surveyBK, released) })
			}
			return nil
		}
	})
	cross.Store(true)
	sleepTo(start, 3100*time.Millisecond)
	if cross.Load() {
		t.Fatal("w made no attempt by 3.1 s: the test tests nothing")
	}
	return r, start
}

// TestWaiterGivesUpAcquisitionCrossedByRenewal: z renewed (TTL 3 s) while
// w's attempt at 3 s was in flight, and the store no longer has z's lease,
// so the attempt found the key free: w gives the lock up and takes it when
// the renewal is up (6 s).
func TestWaiterGivesUpAcquisitionCrossedByRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, start := crossRig(t, "lost")
		if _, ok := r.gotAt(); ok {
			t.Fatal("w holds the lock at 3.1 s: z renewed for 3 s while w's attempt was in flight")
		}
		r.check(t, start, 6*time.Second, 6100*time.Millisecond, "z renewed at 3 s for 3 s")
	})
}

// TestWaiterKeepsAcquisitionAfterRenewalThenRelease: z renewed and
// released while w's attempt was in flight, the release told before the
// reply: a hand-over, w keeps the lock.
func TestWaiterKeepsAcquisitionAfterRenewalThenRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, start := crossRig(t, "released")
		r.check(t, start, 3*time.Second, 3100*time.Millisecond, "z released after its renewal, before w's reply")
	})
}

// TestWaiterRetakesAfterLateRelease: as above, but the release is told
// after the reply: w gives the acquisition up, and takes the lock again
// at the release's event, not when z's renewal would be up.
func TestWaiterRetakesAfterLateRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, start := crossRig(t, "late")
		r.check(t, start, 3*time.Second, 3100*time.Millisecond, "z released after its renewal, told after w's reply")
	})
}
