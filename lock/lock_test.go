package lock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestNewOptions(t *testing.T) {
	b := memorybackend.New()
	defer b.Close()
	l, err := lock.New(b, "a", nil)
	if err != nil {
		t.Fatalf("New(nil options): %v", err)
	}
	o := l.Options()
	if o.TTL != 10*time.Second || o.RenewDeadline != 7*time.Second || o.RenewInterval != 5*time.Second || o.RequestTimeout != 2*time.Second {
		t.Errorf("defaults: got TTL %v, RenewDeadline %v, RenewInterval %v, RequestTimeout %v, want 10s, 7s, 5s, 2s",
			o.TTL, o.RenewDeadline, o.RenewInterval, o.RequestTimeout)
	}
	l.Close()

	slow := &spy{Backend: b, minTTL: time.Second}
	for _, tc := range []struct {
		name  string
		b     backend.Backend
		id    string
		o     *lock.Options
		field string
	}{
		{"nil backend", nil, "a", nil, "nil backend"},
		{"empty id", b, "", nil, "empty holder ID"},
		{"negative TTL", b, "a", &lock.Options{TTL: -1}, "TTL is negative"},
		{"deadline not below TTL", b, "a", &lock.Options{TTL: time.Second, RenewDeadline: time.Second}, "RenewDeadline (1s) must be less than TTL (1s)"},
		{"interval not below deadline", b, "a", &lock.Options{TTL: time.Second, RenewInterval: 800 * time.Millisecond}, "RenewInterval (800ms)"},
		{"timeout not below deadline", b, "a", &lock.Options{TTL: time.Second, RequestTimeout: 700 * time.Millisecond}, "RequestTimeout (700ms)"},
		{"TTL below MinTTL", slow, "a", &lock.Options{TTL: 500 * time.Millisecond}, "TTL (500ms) must be at least the backend's MinTTL (1s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := lock.New(tc.b, tc.id, tc.o)
			if !errors.Is(err, lock.ErrInvalidOptions) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("got error %v, want one wrapping ErrInvalidOptions naming %q", err, tc.field)
			}
		})
	}

	t.Run("acquire options", func(t *testing.T) {
		l := newLocker(t, slow, "a", &lock.Options{TTL: 2 * time.Second, Logger: quiet})
		for _, ao := range []*lock.AcquireOptions{{TTL: -1}, {MaxHold: -1}, {TTL: 500 * time.Millisecond}} {
			if _, err := l.TryAcquire(t.Context(), "k", ao); !errors.Is(err, lock.ErrInvalidOptions) {
				t.Errorf("TryAcquire(%+v): got error %v, want ErrInvalidOptions", *ao, err)
			}
		}
	})
}

func TestKeys(t *testing.T) {
	if got := lock.Key("tally", "election-42", "a:b"); got != "tally/election-42/a:b" {
		t.Errorf("Key: got %q, want %q", got, "tally/election-42/a:b")
	}
	store := memorybackend.NewStore()
	c := client(t, store)
	l := newLocker(t, &spy{Backend: c, rejectKey: "lock/refused"}, "a", fastOpts())
	for _, k := range []string{"", "/a", "a/", "a//b", lock.Key("a", "", "b"), "refused"} {
		if _, err := l.TryAcquire(t.Context(), k, nil); !errors.Is(err, lock.ErrInvalidKey) {
			t.Errorf("TryAcquire(%q): got error %v, want ErrInvalidKey", k, err)
		}
		if _, err := l.Holders(t.Context(), k); !errors.Is(err, lock.ErrInvalidKey) {
			t.Errorf("Holders(%q): got error %v, want ErrInvalidKey", k, err)
		}
	}
	lk, err := l.TryAcquire(t.Context(), "jobs:x/y", nil)
	if err != nil {
		t.Fatalf("TryAcquire with ':' and '/': %v", err)
	}
	defer lk.Release(t.Context())
	// Stored under "lock/" + key, apart from elections.
	if rec, err := c.Get(t.Context(), "lock/jobs:x/y"); err != nil || rec.Term != lk.Term() {
		t.Errorf("backend key lock/jobs:x/y: got %+v, %v; want the lock's record", rec, err)
	}
	if _, err := c.Get(t.Context(), "jobs:x/y"); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("backend key without prefix: got %v, want ErrNotHeld", err)
	}
}

// TestHeldError checks what a failed attempt reports, from one round trip.
func TestHeldError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		alice := newLocker(t, client(t, store), "alice@host", fastOpts())
		bc := client(t, store)
		bob := newLocker(t, bc, "bob@host", fastOpts())

		time.Sleep(time.Hour) // the store clock is virtual: a known instant
		acquiredAt := time.Now()
		lk, err := alice.TryAcquire(t.Context(), lock.Key("tally", "42"), &lock.AcquireOptions{Metadata: map[string]string{"request": "r-1"}})
		if err != nil {
			t.Fatalf("alice TryAcquire: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
		bc.ResetCalls()
		_, err = bob.TryAcquire(t.Context(), "tally/42", nil)
		var he *lock.HeldError
		if !errors.As(err, &he) || !errors.Is(err, lock.ErrHeld) || !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("bob TryAcquire: got %v, want a *HeldError matching lock.ErrHeld and backend.ErrHeld", err)
		}
		h := he.Holder
		if he.Key != "tally/42" || h.Key != "tally/42" || h.HolderID != "alice@host" || h.Term != lk.Term() ||
			!h.AcquiredAt.Equal(acquiredAt) || h.Metadata["request"] != "r-1" || h.TTL <= 0 || h.TTL > time.Second {
			t.Errorf("holder: got key %q, %+v; want tally/42 held by alice@host, term %d, since %v, metadata request=r-1, TTL in (0, 1s]",
				he.Key, h, lk.Term(), acquiredAt)
		}
		want := fmt.Sprintf(`lock "tally/42" held by "alice@host" (term %d) since %s`, lk.Term(), acquiredAt.Local().Format(time.TimeOnly))
		if err.Error() != want {
			t.Errorf("message: got %q, want %q", err.Error(), want)
		}
		if calls := bc.Calls(); calls["Acquire"] != 1 || calls["Get"] != 0 {
			t.Errorf("bob's calls: got %v, want one Acquire and no Get (the holder comes in the same round trip)", calls)
		}

		// Not reentrant: a second attempt by the same Locker names itself.
		_, err = alice.TryAcquire(t.Context(), "tally/42", nil)
		if !errors.As(err, &he) || he.Holder.HolderID != "alice@host" || he.Holder.Term != lk.Term() {
			t.Errorf("alice's second TryAcquire: got %v, want a HeldError naming alice@host, term %d", err, lk.Term())
		}
		if err := lk.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
	})
}

// TestLossByPartition: a holder cut off from the store cancels its lock's
// context at its renew deadline, while the store still holds the lease.
func TestLossByPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ac := client(t, store)
		alice := newLocker(t, ac, "alice", fastOpts())
		bob := newLocker(t, client(t, store), "bob", fastOpts())
		t0 := time.Now()
		lk, err := alice.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		time.Sleep(500 * time.Millisecond) // renewed every 200ms
		ac.Partition()
		// Deadline: the last renewal's send time + RenewDeadline (700ms).
		// The store keeps the lease until that renewal + TTL (1s).
		dl := lk.Deadline()
		if d := dl.Sub(t0); d < 900*time.Millisecond || d > 1200*time.Millisecond {
			t.Errorf("deadline %v after acquiring, want a renewal in the last 200ms + 700ms", d)
		}
		select {
		case <-lk.Done():
		case <-time.After(2 * time.Second): // virtual: far past the deadline
			t.Fatal("lock context not cancelled 2s after the partition, want at the renew deadline")
		}
		if !time.Now().Equal(dl) {
			t.Errorf("lock context cancelled %v after the deadline, want at it", time.Since(dl))
		}
		if lk.Held() {
			t.Error("Held: got true after the deadline, want false")
		}
		if err := lk.Err(); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("cause: got %v, want ErrLockLost", err)
		}
		var he *lock.HeldError
		if _, err := bob.TryAcquire(t.Context(), "k", nil); !errors.As(err, &he) || he.Holder.HolderID != "alice" {
			t.Fatalf("bob's TryAcquire at alice's deadline: got %v, want held by alice (the store still holds it)", err)
		} else if he.Holder.TTL != 300*time.Millisecond {
			t.Errorf("lease TTL left at the store when alice stopped: got %v, want 300ms", he.Holder.TTL)
		}
		time.Sleep(300 * time.Millisecond)
		lb, err := bob.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatalf("bob's TryAcquire after expiry: %v", err)
		}
		ac.Heal()
		if err := lk.Release(t.Context()); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("alice's Release: got %v, want ErrLockLost", err)
		}
		if err := lb.Release(t.Context()); err != nil {
			t.Errorf("bob's Release: %v", err)
		}
	})
}

func TestMaxHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		other := newLocker(t, client(t, store), "b", fastOpts())
		t0 := time.Now()
		var stoppedAt time.Duration
		var cause error
		err := l.Do(t.Context(), "k", &lock.AcquireOptions{MaxHold: 3 * time.Second}, func(ctx context.Context, lk *lock.Lock) error {
			<-ctx.Done()
			stoppedAt, cause = time.Since(t0), context.Cause(ctx)
			return nil
		})
		if stoppedAt != 3*time.Second {
			t.Errorf("fn's context cancelled after %v, want 3s (MaxHold)", stoppedAt)
		}
		if !errors.Is(cause, lock.ErrMaxHold) || !errors.Is(cause, lock.ErrLockLost) {
			t.Errorf("cause: got %v, want ErrMaxHold and ErrLockLost", cause)
		}
		if !errors.Is(err, lock.ErrMaxHold) || !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("Do: got %v, want an error matching ErrMaxHold and ErrLockLost", err)
		}
		if lk, err := other.TryAcquire(t.Context(), "k", nil); err != nil {
			t.Errorf("TryAcquire after Do returned: %v, want the lock released", err)
		} else {
			lk.Release(t.Context())
		}
	})
}

// TestDoReleasesAfterFn: the lock stays held (renewed) while fn winds down
// after its context was cancelled, and is released the moment fn returns.
func TestDoReleasesAfterFn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		other := newLocker(t, client(t, store), "b", fastOpts())
		ctx, cancel := context.WithCancel(t.Context())
		var returnedAt time.Time
		done := make(chan error)
		go func() {
			done <- l.Do(ctx, "k", nil, func(ctx context.Context, lk *lock.Lock) error {
				<-ctx.Done()
				time.Sleep(5 * time.Second) // five TTLs of winding down
				returnedAt = time.Now()
				return errors.New("wound down")
			})
		}()
		time.Sleep(time.Second)
		cancel()
		for range 4 {
			time.Sleep(time.Second)
			if _, err := other.TryAcquire(t.Context(), "k", nil); !errors.Is(err, lock.ErrHeld) {
				t.Fatalf("TryAcquire while fn winds down: got %v, want ErrHeld", err)
			}
		}
		err := <-done
		if err == nil || err.Error() != "wound down" {
			t.Errorf("Do: got %v, want fn's error alone", err)
		}
		if !time.Now().Equal(returnedAt) {
			t.Errorf("Do returned %v after fn", time.Since(returnedAt))
		}
		lk, err := other.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatalf("TryAcquire right after fn returned: %v, want the lock free", err)
		}
		lk.Release(t.Context())
	})
}

// TestAcquireWokenByRelease: a waiter acquires at the instant of the
// release, not at a poll.
func TestAcquireWokenByRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		opts := &lock.Options{TTL: 10 * time.Second, Logger: quiet}
		alice := newLocker(t, client(t, store), "alice", opts)
		bc := client(t, store)
		bob := newLocker(t, bc, "bob", opts)
		la, err := alice.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			lb, err := bob.Acquire(t.Context(), "k", nil)
			if err != nil {
				t.Errorf("bob Acquire: %v", err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			if lb.Term() <= la.Term() {
				t.Errorf("term: got %d, want more than %d", lb.Term(), la.Term())
			}
			lb.Release(context.Background())
		}()
		time.Sleep(3 * time.Second)
		releasedAt := time.Now()
		if err := la.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		if at := <-got; !at.Equal(releasedAt) {
			t.Errorf("bob acquired %v after the release, want at the release instant", at.Sub(releasedAt))
		}
		if n := bc.Calls()["Acquire"]; n != 2 {
			t.Errorf("bob's Acquire calls: got %d, want 2 (one held, one after the release): no polling", n)
		}
	})
}

// TestNoMissedWakeup: a release between the waiter's attempt and its wait
// still wakes it, because it subscribed before the attempt.
func TestNoMissedWakeup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		opts := &lock.Options{TTL: 10 * time.Second, Logger: quiet}
		alice := newLocker(t, client(t, store), "alice", opts)
		bs := &spy{Backend: client(t, store)}
		bob := newLocker(t, bs, "bob", opts)
		la, err := alice.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		var releasedAt time.Time
		bs.afterHeld = func() {
			time.Sleep(time.Second)
			releasedAt = time.Now()
			if err := la.Release(context.Background()); err != nil {
				t.Errorf("alice Release: %v", err)
			}
		}
		lb, err := bob.Acquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatalf("bob Acquire: %v", err)
		}
		if !time.Now().Equal(releasedAt) {
			t.Errorf("bob acquired %v after the release, want at once (a missed wake-up waits for the TTL)", time.Since(releasedAt))
		}
		lb.Release(t.Context())
	})
}

// TestLocalQueue: goroutines of one Locker waiting for one key acquire in
// arrival order, and only one of them talks to the backend at a time.
func TestLocalQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		holder := newLocker(t, client(t, store), "holder", fastOpts())
		mc := client(t, store)
		mc.SetLatency(10 * time.Millisecond) // so that overlapping attempts would overlap
		s := &spy{Backend: mc}
		l := newLocker(t, s, "local", fastOpts())
		lh, err := holder.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		const n = 5
		var (
			mu    sync.Mutex
			order []int
			wg    sync.WaitGroup
		)
		for i := range n {
			wg.Go(func() {
				lk, err := l.Acquire(t.Context(), "k", nil)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
				if err := lk.Release(context.Background()); err != nil {
					t.Errorf("waiter %d Release: %v", i, err)
				}
			})
			synctest.Wait() // waiter i is queued before i+1 arrives
		}
		time.Sleep(3 * time.Second) // several TTLs of the holder's lease being renewed
		if got := s.Calls()["Acquire"]; got > 4 {
			t.Errorf("Acquire calls while the holder held the key: got %d, want at most 4 (only the head tries, by TTL)", got)
		}
		lh.Release(t.Context())
		wg.Wait()
		if want := []int{0, 1, 2, 3, 4}; !slices.Equal(order, want) {
			t.Errorf("acquisition order: got %v, want %v", order, want)
		}
		if m := s.maxInflight.Load(); m != 1 {
			t.Errorf("Acquire calls in flight at once: got %d, want 1", m)
		}
	})
}

// TestAcquireGivesUp: when ctx ends, the error names the last holder and
// matches both ErrHeld and the context's error, for the head of the queue
// and for a waiter behind it.
func TestAcquireGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		alice := newLocker(t, client(t, store), "alice", fastOpts())
		bob := newLocker(t, client(t, store), "bob", fastOpts())
		la, err := alice.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer la.Release(t.Context())
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				_, err := bob.Acquire(ctx, "k", nil)
				errs <- err
			}()
		}
		for range 2 {
			err := <-errs
			var he *lock.HeldError
			if !errors.As(err, &he) || !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) || he.Holder.HolderID != "alice" {
				t.Errorf("Acquire: got %v, want a HeldError naming alice matching ErrHeld and DeadlineExceeded", err)
			}
		}
		if time.Since(la.Record().AcquiredAt) != 5*time.Second {
			t.Errorf("gave up after %v, want 5s", time.Since(la.Record().AcquiredAt))
		}
	})
}

func TestRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		other := newLocker(t, client(t, store), "b", fastOpts())

		lk, err := l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		if !lk.Held() || lk.Err() != nil {
			t.Fatalf("fresh lock: Held %v, Err %v; want true, nil", lk.Held(), lk.Err())
		}
		for i := range 2 {
			if err := lk.Release(t.Context()); err != nil {
				t.Errorf("Release #%d: got %v, want nil", i+1, err)
			}
		}
		if lk.Held() || !errors.Is(lk.Err(), lock.ErrReleased) || errors.Is(lk.Err(), lock.ErrLockLost) {
			t.Errorf("released lock: Held %v, Err %v; want false and ErrReleased", lk.Held(), lk.Err())
		}
		if err := lk.Extend(t.Context()); !errors.Is(err, lock.ErrReleased) {
			t.Errorf("Extend after Release: got %v, want ErrReleased", err)
		}

		// Lost: no renewal, the store expires it, someone else takes it.
		lk, err = l.TryAcquire(t.Context(), "k", &lock.AcquireOptions{NoRenew: true})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		if !errors.Is(lk.Err(), lock.ErrLockLost) {
			t.Errorf("NoRenew lock after its TTL: Err %v, want ErrLockLost", lk.Err())
		}
		lo, err := other.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := lk.Release(t.Context()); !errors.Is(err, lock.ErrLockLost) {
				t.Errorf("Release #%d of a lost lock: got %v, want ErrLockLost", i+1, err)
			}
		}
		if _, err := other.TryAcquire(t.Context(), "k", nil); !errors.Is(err, lock.ErrHeld) {
			t.Errorf("the lost lock's Release must not free the new holder's lock: got %v", err)
		}
		lo.Release(t.Context())

		// Any goroutine may release.
		lk, err = l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error)
		go func() { done <- lk.Release(context.Background()) }()
		if err := <-done; err != nil {
			t.Errorf("Release from another goroutine: %v", err)
		}
	})
}

func TestExtendVerifyMetadata(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		lk, err := l.TryAcquire(t.Context(), "k", &lock.AcquireOptions{NoRenew: true, Metadata: map[string]string{"v": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		for range 5 { // NoRenew: Extend alone keeps it
			time.Sleep(500 * time.Millisecond)
			if err := lk.Extend(t.Context()); err != nil {
				t.Fatalf("Extend: %v", err)
			}
		}
		if !lk.Held() {
			t.Fatal("Held after Extends: got false")
		}
		if err := lk.Verify(t.Context()); err != nil {
			t.Errorf("Verify: %v", err)
		}
		if err := lk.SetMetadata(t.Context(), map[string]string{"v": "2"}); err != nil {
			t.Fatalf("SetMetadata: %v", err)
		}
		hs, err := l.Holders(t.Context(), "k")
		if err != nil || len(hs) != 1 || hs[0].Metadata["v"] != "2" || hs[0].Key != "k" || lk.Record().Metadata["v"] != "2" {
			t.Errorf("Holders after SetMetadata: got %+v, %v; want one record, key k, v=2", hs, err)
		}
		time.Sleep(700 * time.Millisecond) // past the deadline: lost
		if err := lk.Verify(t.Context()); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("Verify after the deadline: got %v, want ErrLockLost", err)
		}
		lk.Release(t.Context())
	})
}

// TestLostDuringDo: fn's context is cancelled when the lock is lost, and
// Do's result carries both fn's error and the loss.
func TestLostDuringDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		errWork := errors.New("work interrupted")
		err := l.Do(t.Context(), "k", nil, func(ctx context.Context, lk *lock.Lock) error {
			c.Partition()
			<-ctx.Done()
			if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
				t.Errorf("fn's context cause: got %v, want ErrLockLost", context.Cause(ctx))
			}
			return errWork
		})
		if !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, errWork) {
			t.Errorf("Do: got %v, want an error matching ErrLockLost and fn's error", err)
		}
	})
}

// TestBackendDown: with the store unreachable, TryDo and Do return an error
// and never run fn.
func TestBackendDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		c.Partition()
		ran := false
		fn := func(context.Context, *lock.Lock) error { ran = true; return nil }
		if err := l.TryDo(t.Context(), "k", nil, fn); !errors.Is(err, memorybackend.ErrPartitioned) || errors.Is(err, lock.ErrHeld) {
			t.Errorf("TryDo: got %v, want ErrPartitioned", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		if err := l.Do(ctx, "k", nil, fn); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, memorybackend.ErrPartitioned) {
			t.Errorf("Do: got %v, want DeadlineExceeded with the last backend error", err)
		}
		if ran {
			t.Error("fn ran while the backend was down")
		}
		// Hung store: the attempt is bounded by RequestTimeout.
		c.Heal()
		c.Hang()
		start := time.Now()
		if err := l.TryDo(t.Context(), "k", nil, fn); err == nil || ran {
			t.Errorf("TryDo on a hung store: got %v (ran %v), want an error", err, ran)
		}
		if d := time.Since(start); d != 200*time.Millisecond {
			t.Errorf("TryDo on a hung store took %v, want RequestTimeout (200ms)", d)
		}
		c.Heal()
	})
}

func TestClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l, err := lock.New(client(t, store), "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		other := newLocker(t, client(t, store), "b", fastOpts())
		plain, err := l.TryAcquire(t.Context(), "plain", nil)
		if err != nil {
			t.Fatal(err)
		}
		inDo := make(chan struct{})
		var fnCause, windingDown error
		var fnReturned time.Time
		doErr := make(chan error)
		go func() {
			doErr <- l.Do(t.Context(), "do", nil, func(ctx context.Context, lk *lock.Lock) error {
				close(inDo)
				<-ctx.Done()
				fnCause = context.Cause(ctx)
				time.Sleep(1500 * time.Millisecond) // winding down, past the TTL (1s)
				// Still held: Close releases only after fn returned (kubernetes #139991).
				if lo, err := other.TryAcquire(context.Background(), "do", nil); err == nil {
					lo.Release(context.Background())
				} else {
					windingDown = err
				}
				time.Sleep(500 * time.Millisecond)
				fnReturned = time.Now()
				return nil
			})
		}()
		<-inDo
		waitErr := make(chan error)
		go func() {
			_, err := l.Acquire(t.Context(), "plain", nil) // held by l itself
			waitErr <- err
		}()
		synctest.Wait()
		if err := l.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if time.Since(fnReturned) != 0 {
			t.Errorf("Close returned %v after fn, want when fn returned", time.Since(fnReturned))
		}
		if !errors.Is(fnCause, lock.ErrClosed) || !errors.Is(plain.Err(), lock.ErrClosed) {
			t.Errorf("causes: fn %v, plain lock %v; want ErrClosed", fnCause, plain.Err())
		}
		if err := <-waitErr; !errors.Is(err, lock.ErrClosed) {
			t.Errorf("waiting Acquire: got %v, want ErrClosed", err)
		}
		if err := <-doErr; !errors.Is(err, lock.ErrClosed) {
			t.Errorf("Do: got %v, want ErrClosed", err)
		}
		if !errors.Is(windingDown, lock.ErrHeld) {
			t.Errorf("another Locker's TryAcquire while fn wound down after Close: got %v, want ErrHeld", windingDown)
		}
		for _, k := range []string{"plain", "do"} {
			lk, err := other.TryAcquire(t.Context(), k, nil)
			if err != nil {
				t.Errorf("TryAcquire(%q) after Close: %v, want it released", k, err)
				continue
			}
			lk.Release(t.Context())
		}
		if _, err := l.TryAcquire(t.Context(), "x", nil); !errors.Is(err, lock.ErrClosed) {
			t.Errorf("TryAcquire after Close: got %v, want ErrClosed", err)
		}
		if _, err := l.Holders(t.Context(), "plain"); !errors.Is(err, lock.ErrClosed) {
			t.Errorf("Holders after Close: got %v, want ErrClosed", err)
		}
		if _, err := l.List(t.Context(), ""); !errors.Is(err, lock.ErrClosed) {
			t.Errorf("List after Close: got %v, want ErrClosed", err)
		}
		if err := l.Close(); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}

func TestHoldersListWaitFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		other := newLocker(t, client(t, store), "b", fastOpts())
		// An election key that must not be listed.
		if _, err := c.Acquire(t.Context(), backend.AcquireRequest{Key: "jobs/x", HolderID: "e", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		var held []*lock.Lock
		for _, k := range []string{"jobs/1", "jobs/2", "other/1"} {
			lk, err := l.TryAcquire(t.Context(), k, nil)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, lk)
		}
		recs, err := other.List(t.Context(), "jobs/")
		var keys []string
		for _, r := range recs {
			keys = append(keys, r.Key)
		}
		if err != nil || !slices.Equal(keys, []string{"jobs/1", "jobs/2"}) {
			t.Errorf("List(jobs/): got %v, %v; want [jobs/1 jobs/2]", keys, err)
		}
		if hs, err := other.Holders(t.Context(), "free"); err != nil || len(hs) != 0 {
			t.Errorf("Holders of a free key: got %v, %v; want none", hs, err)
		}
		start := time.Now()
		go func() {
			time.Sleep(2 * time.Second)
			held[0].Release(context.Background())
		}()
		if err := other.WaitFree(t.Context(), "jobs/1"); err != nil {
			t.Errorf("WaitFree: %v", err)
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Errorf("WaitFree returned after %v, want 2s (at the release)", d)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := other.WaitFree(ctx, "jobs/2"); !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitFree on a held key: got %v, want ErrHeld and DeadlineExceeded", err)
		}
		for _, lk := range held[1:] {
			lk.Release(t.Context())
		}
	})
}

// TestStoreRestart: when the store restarts and loses its data, a holder
// learns of the loss within a round trip (its watch breaks, it renews at
// once), not at its next renewal. A waiter finds the key free but cannot
// tell whether the holder knows (see TestStoreRestartHolderCut): it
// acquires a TTL after the restart, when the lost lease has surely expired.
func TestStoreRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		opts := &lock.Options{TTL: 10 * time.Second, Logger: quiet}
		l := newLocker(t, client(t, store), "a", opts)
		waiter := newLocker(t, client(t, store), "b", opts)
		lk, err := l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			lb, err := waiter.Acquire(t.Context(), "k", nil)
			if err != nil {
				t.Errorf("waiter: %v", err)
			} else {
				lb.Release(context.Background())
			}
			got <- time.Now()
		}()
		// Past a quarter of RenewInterval (1.25s), when the Locker's reset
		// watch starts, before the first renewal (5s).
		time.Sleep(2 * time.Second)
		store.Restart(nil)
		at := time.Now()
		<-lk.Done()
		if d := time.Since(at); d != 0 {
			t.Errorf("lock lost %v after the restart, want at once (the next renewal is due 3s later)", d)
		}
		if !errors.Is(lk.Err(), lock.ErrLockLost) || !errors.Is(lk.Err(), backend.ErrLeaseLost) {
			t.Errorf("cause: got %v, want ErrLockLost (the store no longer holds it)", lk.Err())
		}
		if took := (<-got).Sub(at); took < opts.TTL || took > opts.TTL+100*time.Millisecond {
			t.Errorf("waiter acquired %v after the restart, want a TTL (%v) later", took, opts.TTL)
		}
		if err := lk.Release(t.Context()); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("Release after the restart: got %v, want ErrLockLost", err)
		}
	})
}

// TestStoreRestartHolderCut: the store restarts and loses its data while
// the holder cannot reach it (partitioned), so nothing tells the holder
// that its lock is gone: it holds it until its renew deadline. The waiter's
// watch breaks; it finds the key free, and waits a TTL from the restart
// before it acquires: never two holders at once. Then a release hands
// over at once again.
func TestStoreRestartHolderCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		opts := fastOpts()
		ca := client(t, store)
		l := newLocker(t, ca, "a", opts)
		waiter := newLocker(t, client(t, store), "b", opts)
		lk, err := l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *lock.Lock, 1)
		go func() {
			lb, err := waiter.Acquire(t.Context(), "k", nil)
			if err != nil {
				t.Errorf("waiter: %v", err)
			}
			got <- lb
		}()
		time.Sleep(500 * time.Millisecond)
		ca.Partition()
		store.Restart(nil)
		at := time.Now()
		lb := <-got // virtual time stands still until the holder is checked
		if lk.Held() {
			t.Fatalf("the waiter acquired %v after the restart while the cut holder still held the lock", time.Since(at))
		}
		if took := time.Since(at); took < opts.TTL {
			t.Errorf("waiter acquired %v after the restart, want no acquisition of the free key before a TTL (%v)", took, opts.TTL)
		}
		ca.Heal()
		if err := lb.Release(t.Context()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		released := time.Now()
		lc, err := l.Acquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatalf("Acquire after the release: %v", err)
		}
		if d := time.Since(released); d > 10*time.Millisecond {
			t.Errorf("Acquire after a release: %v, want at once", d)
		}
		lc.Release(t.Context())
	})
}

// TestBoundedState: once every lock is released and the Lockers are closed,
// the store holds nothing for them: no lease, no watch.
func TestBoundedState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, err := lock.New(client(t, store), "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		b, err := lock.New(client(t, store), "b", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		for i := range 20 {
			k := lock.Key("job", fmt.Sprint(i))
			lk, err := a.TryAcquire(t.Context(), k, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			b.Acquire(ctx, k, nil) // gives up: one watch opened and closed
			cancel()
			if i%2 == 0 {
				lk.Release(t.Context())
			}
		}
		a.Close() // releases the other half
		b.Close()
		synctest.Wait()
		if n := store.Len(); n != 0 {
			t.Errorf("store.Len after Close: got %d keys, want 0", n)
		}
	})
}

// TestPerLockTTL: AcquireOptions.TTL sets the lease's TTL and scales the
// renew deadline with it.
func TestPerLockTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts()) // TTL 1s, deadline 700ms
		t0 := time.Now()
		lk, err := l.TryAcquire(t.Context(), "k", &lock.AcquireOptions{TTL: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if d := lk.Deadline().Sub(t0); d != 3500*time.Millisecond {
			t.Errorf("deadline: got %v after acquiring, want 3.5s (7/10 of the lock's TTL)", d)
		}
		if rec := lk.Record(); rec.TTL != 5*time.Second {
			t.Errorf("record TTL: got %v, want 5s", rec.TTL)
		}
		time.Sleep(2500 * time.Millisecond) // renewed every second (RenewInterval scaled to 1s)
		c.Partition()
		dl := lk.Deadline()
		if lastRenewal := dl.Add(-3500 * time.Millisecond); time.Since(lastRenewal) > time.Second || lastRenewal.Before(t0.Add(time.Second)) {
			t.Errorf("deadline %v after acquiring: the last renewal was not within the last second", dl.Sub(t0))
		}
		<-lk.Done()
		if !time.Now().Equal(dl) {
			t.Errorf("lost %v after the deadline, want at it", time.Since(dl))
		}
		c.Heal()
		lk.Release(t.Context())
	})
}

// TestHungStore: a waiter whose calls (watch included) hang keeps trying,
// each call bounded by RequestTimeout, and acquires once the store answers.
func TestHungStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		c.Hang()
		got := make(chan error, 1)
		go func() {
			lk, err := l.Acquire(t.Context(), "k", nil)
			if err == nil {
				lk.Release(context.Background())
			}
			got <- err
		}()
		time.Sleep(5 * time.Second)
		select {
		case err := <-got:
			t.Fatalf("Acquire returned %v while the store hung", err)
		default:
		}
		healed := time.Now()
		c.Heal()
		if err := <-got; err != nil {
			t.Fatalf("Acquire after Heal: %v", err)
		}
		// Calls in flight when Heal came proceed; at worst the next attempt
		// comes after one backoff (at most RenewInterval).
		if d := time.Since(healed); d > 200*time.Millisecond {
			t.Errorf("acquired %v after Heal, want within RenewInterval (200ms)", d)
		}
	})
}

// noWatch hides the memory client's Watch: a backend that cannot watch.
type noWatch struct{ backend.Backend }

// TestAcquireWithoutWatch: over a backend that cannot watch, a waiter
// re-checks when the holder's lease would expire (its remaining TTL plus a
// small margin), not by polling.
func TestAcquireWithoutWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		opts := &lock.Options{TTL: 10 * time.Second, Logger: quiet}
		alice := newLocker(t, client(t, store), "alice", opts)
		bc := client(t, store)
		bob := newLocker(t, noWatch{bc}, "bob", opts)
		la, err := alice.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		var he *lock.HeldError
		if _, err := bob.TryAcquire(t.Context(), "k", nil); !errors.As(err, &he) {
			t.Fatalf("TryAcquire: got %v, want a HeldError", err)
		}
		left := he.Holder.TTL // what bob's first attempt below sees too
		bc.ResetCalls()
		t0 := time.Now()
		go func() {
			time.Sleep(3 * time.Second)
			la.Release(context.Background())
		}()
		lb, err := bob.Acquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer lb.Release(t.Context())
		if d := time.Since(t0); d != left+5*time.Millisecond {
			t.Errorf("bob acquired after %v, want %v (the TTL left at his attempt + 5ms)", d, left+5*time.Millisecond)
		}
		if n := bc.Calls()["Acquire"]; n != 2 {
			t.Errorf("bob's Acquire calls: got %d, want 2", n)
		}
	})
}

// TestDoPanics: a panicking function still releases its lock; the panic
// reaches Do's caller.
func TestDoPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		other := newLocker(t, client(t, store), "b", fastOpts())
		func() {
			defer func() {
				if r := recover(); r != "boom" {
					t.Errorf("recovered %v, want boom", r)
				}
			}()
			l.Do(t.Context(), "k", nil, func(context.Context, *lock.Lock) error { panic("boom") })
		}()
		lk, err := other.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatalf("TryAcquire after the panic: %v, want the lock released", err)
		}
		lk.Release(t.Context())
	})
}

// Two Lockers configured with the same ID (two processes on one host): the
// second is refused like anyone else, closing it leaves the first's lock
// held, and a store restart that loses the lock is noticed by its holder.
func TestSameIDTwin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a := newLocker(t, client(t, store), "host-1", fastOpts())
		twin, err := lock.New(client(t, store), "host-1", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		lk, err := a.TryAcquire(t.Context(), "job", nil)
		if err != nil {
			t.Fatal(err)
		}
		var he *lock.HeldError
		if _, err := twin.TryAcquire(t.Context(), "job", nil); !errors.As(err, &he) || he.Holder.Token != lk.Record().Token {
			t.Fatalf("twin's TryAcquire: got %v, want ErrHeld naming the first Locker's lease", err)
		}
		twin.Close()
		time.Sleep(5 * time.Second)
		if !lk.Held() {
			t.Fatal("the lock was lost after the same-ID twin closed")
		}
		if err := lk.Verify(t.Context()); err != nil {
			t.Fatalf("Verify after the twin closed: %v", err)
		}
		store.Restart(nil) // a restart without persistence loses the lock
		<-lk.Done()
		if !errors.Is(lk.Err(), lock.ErrLockLost) {
			t.Errorf("cause after the store lost the lock: got %v, want ErrLockLost", lk.Err())
		}
		if err := lk.Release(t.Context()); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("Release after data loss: got %v, want ErrLockLost", err)
		}
	})
}

// stalledReads wraps a memory client whose Holders and List answer only
// when their context ends.
type stalledReads struct{ *memorybackend.Backend }

func (s stalledReads) Holders(ctx context.Context, key string) ([]backend.Record, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func (s stalledReads) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// Holders and List end at the Locker's RequestTimeout when the store does
// not answer, even with a context that never ends.
func TestHoldersListRequestTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := client(t, memorybackend.NewStore())
		l := newLocker(t, stalledReads{c}, "a", fastOpts())
		timeout := l.Options().RequestTimeout
		for name, call := range map[string]func() error{
			"Holders": func() error { _, err := l.Holders(context.Background(), "k"); return err },
			"List":    func() error { _, err := l.List(context.Background(), ""); return err },
		} {
			start := time.Now()
			err := call()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s on a store that does not answer: got %v, want context.DeadlineExceeded", name, err)
			}
			if took := time.Since(start); took != timeout {
				t.Errorf("%s returned after %v, want the RequestTimeout %v", name, took, timeout)
			}
		}
	})
}
