package keeper_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/keeper"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// batching is a memory backend that renews in batches, counting them.
type batching struct {
	*memorybackend.Backend
	batches atomic.Int64
	renewed atomic.Int64
}

func (b *batching) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	b.batches.Add(1)
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = b.Backend.Renew(ctx, l)
		if errs[i] == nil {
			b.renewed.Add(1)
		}
	}
	return errs
}

// startN acquires keys k0..k(n-1) on b, one every gap, and keeps each.
func startN(t *testing.T, b backend.Backend, cfg keeper.Config, n int, gap time.Duration) []*keeper.Hold {
	t.Helper()
	hs := make([]*keeper.Hold, n)
	for i := range hs {
		sent := time.Now()
		l, err := b.Acquire(t.Context(), backend.AcquireRequest{Key: fmt.Sprintf("k%d", i), HolderID: "a", TTL: cfg.TTL})
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = keeper.Start(t.Context(), cfg, l, sent)
		time.Sleep(gap)
	}
	return hs
}

// Holds acquired at different times renew together, once per interval, in
// one batch call, and each keeps its own deadline.
func TestRenewalsGoInOneBatchPerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batching{Backend: c}
		cfg := config(b)
		hs := startN(t, b, cfg, 50, 13*time.Millisecond) // spread over 650ms
		b.batches.Store(0)
		b.renewed.Store(0)
		before := c.Calls()["Renew"]
		time.Sleep(10 * time.Second)
		for i, h := range hs {
			if !h.Held() {
				t.Fatalf("hold %d: Held false after 10s of healthy batched renewals", i)
			}
			st := h.Status()
			if d := st.Deadline.Sub(st.LastRenewal); d != 700*time.Millisecond {
				t.Errorf("hold %d: deadline - last renewal %v, want RenewDeadline 700ms", i, d)
			}
		}
		// 10s at one grid instant per 200ms: 50 batches of all 50 holds.
		if got := b.batches.Load(); got < 49 || got > 51 {
			t.Errorf("%d batch calls in 10s, want about 50 (one per RenewInterval for all holds)", got)
		}
		if got := b.renewed.Load(); got < 49*50 || got > 51*50 {
			t.Errorf("%d renewals in 10s, want about 2500 (each hold every 200ms)", got)
		}
		if got := c.Calls()["Renew"] - before; got != b.renewed.Load() {
			t.Errorf("%d Renew calls on the store, want only the %d made by the batches", got, b.renewed.Load())
		}
		for _, h := range hs {
			release(t, h)
		}
	})
}

// A lease lost among many steps down its own hold only; the others stay.
func TestBatchLosesOnlyTheLostLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batching{Backend: c}
		hs := startN(t, b, config(b), 10, time.Millisecond)
		if err := c.Release(t.Context(), hs[3].Lease()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		for i, h := range hs {
			r, _ := h.Reason()
			switch {
			case i == 3 && (h.Held() || r != keeper.LeaseLost):
				t.Errorf("hold 3, released underneath: Held %v reason %v, want stepped down with LeaseLost", h.Held(), r)
			case i != 3 && !h.Held():
				t.Errorf("hold %d: stepped down (%v) because another lease was lost", i, r)
			}
		}
		for _, h := range hs {
			release(t, h)
		}
	})
}

// A batch that hangs does not keep a hold past its deadline: each steps
// down at its own deadline, as with lone renewals.
func TestHungBatchStepsDownAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batching{Backend: c}
		hs := startN(t, b, config(b), 5, 50*time.Millisecond)
		c.Hang()
		hungAt := time.Now()
		for i, h := range hs {
			<-h.Done()
			r, _ := h.Reason()
			if r != keeper.Deadline {
				t.Errorf("hold %d: reason %v, want Deadline", i, r)
			}
			// Its last renewal succeeded at most one interval before the
			// hang, so it stepped down at most RenewDeadline after it.
			if d := time.Since(hungAt); d > 700*time.Millisecond {
				t.Errorf("hold %d stepped down %v after the store hung, want within RenewDeadline", i, d)
			}
		}
		c.Heal()
		for _, h := range hs {
			if err := h.Release(context.Background()); err != nil && !errors.Is(err, backend.ErrLeaseLost) {
				t.Errorf("release: %v", err)
			}
			<-h.Finished()
		}
	})
}

// A store that restarts without its data loses every lease: each batched
// hold steps down with LeaseLost at its next batch, within one interval;
// and a same-ID twin that takes a lost key afterwards is never renewed by
// the old hold's batch.
func TestBatchAfterDataLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		b := &batching{Backend: c}
		hs := startN(t, b, config(b), 10, time.Millisecond)
		store.Restart(&memorybackend.RestartOptions{})
		at := time.Now()
		// A twin with the same holder ID takes key k0 at once.
		twin, err := c.Acquire(t.Context(), backend.AcquireRequest{Key: "k0", HolderID: "a", TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for i, h := range hs {
			<-h.Done()
			if r, _ := h.Reason(); r != keeper.LeaseLost {
				t.Errorf("hold %d: reason %v, want LeaseLost", i, r)
			}
		}
		if d := time.Since(at); d > 200*time.Millisecond {
			t.Errorf("holds stepped down %v after the data loss, want within one RenewInterval (200ms)", d)
		}
		for _, h := range hs {
			release(t, h)
		}
		r, err := c.Get(t.Context(), "k0")
		if err != nil || r.Token != twin.Token {
			t.Errorf("twin's lease after the old holds released: %+v, %v; want it untouched", r, err)
		}
	})
}
