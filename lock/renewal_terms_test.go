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
