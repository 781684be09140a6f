package keeper_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/keeper"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// sendTimes is a backend that records, for each renewal, when the call
// reached it (under synctest, the instant the keeper sent it) and when it
// returned. It renews one lease at a time: it is no BatchRenewer, unless
// wrapped in batches.
type sendTimes struct {
	backend.Backend
	mu    sync.Mutex
	calls [][2]time.Time // sent, returned
}

func (b *sendTimes) Renew(ctx context.Context, l backend.Lease) error {
	sent := time.Now()
	err := b.Backend.Renew(ctx, l)
	if err == nil {
		b.mu.Lock()
		b.calls = append(b.calls, [2]time.Time{sent, time.Now()})
		b.mu.Unlock()
	}
	return err
}

// last returns the send and return times of the last successful renewal.
func (b *sendTimes) last() (sent, back time.Time, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.calls) == 0 {
		return time.Time{}, time.Time{}, 0
	}
	c := b.calls[len(b.calls)-1]
	return c[0], c[1], len(b.calls)
}

// batches renews in batches through its sendTimes, lease by lease.
type batches struct{ *sendTimes }

func (b *batches) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = b.Renew(ctx, l)
	}
	return errs
}

// A renewal whose answer takes a while moves the deadline to its *send*
// time plus RenewDeadline, not to the time the answer came back: the store
// may have applied it at any point of the round trip (and a reply delayed on
// its way back tells nothing of when). Both ways of renewing: one call per
// hold, and the scheduler's batches.
func TestDeadlineCountsFromSendTime(t *testing.T) {
	for _, batched := range []bool{false, true} {
		name := "one by one"
		if batched {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := memorybackend.NewStore().Client()
				defer c.Close()
				st := &sendTimes{Backend: c}
				var b backend.Backend = st
				if batched {
					b = &batches{st}
				}
				cfg := config(b) // RenewDeadline 700ms, every 200ms, requests 200ms
				h := acquire(t, b, cfg, "k")
				if batched != (keeper.SchedulerOf(h) != nil) {
					t.Fatalf("renewed through a scheduler: %v, want %v", keeper.SchedulerOf(h) != nil, batched)
				}
				c.SetLatency(150 * time.Millisecond)
				time.Sleep(time.Second)
				sent, back, n := st.last()
				if n == 0 {
					t.Fatal("no renewal succeeded in 1s with a latency of 150ms")
				}
				if back.Sub(sent) != 150*time.Millisecond {
					t.Fatalf("the last renewal took %v, want the latency, 150ms", back.Sub(sent))
				}
				s := h.Status()
				if !s.LastRenewal.Equal(sent) {
					t.Errorf("LastRenewal %v after the send time of the last renewal, want it (its send time)", s.LastRenewal.Sub(sent))
				}
				if want := sent.Add(700 * time.Millisecond); !s.Deadline.Equal(want) {
					t.Errorf("deadline %v after the last renewal's send time, want RenewDeadline 700ms (%v after its answer)",
						s.Deadline.Sub(sent), s.Deadline.Sub(back))
				}
				c.SetLatency(0)
				release(t, h)
			})
		})
	}
}

// A lease granted with less TTL than asked for (an etcd session lease with
// less left, a store with a longer minimum rounds the other way) keeps the
// same margin before its own expiry: the deadline is the send time plus the
// granted TTL minus (TTL - RenewDeadline), when that is sooner than
// RenewDeadline.
func TestDeadlineOfAShorterLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		cfg := config(c) // TTL 1s, RenewDeadline 700ms: a margin of 300ms
		cfg.NoRenew = true
		sent := time.Now()
		l, err := c.Acquire(t.Context(), backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		h := keeper.Start(t.Context(), cfg, l, sent)
		if want := sent.Add(200 * time.Millisecond); !h.Deadline().Equal(want) {
			t.Errorf("deadline %v after the send time, want 200ms (the granted 500ms minus the 300ms margin)", h.Deadline().Sub(sent))
		}
		<-h.Done()
		if d := time.Since(sent); d != 200*time.Millisecond {
			t.Errorf("stepped down %v after the send time, want 200ms", d)
		}
		release(t, h)
	})
}
