package keeper_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/keeper"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errLost = errors.New("test: lost")

// config: TTL 1s, deadline 700ms, renew every 200ms, requests 200ms.
func config(b backend.Backend) keeper.Config {
	return keeper.Config{
		Backend: b, TTL: time.Second, RenewDeadline: 700 * time.Millisecond,
		RenewInterval: 200 * time.Millisecond, RequestTimeout: 200 * time.Millisecond,
		Cause: func(r keeper.Reason, err error) error { return errors.Join(errLost, errors.New(r.String()), err) },
	}
}

// start acquires "k" on c and keeps it.
func start(t *testing.T, c *memorybackend.Backend, cfg keeper.Config) *keeper.Hold {
	t.Helper()
	sent := time.Now()
	l, err := c.Acquire(t.Context(), backend.AcquireRequest{Key: "k", HolderID: "a", TTL: cfg.TTL})
	if err != nil {
		t.Fatal(err)
	}
	return keeper.Start(t.Context(), cfg, l, sent)
}

func release(t *testing.T, h *keeper.Hold) {
	t.Helper()
	_ = h.Release(context.Background())
	<-h.Finished()
}

func TestRenewalsKeepTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		h := start(t, c, config(c))
		time.Sleep(10 * time.Second)
		if !h.Held() {
			t.Fatal("Held false after 10 TTLs of healthy renewals")
		}
		st := h.Status()
		if d := st.Deadline.Sub(st.LastRenewal); d != 700*time.Millisecond {
			t.Errorf("deadline - last renewal: got %v, want RenewDeadline 700ms", d)
		}
		if got := c.Calls()["Renew"]; got < 45 || got > 51 {
			t.Errorf("renewals in 10s: got %d, want about 50 (every 200ms)", got)
		}
		release(t, h)
		if _, err := c.Get(t.Context(), "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Get after Release: got %v, want ErrNotHeld", err)
		}
	})
}

// A partitioned holder steps down at the deadline, before the store can
// expire its lease, with the deadline's cause.
func TestDeadlineUnderPartition(t *testing.T) {
	for _, fault := range []string{"partition", "hang"} {
		t.Run(fault, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				c := store.Client()
				defer c.Close()
				other := store.Client()
				defer other.Close()
				h := start(t, c, config(c))
				time.Sleep(time.Second + 100*time.Millisecond) // between two renewal ticks
				last := h.Status().LastRenewal
				if fault == "partition" {
					c.Partition()
				} else {
					c.Hang()
				}
				select {
				case <-h.Done():
				case <-time.After(2 * time.Second): // virtual: far past the deadline
					t.Fatal("context not cancelled 2s after the fault, want at the renew deadline")
				}
				stepped := time.Now()
				if want := last.Add(700 * time.Millisecond); !stepped.Equal(want) {
					t.Errorf("stepped down at %v after the last renewal, want exactly RenewDeadline (700ms)", stepped.Sub(last))
				}
				if h.Held() {
					t.Error("Held true after the context was cancelled")
				}
				if r, cause := h.Reason(); r != keeper.Deadline || !errors.Is(cause, errLost) || !errors.Is(context.Cause(h.Context()), errLost) {
					t.Errorf("reason %v cause %v: want Deadline with the configured cause", r, cause)
				}
				if rec, err := other.Get(t.Context(), "k"); err != nil || rec.HolderID != "a" {
					t.Errorf("at step-down the store shows %+v, %v: want the lease still held (TTL not yet over)", rec, err)
				}
				c.Heal()
				release(t, h)
			})
		})
	}
}

// OnStepDown is called once, with the reason of the step-down, after the
// context was cancelled: for a step-down by the keeper itself (the deadline)
// and for Stop, and not again at Release.
func TestOnStepDown(t *testing.T) {
	for _, how := range []string{"deadline", "stop"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				c := store.Client()
				defer c.Close()
				cfg := config(c)
				var calls []keeper.Reason
				var h *keeper.Hold
				var ctxDone bool
				cfg.OnStepDown = func(r keeper.Reason) {
					calls = append(calls, r)
					ctxDone = h.Context().Err() != nil
				}
				h = start(t, c, cfg)
				_ = h.Context()
				want := keeper.Stopped
				if how == "deadline" {
					want = keeper.Deadline
					c.Partition()
					<-h.Done()
					synctest.Wait()
					c.Heal()
				} else {
					h.Stop(errLost)
				}
				release(t, h)
				if len(calls) != 1 || calls[0] != want {
					t.Errorf("OnStepDown calls: %v, want [%v]", calls, want)
				}
				if !ctxDone {
					t.Error("OnStepDown was called before the context was cancelled")
				}
			})
		})
	}
}

// A renewal that succeeds after the deadline passed never revives the hold.
func TestLateRenewalDoesNotRevive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		cfg := config(c)
		cfg.RequestTimeout = 600 * time.Millisecond
		h := start(t, c, cfg)
		c.SetLatency(550 * time.Millisecond) // renewals land, but late
		<-h.Done()
		time.Sleep(2 * time.Second)
		if h.Held() {
			t.Fatal("Held true again after a late renewal")
		}
		if r, _ := h.Reason(); r != keeper.Deadline {
			t.Errorf("reason %v, want Deadline", r)
		}
		c.SetLatency(0)
		release(t, h)
	})
}

// After the store lost the lease, RenewNow finds out within one round trip.
func TestRenewNowAfterDataLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		c.SetLatency(5 * time.Millisecond)
		h := start(t, c, config(c))
		time.Sleep(50 * time.Millisecond)
		store.Restart(nil)
		at := time.Now()
		h.RenewNow()
		<-h.Done()
		if d := time.Since(at); d > 10*time.Millisecond {
			t.Errorf("stepped down %v after the data loss, want one round trip (5ms)", d)
		}
		if r, cause := h.Reason(); r != keeper.LeaseLost || !errors.Is(cause, backend.ErrLeaseLost) {
			t.Errorf("reason %v cause %v, want LeaseLost wrapping backend.ErrLeaseLost", r, cause)
		}
		if err := h.Release(context.Background()); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Release of a lost lease: got %v, want ErrLeaseLost", err)
		}
		if err := h.Release(context.Background()); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("second Release: got %v, want the first call's result", err)
		}
		<-h.Finished()
	})
}

// Stop cancels the context at once with the owner's cause; renewals go on
// until Release, which then deletes the lease.
func TestStopKeepsRenewingUntilRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		h := start(t, c, config(c))
		mine := errors.New("owner stopped")
		if !h.Stop(mine) {
			t.Fatal("Stop: got false, want true for the first step-down")
		}
		if h.Stop(errors.New("again")) {
			t.Error("second Stop: got true, want false")
		}
		if got := context.Cause(h.Context()); got != mine {
			t.Errorf("cause %v, want the owner's", got)
		}
		time.Sleep(5 * time.Second) // the owner's work winds down
		if rec, err := c.Get(t.Context(), "k"); err != nil || rec.HolderID != "a" {
			t.Fatalf("5s after Stop: got %+v, %v; want the lease still renewed", rec, err)
		}
		if err := h.Release(context.Background()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		<-h.Finished()
		if _, err := c.Get(t.Context(), "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Get after Release: got %v, want ErrNotHeld", err)
		}
	})
}

// A release that fails while the store is unreachable is retried once it is
// back, long before the lease's TTL would have ended it.
func TestReleaseRetriedWhenStoreIsBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		other := store.Client()
		defer other.Close()
		cfg := config(c)
		cfg.TTL, cfg.RenewDeadline = time.Minute, 50*time.Second
		h := start(t, c, cfg)
		c.Partition()
		if err := h.Release(context.Background()); err == nil || errors.Is(err, backend.ErrLeaseLost) {
			t.Fatalf("Release while partitioned: got %v, want the store's error", err)
		}
		time.Sleep(time.Second)
		c.Heal()
		time.Sleep(time.Second)
		if _, err := other.Get(t.Context(), "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("1s after the store came back: got %v, want the lease released by a retry", err)
		}
		<-h.Finished()
	})
}

// A release retried in the background stops when the parent context given
// to Start ends, even while the store stays down: the owner's Close, which
// ends that context and waits for Finished, leaves no goroutine behind
// (istio #60843: a goroutine left per lost term).
func TestReleaseRetryEndsWithTheParent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		cfg := config(c)
		l, err := c.Acquire(t.Context(), backend.AcquireRequest{Key: "k", HolderID: "a", TTL: cfg.TTL})
		if err != nil {
			t.Fatal(err)
		}
		parent, cancel := context.WithCancel(context.Background())
		h := keeper.Start(parent, cfg, l, time.Now())
		c.Partition()
		if err := h.Release(context.Background()); err == nil || errors.Is(err, backend.ErrLeaseLost) {
			t.Fatalf("Release while partitioned: got %v, want the store's error", err)
		}
		time.Sleep(time.Second) // retries go on meanwhile
		select {
		case <-h.Finished():
			t.Fatal("finished while the release was still being retried")
		default:
		}
		cancel()
		select {
		case <-h.Finished():
		case <-time.After(time.Minute): // virtual
			c.Heal() // lets the retry that outlived its parent end, so the test fails rather than hangs
			<-h.Finished()
			t.Fatal("release retries still running a minute after the parent context ended, with the store down")
		}
	})
}

// MaxHold steps down with its reason and stops renewing, so the store ends
// the lease one TTL after the last renewal even if the owner never returns.
func TestMaxHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		cfg := config(c)
		cfg.MaxHold = 3 * time.Second
		start0 := time.Now()
		h := start(t, c, cfg)
		<-h.Done()
		if d := time.Since(start0); d != 3*time.Second {
			t.Errorf("stepped down after %v, want MaxHold (3s)", d)
		}
		if r, _ := h.Reason(); r != keeper.MaxHold {
			t.Errorf("reason %v, want MaxHold", r)
		}
		time.Sleep(cfg.TTL + time.Millisecond)
		if _, err := c.Get(t.Context(), "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("one TTL after MaxHold: got %v, want the lease expired (no renewals)", err)
		}
		release(t, h)
	})
}

// Extend renews at once and moves the deadline; NoRenew holds for one
// deadline only.
func TestNoRenewAndExtend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		cfg := config(c)
		cfg.NoRenew = true
		h := start(t, c, cfg)
		time.Sleep(500 * time.Millisecond)
		if err := h.Extend(t.Context()); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if got, want := h.Deadline(), time.Now().Add(700*time.Millisecond); !got.Equal(want) {
			t.Errorf("deadline after Extend: got %v, want now + 700ms", time.Until(got))
		}
		<-h.Done()
		if got := c.Calls()["Renew"]; got != 1 {
			t.Errorf("renewals with NoRenew: got %d, want only the one Extend", got)
		}
		if err := h.Extend(t.Context()); err == nil {
			t.Error("Extend after step-down: got nil, want an error")
		}
		release(t, h)
	})
}

// Verify detects a lease that is no longer the holder's.
func TestVerify(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		h := start(t, c, config(c))
		if rec, err := h.Verify(t.Context()); err != nil || rec.Term != h.Lease().Term {
			t.Fatalf("Verify: %+v, %v", rec, err)
		}
		store.Restart(nil)
		if _, err := c.Acquire(t.Context(), backend.AcquireRequest{Key: "k", HolderID: "b", TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Verify(t.Context()); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Verify after another acquired: got %v, want ErrLeaseLost", err)
		}
		if h.Held() {
			t.Error("Held true after a failed Verify")
		}
		release(t, h)
	})
}

// A machine suspended for longer than the TTL: the monotonic clock stood
// still, the wall clock (corrected after the resume) did not. The hold
// answers false and steps down at once.
func TestWallClockPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		var suspended atomic.Int64 // read by renewal callbacks
		restore := keeper.SetWallClock(func() time.Time { return time.Now().Round(0).Add(time.Duration(suspended.Load())) })
		defer restore()
		h := start(t, c, config(c))
		time.Sleep(time.Second + 100*time.Millisecond) // between two renewal ticks
		if !h.Held() {
			t.Fatal("Held false before the suspend")
		}
		suspended.Store(int64(5 * time.Second))
		if h.Held() {
			t.Fatal("Held true after a suspend longer than the TTL (wall clock past the deadline)")
		}
		select {
		case <-h.Done():
		default:
			t.Fatal("context not cancelled when Held found the wall clock past the deadline")
		}
		if r, cause := h.Reason(); r != keeper.Deadline || cause == nil {
			t.Errorf("reason %v cause %v, want Deadline", r, cause)
		}
		suspended.Store(0)
		release(t, h)
	})
}

// A wall clock stepped back changes nothing.
func TestWallClockSteppedBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		restore := keeper.SetWallClock(func() time.Time { return time.Now().Round(0).Add(-time.Hour) })
		defer restore()
		h := start(t, c, config(c))
		time.Sleep(5 * time.Second)
		if !h.Held() {
			t.Fatal("Held false with a wall clock stepped back")
		}
		release(t, h)
	})
}

// Past the deadline, before its timer has run, Held, Verify and Extend all
// agree that the hold is over, with the deadline's cause.
func TestDeadlineSeenBeforeItsTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		cfg := config(c)
		cfg.RequestTimeout = 600 * time.Millisecond
		cfg.NoRenew = true
		h := start(t, c, cfg)
		c.SetLatency(400 * time.Millisecond)
		// Extend sent at 500ms is cut at the 700ms deadline.
		time.Sleep(500 * time.Millisecond)
		err := h.Extend(context.Background())
		if err == nil || !errors.Is(err, errLost) {
			t.Errorf("Extend that landed after the deadline: got %v, want the deadline's cause", err)
		}
		if _, err := h.Verify(context.Background()); err == nil || !errors.Is(err, errLost) {
			t.Errorf("Verify after the deadline: got %v, want the deadline's cause", err)
		}
		if r, _ := h.Reason(); r != keeper.Deadline {
			t.Errorf("reason %v, want Deadline", r)
		}
		c.SetLatency(0)
		release(t, h)
	})
}

// At step-down the deadline becomes the step-down's instant and stops
// moving: renewals go on until Release, but none moves it again or reports
// a new one to OnRenew.
func TestDeadlineStopsAtStepDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		cfg := config(c)
		var renewed atomic.Int32
		cfg.OnRenew = func(time.Time, time.Time) { renewed.Add(1) }
		h := start(t, c, cfg)
		time.Sleep(300 * time.Millisecond) // one renewal, at 200ms
		h.Stop(errLost)
		stopped := time.Now()
		if got := h.Deadline(); !got.Equal(stopped) {
			t.Errorf("deadline %v after Stop, want the Stop instant", got.Sub(stopped))
		}
		n, sent := renewed.Load(), c.Calls()["Renew"]
		time.Sleep(time.Second)
		if got := c.Calls()["Renew"]; got < sent+4 {
			t.Fatalf("%d renewals in the second after Stop, want about 5 (they go on until Release)", got-sent)
		}
		if got := h.Deadline(); !got.Equal(stopped) {
			t.Errorf("deadline %v after Stop once renewals went on, want the Stop instant", got.Sub(stopped))
		}
		if got := renewed.Load(); got != n {
			t.Errorf("OnRenew called %d times after Stop, want 0", got-n)
		}
		release(t, h)
	})
}

// Once the store has reported the lease gone, nothing is sent for it any
// more: Release sends no release (the lease is not the holder's to delete)
// and the hold has finished when it returns, whether the loss was known
// before Release or found by a renewal Release waited for.
func TestReleaseOfALostLeaseSendsNothing(t *testing.T) {
	for _, when := range []string{"before", "during"} {
		t.Run(when, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				c := store.Client()
				defer c.Close()
				c.SetLatency(5 * time.Millisecond)
				h := start(t, c, config(c))
				time.Sleep(50 * time.Millisecond)
				store.Restart(nil)
				h.RenewNow()
				if when == "before" {
					within(t, h.Done(), 2*time.Second, "step-down on the loss")
				} // else the renewal finding the loss is in flight
				if err := h.Release(context.Background()); !errors.Is(err, backend.ErrLeaseLost) {
					t.Errorf("Release of a lost lease: got %v, want ErrLeaseLost", err)
				}
				select {
				case <-h.Finished():
				default:
					t.Error("Finished not closed when Release of a lost lease returned")
				}
				if n := c.Calls()["Release"]; n != 0 {
					t.Errorf("%d releases sent for a lease the store reported gone, want 0", n)
				}
			})
		})
	}
}

// Once the store has reported the lease gone, or MaxHold has passed,
// renewals stop: RenewNow sends nothing any more, and one asked for during
// the renewal that finds the loss is not sent either.
func TestRenewNowAfterRenewalsStopped(t *testing.T) {
	for _, why := range []string{"lost", "lost while renewing", "max hold"} {
		t.Run(why, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				c := store.Client()
				defer c.Close()
				c.SetLatency(5 * time.Millisecond)
				cfg := config(c) // renewals every 200ms
				want := int64(1) // the renewal that finds the loss
				if why == "max hold" {
					cfg.MaxHold, want = 100*time.Millisecond, 0
				}
				h := start(t, c, cfg)
				time.Sleep(50 * time.Millisecond)
				if why != "max hold" {
					store.Restart(nil)
					h.RenewNow()
				}
				if why == "lost while renewing" {
					h.RenewNow()
				}
				within(t, h.Done(), 2*time.Second, "step-down")
				synctest.Wait()
				h.RenewNow()
				time.Sleep(time.Second)
				if n := c.Calls()["Renew"]; n != want {
					t.Errorf("%d renewals sent (%s), want %d", n, why, want)
				}
				release(t, h)
			})
		})
	}
}

// A release retried in the background stops when the store reports the
// lease gone: the hold has finished then, not when the parent context ends.
func TestReleaseRetryStopsWhenTheLeaseIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		h := start(t, c, config(c))
		c.Partition()
		if err := h.Release(context.Background()); err == nil || errors.Is(err, backend.ErrLeaseLost) {
			t.Fatalf("Release while partitioned: got %v, want the store's error", err)
		}
		store.Restart(nil) // the lease is gone by the time the store is back
		c.Heal()
		timer := time.NewTimer(time.Second)
		defer timer.Stop()
		select {
		case <-h.Finished():
		case <-timer.C:
			t.Fatal("not finished 1s after the store came back without the lease; want the retries over")
		}
		sent := c.Calls()["Release"]
		time.Sleep(time.Second)
		if n := c.Calls()["Release"] - sent; n != 0 {
			t.Errorf("%d releases sent after the hold finished, want 0", n)
		}
	})
}

// A machine suspended for longer than the TTL, then resumed: the next
// periodic renewal finds the wall clock past the deadline and steps down
// before it could move the deadline, though no one called Held. Both ways
// of renewing.
func TestWallClockSeenByTheNextRenewal(t *testing.T) {
	for _, batched := range []bool{false, true} {
		name := "one by one"
		if batched {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := memorybackend.NewStore().Client()
				defer c.Close()
				var b backend.Backend = c
				if batched {
					b = &keyed{Backend: c}
				}
				var suspended atomic.Int64 // read by renewal callbacks
				restore := keeper.SetWallClock(func() time.Time { return time.Now().Round(0).Add(time.Duration(suspended.Load())) })
				defer restore()
				h := acquire(t, b, config(b), "k") // renewals every 200ms, deadline 700ms
				time.Sleep(time.Second + 100*time.Millisecond)
				suspended.Store(int64(5 * time.Second))
				time.Sleep(200 * time.Millisecond) // one renewal tick
				select {
				case <-h.Done():
				default:
					t.Fatalf("not stepped down after a renewal tick with the wall clock past the deadline (deadline in %v)", time.Until(h.Deadline()))
				}
				if r, _ := h.Reason(); r != keeper.Deadline {
					t.Errorf("reason %v, want Deadline", r)
				}
				suspended.Store(0)
				release(t, h)
			})
		})
	}
}

// termBumped is a memory client whose Get reports the key's record with its
// term raised by one: the same holder and token under a later term, as on a
// store whose token is a handle the holder reuses (an etcd session lease
// that acquired the key again).
type termBumped struct{ *memorybackend.Backend }

func (b termBumped) Get(ctx context.Context, key string) (backend.Record, error) {
	rec, err := b.Backend.Get(ctx, key)
	rec.Term++
	return rec, err
}

// Verify compares the term too: the same holder and token under another
// term is another acquisition, not this lease.
func TestVerifyComparesTheTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		cfg := config(termBumped{c})
		cfg.NoRenew = true
		h := start(t, c, cfg)
		if _, err := h.Verify(t.Context()); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Verify of a record of the same holder and token under term %d: got %v, want ErrLeaseLost", h.Lease().Term+1, err)
		}
		if r, _ := h.Reason(); r != keeper.LeaseLost {
			t.Errorf("reason %v after Verify found another term, want LeaseLost", r)
		}
		release(t, h)
	})
}

// SetMetadata that finds the lease gone steps the hold down: the store has
// told it the lease is no longer its own.
func TestSetMetadataOnALostLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		h := start(t, c, config(c))
		store.Restart(nil)
		if err := h.SetMetadata(t.Context(), map[string]string{"a": "b"}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Fatalf("SetMetadata after the store lost the lease: got %v, want ErrLeaseLost", err)
		}
		if h.Held() {
			t.Error("Held true after SetMetadata found the lease gone")
		}
		if r, cause := h.Reason(); r != keeper.LeaseLost || !errors.Is(cause, backend.ErrLeaseLost) {
			t.Errorf("reason %v cause %v, want LeaseLost wrapping ErrLeaseLost", r, cause)
		}
		release(t, h)
	})
}
