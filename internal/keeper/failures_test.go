package keeper_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// flaky is a memory client whose renewals fail as fail says: fail gets the
// renewal's number (from 1) and returns true to fail it; a failing renewal
// hangs until its context ends when hang is set, else fails at once.
type flaky struct {
	*memorybackend.Backend
	hang bool
	fail func(n int64) bool
	n    atomic.Int64
	mu   sync.Mutex
	sent []time.Time // when each renewal was sent
}

// times returns when each renewal so far was sent.
func (b *flaky) times() []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.sent)
}

func (b *flaky) Renew(ctx context.Context, l backend.Lease) error {
	n := b.n.Add(1)
	b.mu.Lock()
	b.sent = append(b.sent, time.Now())
	b.mu.Unlock()
	if b.fail(n) {
		if b.hang {
			<-ctx.Done()
			return ctx.Err()
		}
		return errors.New("test: renewal refused")
	}
	return b.Backend.Renew(ctx, l)
}

// A renewal that fails is retried a quarter of RenewInterval later, not a
// whole interval, so that several retries fit before the deadline.
func TestFailedRenewalRetriedSoon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &flaky{Backend: c, fail: func(n int64) bool { return n == 2 }}
		h := start(t, c, config(b)) // every 200ms
		time.Sleep(time.Second)
		ts := b.times()
		if len(ts) < 3 {
			t.Fatalf("%d renewals in 1s, want at least 3", len(ts))
		}
		if d := ts[2].Sub(ts[1]); d != 50*time.Millisecond {
			t.Errorf("the retry of a failed renewal went %v after it, want RenewInterval/4 = 50ms", d)
		}
		if d := ts[1].Sub(ts[0]); d != 200*time.Millisecond {
			t.Errorf("renewals %v apart before the failure, want RenewInterval 200ms", d)
		}
		release(t, h)
	})
}

// A renewal that hangs is cut at RequestTimeout and retried, so one hung
// call (a dead connection) does not use up the whole renew budget: the hold
// survives it when the retry succeeds.
func TestHungRenewalCutAtRequestTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &flaky{Backend: c, hang: true, fail: func(n int64) bool { return n == 1 }}
		cfg := config(b) // deadline 700ms, every 200ms, requests cut at 150ms
		cfg.RequestTimeout = 150 * time.Millisecond
		h := start(t, c, cfg)
		time.Sleep(2 * time.Second)
		if !h.Held() {
			r, cause := h.Reason()
			t.Fatalf("stepped down (%v: %v) after one renewal hung; want it cut at RequestTimeout and retried", r, cause)
		}
		if ts := b.times(); len(ts) < 2 {
			t.Errorf("%d renewals, want the hung one and its retry", len(ts))
		} else if d := ts[1].Sub(ts[0]); d != 150*time.Millisecond+50*time.Millisecond {
			t.Errorf("the retry went %v after the hung renewal was sent, want RequestTimeout + RenewInterval/4 = 200ms", d)
		}
		release(t, h)
	})
}

// Verify checks the whole identity of the lease: a record of the same key
// and holder ID, but of another acquisition (another token and term: the
// same instance took the key again after the store lost it), is not this
// lease.
func TestVerifySeesAnotherAcquisitionOfTheSameHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		cfg := config(c)
		cfg.NoRenew = true
		h := start(t, c, cfg)
		store.Restart(nil) // loses the lease
		again, err := c.Acquire(t.Context(), backend.AcquireRequest{Key: "k", HolderID: "a", TTL: cfg.TTL})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.Verify(t.Context()); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Verify with the key held by another acquisition of the same holder (term %d): got %v, want ErrLeaseLost", again.Term, err)
		}
		if h.Held() {
			t.Error("Held after Verify found another acquisition")
		}
		release(t, h)
	})
}
