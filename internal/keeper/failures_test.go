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
	"github.com/sovereign-go/sovereign/internal/keeper"
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

// A renewal that hangs is cut and retried at once, so one hung call (a
// dead connection) does not use up the whole renew budget: the hold
// survives it when the retry succeeds. It is cut at RequestTimeout, or
// sooner when that would leave no quarter interval for the retry before
// the deadline (AttemptBound): at RenewInterval TTL/2, the default,
// RequestTimeout alone would have let it wait until the deadline.
func TestHungRenewalRetriedInTime(t *testing.T) {
	for _, tc := range []struct {
		name             string
		interval         time.Duration // RenewInterval
		timeout, wantCut time.Duration
	}{
		// Deadline 700ms (config), the first renewal at the interval.
		{"cut at RequestTimeout", 200 * time.Millisecond, 150 * time.Millisecond, 150 * time.Millisecond},
		{"cut at RenewInterval/4 (TTL/2)", 500 * time.Millisecond, 200 * time.Millisecond, 125 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := memorybackend.NewStore().Client()
				defer c.Close()
				b := &flaky{Backend: c, hang: true, fail: func(n int64) bool { return n == 1 }}
				cfg := config(b)
				cfg.RenewInterval, cfg.RequestTimeout = tc.interval, tc.timeout
				h := start(t, c, cfg)
				time.Sleep(2 * time.Second)
				if !h.Held() {
					r, cause := h.Reason()
					t.Fatalf("stepped down (%v: %v) after one renewal hung; want it cut after %v and retried", r, cause, tc.wantCut)
				}
				if ts := b.times(); len(ts) < 2 {
					t.Errorf("%d renewals, want the hung one and its retry", len(ts))
				} else if d := ts[1].Sub(ts[0]); d != tc.wantCut {
					t.Errorf("the retry went %v after the hung renewal was sent, want at once when it was cut, after %v", d, tc.wantCut)
				}
				release(t, h)
			})
		})
	}
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

// scripted is a memory client whose renewals do what renew says: renew gets
// the renewal's context and number (from 1) and returns its error, or
// errPass to renew in the store. Its releases fail with errRefused while
// refuseRelease is set, and it records when each release was sent.
type scripted struct {
	*memorybackend.Backend
	renew         func(ctx context.Context, n int64) error
	n             atomic.Int64
	refuseRelease atomic.Bool

	mu       sync.Mutex
	released []time.Time
}

var (
	errPass    = errors.New("test: pass the call to the store")
	errRefused = errors.New("test: refused")
)

func (b *scripted) Renew(ctx context.Context, l backend.Lease) error {
	if err := b.renew(ctx, b.n.Add(1)); err != errPass {
		return err
	}
	return b.Backend.Renew(ctx, l)
}

func (b *scripted) Release(ctx context.Context, l backend.Lease) error {
	b.mu.Lock()
	b.released = append(b.released, time.Now())
	b.mu.Unlock()
	if b.refuseRelease.Load() {
		return errRefused
	}
	return b.Backend.Release(ctx, l)
}

func (b *scripted) releases() []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.released)
}

// hang blocks until ctx ends, as a call on a dead connection does.
func hang(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// Extend is bounded by the deadline as well as RequestTimeout: against a
// store that hangs, it returns at the deadline with the step-down's cause,
// not RequestTimeout after it was sent.
func TestExtendCutAtTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		cfg := config(c) // deadline 700ms
		cfg.NoRenew = true
		cfg.RequestTimeout = 600 * time.Millisecond
		h := start(t, c, cfg)
		time.Sleep(500 * time.Millisecond)
		c.Hang()
		at := time.Now()
		err := h.Extend(context.Background())
		if d := time.Since(at); d != 200*time.Millisecond {
			t.Errorf("Extend against a hung store returned after %v, want at the deadline, 200ms later (not RequestTimeout, 600ms)", d)
		}
		if !errors.Is(err, errLost) {
			t.Errorf("Extend cut at the deadline: got %v, want the deadline's cause", err)
		}
		c.Heal()
		release(t, h)
	})
}

// An Extend whose own context ends is not a failure of the store: it is
// neither counted nor reported to OnError.
func TestCancelledExtendIsNoStoreFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		cfg := config(c)
		cfg.NoRenew = true
		var reported atomic.Int32
		cfg.OnError = func(string, error) { reported.Add(1) }
		h := start(t, c, cfg)
		c.Hang()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if err := h.Extend(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Extend whose context ended: got %v, want context.DeadlineExceeded", err)
		}
		if s := h.Status(); s.Failures != 0 || s.LastError != nil {
			t.Errorf("after an Extend cut by its own context: Failures %d, LastError %v; want 0, nil", s.Failures, s.LastError)
		}
		if n := reported.Load(); n != 0 {
			t.Errorf("OnError called %d times for an Extend cut by its own context, want 0", n)
		}
		c.Heal()
		release(t, h)
	})
}

// A renewal that hangs until it is cut says only that time ran out: the
// error kept (Status.LastError, the deadline's cause) stays the one that
// explains why the renewals began to fail.
func TestDeadlineCauseKeepsTheFirstError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &scripted{Backend: c, renew: func(ctx context.Context, n int64) error {
			if n == 1 {
				return errRefused // at 200ms
			}
			return hang(ctx) // 250ms, cut at 450ms; 500ms, cut at the deadline
		}}
		h := start(t, c, config(b)) // deadline 700ms, every 200ms, requests 200ms
		time.Sleep(600 * time.Millisecond)
		if s := h.Status(); s.Failures != 2 || !errors.Is(s.LastError, errRefused) {
			t.Errorf("after a refusal and a hung renewal: Failures %d, LastError %v; want 2, the refusal", s.Failures, s.LastError)
		}
		within(t, h.Done(), 2*time.Second, "step-down at the deadline")
		if r, cause := h.Reason(); r != keeper.Deadline || !errors.Is(cause, errRefused) {
			t.Errorf("reason %v cause %v; want Deadline wrapping the refusal", r, cause)
		}
		release(t, h)
	})
}

// A failed release is retried with exponential backoff: from
// RenewInterval/8 doubling up to RenewInterval, each delay jittered within
// its upper half.
func TestReleaseRetryBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &scripted{Backend: c, renew: func(context.Context, int64) error { return errPass }}
		b.refuseRelease.Store(true)
		h := start(t, c, config(b)) // every 200ms
		if err := h.Release(context.Background()); !errors.Is(err, errRefused) {
			t.Fatalf("Release refused by the store: got %v, want its error", err)
		}
		time.Sleep(2 * time.Second)
		b.refuseRelease.Store(false)
		within(t, h.Finished(), 2*time.Second, "the end of the release retries")
		ts := b.releases()
		ms := time.Millisecond
		caps := []time.Duration{25 * ms, 50 * ms, 100 * ms, 200 * ms, 200 * ms}
		if len(ts) < len(caps)+1 {
			t.Fatalf("%d releases sent, want the first and at least %d retries", len(ts), len(caps))
		}
		for i, d := range caps {
			if gap := ts[i+1].Sub(ts[i]); gap < d/2 || gap > d {
				t.Errorf("retry %d went %v after the attempt before it, want within [%v, %v]", i+1, gap, d/2, d)
			}
		}
		if _, err := c.Get(t.Context(), "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Get once the retries finished: got %v, want ErrNotHeld", err)
		}
	})
}

// A renewal that succeeds ends the run of failures: Status counts none and
// keeps no error.
func TestSuccessEndsTheFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &flaky{Backend: c, fail: func(n int64) bool { return n <= 2 }}
		h := start(t, c, config(b)) // every 200ms, retries 50ms after a failure
		time.Sleep(280 * time.Millisecond)
		if s := h.Status(); s.Failures != 2 || s.LastError == nil {
			t.Fatalf("after two failed renewals: Failures %d, LastError %v; want 2 and the error", s.Failures, s.LastError)
		}
		time.Sleep(50 * time.Millisecond) // the retry at 300ms succeeds
		if s := h.Status(); s.Failures != 0 || s.LastError != nil {
			t.Errorf("after a successful renewal: Failures %d, LastError %v; want 0, nil", s.Failures, s.LastError)
		}
		release(t, h)
	})
}
