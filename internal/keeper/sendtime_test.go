package keeper_test

import (
	"context"
	"slices"
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

// Renewals that come back out of order: a periodic renewal sent at 200ms
// answers at 350ms, after an Extend sent at 250ms answered at once. The
// older answer moves nothing: the last renewal stays the one sent last, the
// deadline counts from it, and OnRenew is called once, for the Extend.
func TestOlderRenewalAnsweringLastMovesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &scripted{Backend: c, renew: func(_ context.Context, n int64) error {
			if n == 1 {
				time.Sleep(150 * time.Millisecond)
			}
			return errPass
		}}
		cfg := config(b) // RenewDeadline 700ms, every 200ms, requests 200ms
		type call struct{ sent, deadline time.Time }
		var mu sync.Mutex
		var calls []call
		cfg.OnRenew = func(sent, deadline time.Time) {
			mu.Lock()
			calls = append(calls, call{sent, deadline})
			mu.Unlock()
		}
		t0 := time.Now()
		h := start(t, c, cfg)
		time.Sleep(250 * time.Millisecond) // the periodic renewal is in flight
		if err := h.Extend(context.Background()); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		time.Sleep(110 * time.Millisecond) // the periodic renewal has answered
		if got := b.n.Load(); got != 2 {
			t.Fatalf("%d renewals sent by 360ms, want 2", got)
		}
		s := h.Status()
		if got := s.LastRenewal.Sub(t0); got != 250*time.Millisecond {
			t.Errorf("LastRenewal %v, want 250ms (the Extend, sent last)", got)
		}
		if got := s.Deadline.Sub(t0); got != 950*time.Millisecond {
			t.Errorf("deadline %v, want 950ms (the Extend's send time + 700ms)", got)
		}
		mu.Lock()
		got := slices.Clone(calls)
		mu.Unlock()
		if len(got) != 1 || got[0].sent.Sub(t0) != 250*time.Millisecond || got[0].deadline.Sub(t0) != 950*time.Millisecond {
			t.Errorf("OnRenew calls %v, want one, for the Extend (sent 250ms, deadline 950ms)", got)
		}
		release(t, h)
	})
}

// The first deadline counts from the send time of the acquisition, given
// to Start, not from Start: an acquisition whose answer took 100ms leaves
// the holder 600ms, not 700ms, before the first renewal must succeed.
func TestDeadlineCountsFromTheAcquisitionSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		cfg := config(c) // RenewDeadline 700ms
		cfg.NoRenew = true
		c.SetLatency(100 * time.Millisecond)
		h := start(t, c, cfg)
		c.SetLatency(0)
		sent := h.Acquired()
		if d := time.Since(sent); d != 100*time.Millisecond {
			t.Fatalf("Start %v after the acquisition was sent, want 100ms (the latency)", d)
		}
		s := h.Status()
		if !s.LastRenewal.Equal(sent) {
			t.Errorf("LastRenewal %v after the acquisition's send time, want it", s.LastRenewal.Sub(sent))
		}
		if d := s.Deadline.Sub(sent); d != 700*time.Millisecond {
			t.Errorf("deadline %v after the acquisition's send time, want RenewDeadline (700ms)", d)
		}
		within(t, h.Done(), time.Second, "step-down at the deadline")
		if d := time.Since(sent); d != 700*time.Millisecond {
			t.Errorf("stepped down %v after the acquisition's send time, want 700ms", d)
		}
		release(t, h)
	})
}
