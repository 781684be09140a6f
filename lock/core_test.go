package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// onLost is a Metrics whose Lost runs f (set before the first loss).
type onLost struct {
	lock.NopMetrics
	f func()
}

func (m *onLost) Lost(string, string) { m.f() }

// TestHeldChecksTheClock: Held, and the owner-checked calls, look at the
// deadline themselves rather than wait for the step-down timer. Two locks
// share a deadline; while the first one's step-down is reported (from the
// timer's callback, which steps them down one after the other), the second
// are past their deadline but not stepped down yet. Locks 0 and 1 are asked
// Held, 2 and 3 SetMetadata (which would step them down first): one of each
// pair is still up when the first loss is reported. Once Held has answered
// false, Err says why, though the timer has not stepped the lock down yet.
func TestHeldChecksTheClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		hook := &onLost{}
		// Renewals every 160ms, retried every 40ms: none is due at the
		// deadline (700ms), where it would step the locks down too, in a
		// goroutine of its own.
		o := &lock.Options{TTL: time.Second, RenewInterval: 160 * time.Millisecond, Logger: quiet, Metrics: hook}
		l := newLocker(t, &batchingMemory{Backend: c}, "a", o) // one timer steps every lock down, in turn
		var locks [4]*lock.Lock
		for i := range locks {
			lk, err := l.TryAcquire(t.Context(), lock.Key("k", string(rune('a'+i))), nil)
			if err != nil {
				t.Fatal(err)
			}
			locks[i] = lk
		}
		var (
			first    atomic.Bool
			held     [2]bool
			errs     [2]error
			metadata [2]error
			at       time.Time
			done     = make(chan struct{})
		)
		hook.f = func() {
			if first.Swap(true) {
				return
			}
			at = time.Now()
			held[0], held[1] = locks[0].Held(), locks[1].Held()
			errs[0], errs[1] = locks[0].Err(), locks[1].Err()
			for i, lk := range locks[2:] {
				metadata[i] = lk.SetMetadata(context.Background(), map[string]string{"late": "yes"})
			}
			close(done)
		}
		c.Partition() // no renewal succeeds: both reach the same deadline
		synctest.Wait()
		time.Sleep(time.Second)
		select {
		case <-done:
		default:
			t.Fatal("no loss reported within 1s")
		}
		for i := range 2 {
			if held[i] {
				t.Errorf("lock %d: Held at %v, past its deadline %v: got true, want false", i, at, locks[i].Deadline())
			}
			if !errors.Is(errs[i], lock.ErrLockLost) {
				t.Errorf("lock %d: Err right after Held answered false: got %v, want ErrLockLost", i, errs[i])
			}
			if !errors.Is(metadata[i], lock.ErrLockLost) {
				t.Errorf("lock %d: SetMetadata past its deadline: got %v, want ErrLockLost", i+2, metadata[i])
			}
		}
		c.Heal()
	})
}

// TestSetMetadataAfterLoss: SetMetadata on a lock past its deadline fails
// with ErrLockLost and changes nothing, though the store still keeps the
// lease (until its TTL); after Release it reports ErrReleased.
func TestSetMetadataAfterLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		lk, err := l.TryAcquire(t.Context(), "k", &lock.AcquireOptions{NoRenew: true, Metadata: map[string]string{"v": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(800 * time.Millisecond) // past the deadline (700ms), before the TTL (1s)
		if err := lk.SetMetadata(t.Context(), map[string]string{"v": "2"}); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("SetMetadata past the deadline: got %v, want ErrLockLost", err)
		}
		if hs, err := l.Holders(t.Context(), "k"); err != nil || len(hs) != 1 || hs[0].Metadata["v"] != "1" {
			t.Errorf("Holders: got %+v, %v; want the lease with v=1", hs, err)
		}
		lk.Release(t.Context())

		lk, err = l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		lk.Release(t.Context())
		if err := lk.SetMetadata(t.Context(), map[string]string{"v": "2"}); !errors.Is(err, lock.ErrReleased) {
			t.Errorf("SetMetadata after Release: got %v, want ErrReleased", err)
		}
	})
}

// TestStoreLostLease: Verify, SetMetadata, Extend and Release of a lock
// whose lease the store lost (a restart without persistence) report
// ErrLockLost.
func TestStoreLostLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		ops := []struct {
			name string
			f    func(*lock.Lock) error
		}{
			{"Verify", func(lk *lock.Lock) error { return lk.Verify(t.Context()) }},
			{"SetMetadata", func(lk *lock.Lock) error { return lk.SetMetadata(t.Context(), map[string]string{"v": "2"}) }},
			{"Extend", func(lk *lock.Lock) error { return lk.Extend(t.Context()) }},
			{"Release", func(lk *lock.Lock) error { return lk.Release(t.Context()) }},
		}
		locks := make([]*lock.Lock, len(ops))
		for i := range ops {
			var err error
			if locks[i], err = l.TryAcquire(t.Context(), lock.Key("k", ops[i].name), nil); err != nil {
				t.Fatal(err)
			}
		}
		store.Restart(nil)
		for i, op := range ops {
			if err := op.f(locks[i]); !errors.Is(err, lock.ErrLockLost) {
				t.Errorf("%s after the store lost the lease: got %v, want ErrLockLost", op.name, err)
			}
			if locks[i].Held() {
				t.Errorf("%s after the store lost the lease: Held true, want false", op.name)
			}
			locks[i].Release(t.Context())
		}
	})
}

// TestLocalWakeWithoutWatch: on a backend that cannot watch, goroutines
// waiting in Acquire for a key their own Locker holds acquire it, in turn,
// as soon as that Locker releases it, not at the lease's expiry.
func TestLocalWakeWithoutWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, noWatch{client(t, store)}, "a", &lock.Options{TTL: 10 * time.Second, Logger: quiet})
		lk, err := l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		var waiters [2]<-chan acquired
		for i := range waiters {
			waiters[i] = acquireAsync(t.Context(), l, "k", nil)
			synctest.Wait() // queued in this order
		}
		for i, ch := range waiters {
			time.Sleep(time.Second)
			released := time.Now()
			if err := lk.Release(t.Context()); err != nil {
				t.Fatal(err)
			}
			a := <-ch
			if a.err != nil {
				t.Fatalf("waiter %d: Acquire: %v", i, a.err)
			}
			if d := a.at.Sub(released); d != 0 {
				t.Errorf("waiter %d: Acquire returned %v after the local release, want at once", i, d)
			}
			lk = a.lk
		}
		lk.Release(t.Context())
	})
}

// TestGiveUpNamesNoStaleHolder: an Acquire that never reached the store
// gives up with the backend's error, not with a holder an earlier wait of
// the same Locker saw.
func TestGiveUpNamesNoStaleHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		bob := newLocker(t, client(t, store), "bob", fastOpts())
		lb, err := bob.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err = l.Acquire(ctx, "k", nil)
		cancel()
		var held *lock.HeldError
		if !errors.As(err, &held) || held.Holder.HolderID != "bob" {
			t.Fatalf("first Acquire: got %v, want a HeldError naming bob", err)
		}
		lb.Release(t.Context())
		c.Partition()
		ctx, cancel = context.WithTimeout(t.Context(), time.Second)
		_, err = l.Acquire(ctx, "k", nil)
		cancel()
		if errors.Is(err, lock.ErrHeld) || !errors.Is(err, memorybackend.ErrPartitioned) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Acquire with the store unreachable: got %v, want DeadlineExceeded and ErrPartitioned, not ErrHeld", err)
		}
		c.Heal()
	})
}

// TestConcurrentCloseWaits: a second Close, called while the first waits
// for a Do function to wind down, returns only once the first has
// finished.
func TestConcurrentCloseWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l, err := lock.New(client(t, store), "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		inDo := make(chan struct{})
		var fnReturned time.Time
		doErr := make(chan error)
		go func() {
			doErr <- l.Do(t.Context(), "k", nil, func(ctx context.Context, _ *lock.Lock) error {
				close(inDo)
				<-ctx.Done()
				time.Sleep(2 * time.Second) // winding down
				fnReturned = time.Now()
				return nil
			})
		}()
		<-inDo
		firstDone := make(chan time.Time)
		go func() {
			l.Close()
			firstDone <- time.Now()
		}()
		synctest.Wait() // the first Close waits for fn
		l.Close()
		second := time.Now()
		first := <-firstDone
		<-doErr
		if !second.Equal(fnReturned) || !first.Equal(fnReturned) {
			t.Errorf("Close calls returned at %v and %v, want both when fn returned (%v)", first, second, fnReturned)
		}
	})
}

// TestRequestTimeoutDefault: the default RequestTimeout is a fifth of the
// TTL, at most RenewInterval.
func TestRequestTimeoutDefault(t *testing.T) {
	b := memorybackend.New()
	defer b.Close()
	for _, tc := range []struct {
		o    lock.Options
		want time.Duration
	}{
		{lock.Options{TTL: 10 * time.Second}, 2 * time.Second},
		{lock.Options{TTL: 10 * time.Second, RenewInterval: time.Second}, time.Second},
	} {
		l, err := lock.New(b, "a", &tc.o)
		if err != nil {
			t.Fatal(err)
		}
		if got := l.Options().RequestTimeout; got != tc.want {
			t.Errorf("RequestTimeout with TTL %v, RenewInterval %v: got %v, want %v", tc.o.TTL, tc.o.RenewInterval, got, tc.want)
		}
		l.Close()
	}
}

// resetting is a memory client whose watches deliver an EventReset on
// demand, as a backend does whose connection to the store broke and came
// back.
type resetting struct {
	*memorybackend.Backend
	mu   sync.Mutex
	subs map[chan struct{}]struct{} // one per live subscription
}

func (b *resetting) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	in, err := b.Backend.Watch(ctx, key)
	if err != nil {
		return nil, err
	}
	out, reset := make(chan backend.Event, 8), make(chan struct{}, 1)
	b.mu.Lock()
	b.subs[reset] = struct{}{}
	b.mu.Unlock()
	go func() {
		defer close(out)
		defer func() {
			b.mu.Lock()
			delete(b.subs, reset)
			b.mu.Unlock()
		}()
		for {
			var ev backend.Event
			select {
			case e, ok := <-in:
				if !ok {
					return
				}
				ev = e
			case <-reset:
				ev = backend.Event{Key: key, Type: backend.EventReset}
			}
			select {
			case out <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// reset sends an EventReset on every live subscription.
func (b *resetting) reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for r := range b.subs {
		select {
		case r <- struct{}{}:
		default:
		}
	}
}

// TestResetEventRenews: an EventReset on the Locker's watch (the store may
// have restarted) renews every held lock at once, not at its next renewal.
func TestResetEventRenews(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		b := &resetting{Backend: c, subs: make(map[chan struct{}]struct{})}
		l := newLocker(t, b, "a", fastOpts())
		lk, err := l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(t.Context())
		time.Sleep(100 * time.Millisecond) // the watch runs from +50ms; the next renewal is at +200ms
		synctest.Wait()
		c.ResetCalls()
		b.reset()
		synctest.Wait()
		if n := c.Calls()["Renew"]; n != 1 {
			t.Errorf("renewals right after an EventReset: got %d, want 1", n)
		}
		if want := time.Now().Add(700 * time.Millisecond); !lk.Deadline().Equal(want) {
			t.Errorf("deadline after the EventReset: got %v, want %v (renewed now)", lk.Deadline(), want)
		}
	})
}

// TestMetadataIsCopied: the lock keeps its own copy of the metadata given
// at acquisition and to SetMetadata, and Record returns a copy: changing
// those maps afterwards changes neither the lock's record nor the store's.
func TestMetadataIsCopied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		md := map[string]string{"v": "1"}
		lk, err := l.TryAcquire(t.Context(), "k", &lock.AcquireOptions{Metadata: md})
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(t.Context())
		md["v"] = "changed"
		lk.Record().Metadata["v"] = "changed"
		if got := lk.Record().Metadata["v"]; got != "1" {
			t.Errorf("Record().Metadata[v] after the caller changed its maps: got %q, want %q", got, "1")
		}
		set := map[string]string{"v": "2"}
		if err := lk.SetMetadata(t.Context(), set); err != nil {
			t.Fatal(err)
		}
		set["v"] = "changed"
		if got := lk.Record().Metadata["v"]; got != "2" {
			t.Errorf("Record().Metadata[v] after the caller changed the map given to SetMetadata: got %q, want %q", got, "2")
		}
		if hs, err := l.Holders(t.Context(), "k"); err != nil || len(hs) != 1 || hs[0].Metadata["v"] != "2" {
			t.Errorf("Holders: got %+v, %v; want one record with v=2", hs, err)
		}
	})
}

// TestHeldErrorYieldedToWaiters: an attempt refused only because of
// waiters registered before it gives a HeldError with Waiting set, no
// conflicting Holders, and Holder the key's oldest holder.
func TestHeldErrorYieldedToWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		r1 := newLocker(t, client(t, store), "r1", fastOpts())
		r2 := newLocker(t, client(t, store), "r2", fastOpts())
		w := newLocker(t, client(t, store), "w", fastOpts())
		l1, err := r1.TryAcquire(t.Context(), "k", &lock.AcquireOptions{Mode: lock.Shared})
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(t.Context())
		ch := acquireAsync(wctx, w, "k", nil) // registers: writer preference
		synctest.Wait()
		_, err = r2.TryAcquire(t.Context(), "k", &lock.AcquireOptions{Mode: lock.Shared})
		he := heldBy(t, "r2 Shared while a writer waits", err)
		if he.Waiting != 1 || len(he.Holders) != 0 || he.Holder.HolderID != "r1" || he.Holder.Key != "k" {
			t.Errorf("HeldError: got Waiting %d, Holders %v, Holder %q@%q; want 1, none, r1@k", he.Waiting, holderIDs(he.Holders), he.Holder.HolderID, he.Holder.Key)
		}
		cancel()
		<-ch
		l1.Release(t.Context())
	})
}

// TestDoNilFunction: Do and TryDo refuse a nil function with
// ErrInvalidOptions, before taking the lock.
func TestDoNilFunction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		for name, do := range map[string]func(context.Context, string, *lock.AcquireOptions, func(context.Context, *lock.Lock) error) error{
			"Do": l.Do, "TryDo": l.TryDo,
		} {
			if err := do(t.Context(), "k", nil, nil); !errors.Is(err, lock.ErrInvalidOptions) {
				t.Errorf("%s(nil function): got %v, want ErrInvalidOptions", name, err)
			}
			if hs, err := l.Holders(t.Context(), "k"); err != nil || len(hs) != 0 {
				t.Errorf("Holders after %s(nil function): got %v, %v; want none", name, holderIDs(hs), err)
			}
		}
	})
}

// TestAcquireQueuedGivesUp: a goroutine queued behind another of its
// Locker's waiters for the same key gives up when its context ends, with
// the holder the head saw, not when its turn comes.
func TestAcquireQueuedGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "a", fastOpts())
		lk, err := l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		head := acquireAsync(t.Context(), l, "k", nil)
		synctest.Wait()
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		second := acquireAsync(ctx, l, "k", nil)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		select {
		case a := <-second:
			if d := a.at.Sub(start); d != time.Second || !errors.Is(a.err, lock.ErrHeld) || !errors.Is(a.err, context.DeadlineExceeded) {
				t.Errorf("queued Acquire: got %v after %v, want a HeldError matching DeadlineExceeded after 1s", a.err, d)
			}
		default:
			t.Error("queued Acquire still waits 1s after its context ended")
		}
		lk.Release(t.Context())
		a := <-head
		if a.err != nil {
			t.Fatalf("head Acquire: %v", a.err)
		}
		a.lk.Release(t.Context())
	})
}

// failingAcquire is a memory client whose acquisitions fail with err.
type failingAcquire struct {
	*memorybackend.Backend
	err error
}

func (b failingAcquire) Acquire(context.Context, backend.AcquireRequest) (backend.Lease, error) {
	return backend.Lease{}, b.err
}

// TestAcquireFailsAtOnce: Acquire returns at once, without waiting for its
// context, on errors no retry can fix: an invalid request, a closed client,
// a Limit that differs from the live holders'.
func TestAcquireFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		closed := store.Client()
		closed.Close()
		holder := newLocker(t, client(t, store), "holder", fastOpts())
		lk, err := holder.TryAcquire(t.Context(), "sem", &lock.AcquireOptions{Mode: lock.Shared, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Release(t.Context())
		for _, tc := range []struct {
			name string
			b    backend.Backend
			key  string
			opts *lock.AcquireOptions
			want error
		}{
			{"invalid", failingAcquire{client(t, store), fmt.Errorf("%w: metadata too large", backend.ErrInvalid)}, "k", nil, backend.ErrInvalid},
			{"closed client", closed, "k", nil, backend.ErrClosed},
			{"limit mismatch", client(t, store), "sem", &lock.AcquireOptions{Mode: lock.Shared, Limit: 3}, lock.ErrLimitMismatch},
		} {
			l := newLocker(t, tc.b, "a", fastOpts())
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			start := time.Now()
			_, err := l.Acquire(ctx, tc.key, tc.opts)
			cancel()
			if d := time.Since(start); d != 0 || !errors.Is(err, tc.want) {
				t.Errorf("%s: Acquire returned %v after %v, want %v at once", tc.name, err, d, tc.want)
			}
		}
	})
}

// TestWaitFreeWithoutWatch: on a backend that cannot watch, WaitFree
// re-checks when the holder's lease would expire, and returns then.
func TestWaitFreeWithoutWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		opts := &lock.Options{TTL: 10 * time.Second, Logger: quiet}
		alice := newLocker(t, client(t, store), "alice", opts)
		bob := newLocker(t, noWatch{client(t, store)}, "bob", opts)
		la, err := alice.TryAcquire(t.Context(), "k", &lock.AcquireOptions{NoRenew: true})
		if err != nil {
			t.Fatal(err)
		}
		defer la.Release(t.Context())
		time.Sleep(time.Second)
		start := time.Now()
		if err := bob.WaitFree(t.Context(), "k"); err != nil {
			t.Fatalf("WaitFree: %v", err)
		}
		if d, want := time.Since(start), 9*time.Second+5*time.Millisecond; d != want {
			t.Errorf("WaitFree returned after %v, want %v (the TTL left + 5ms)", d, want)
		}
	})
}

// TestVerifyOutlastingTheDeadline: a Verify whose read is still unanswered
// when the lock's deadline passes reports the loss (ErrLockLost), not only
// the failed read.
func TestVerifyOutlastingTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		lk, err := l.TryAcquire(t.Context(), "k", &lock.AcquireOptions{NoRenew: true})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond) // the deadline is at 700ms
		c.Hang()
		if err := lk.Verify(t.Context()); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("Verify cut by RequestTimeout after the deadline: got %v, want ErrLockLost", err)
		}
		c.Heal()
		lk.Release(t.Context())
	})
}

// TestCloseEndsCancellableTryAcquire: Close ends a TryAcquire in flight
// whose context can be cancelled (it is not bounded by the Locker's shared
// contexts) at once, with ErrClosed. Close used to cancel such a call before
// it marked the Locker closed for it, so the call could return its context's
// error instead (about once in a hundred runs with -race): the loop makes
// that show.
func TestCloseEndsCancellableTryAcquire(t *testing.T) {
	for i := range 300 {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			c := client(t, store)
			l, err := lock.New(c, "a", &lock.Options{TTL: 10 * time.Second, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			c.Hang()
			done := make(chan error, 1)
			go func() {
				_, err := l.TryAcquire(t.Context(), "k", nil)
				done <- err
			}()
			time.Sleep(50 * time.Millisecond)
			start := time.Now()
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; !errors.Is(err, lock.ErrClosed) {
				t.Fatalf("run %d: TryAcquire in flight at Close: got %v, want ErrClosed", i, err)
			}
			if d := time.Since(start); d != 0 {
				t.Fatalf("run %d: Close took %v with a TryAcquire in flight, want at once (not its 2s RequestTimeout)", i, d)
			}
			c.Heal()
		})
		if t.Failed() {
			return
		}
	}
}

// TestCloseRightAfterAcquire: Close, called before the Locker's watch of
// held locks has started, returns at once rather than waiting for the
// timer that would start it.
func TestCloseRightAfterAcquire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l, err := lock.New(client(t, store), "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.TryAcquire(t.Context(), "k", nil); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		l.Close()
		if d := time.Since(start); d != 0 {
			t.Errorf("Close took %v, want at once", d)
		}
	})
}

// TestDeadlineCauseCarriesTheError: a lock lost at its deadline because
// its renewals failed has a context cause, and a Release result, that
// match ErrLockLost and the renewals' error.
func TestDeadlineCauseCarriesTheError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		lk, err := l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Partition()
		<-lk.Done()
		if cause := context.Cause(lk.Context()); !errors.Is(cause, lock.ErrLockLost) || !errors.Is(cause, memorybackend.ErrPartitioned) {
			t.Errorf("cause: got %v, want ErrLockLost and ErrPartitioned", cause)
		}
		if err := lk.Release(t.Context()); !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, memorybackend.ErrPartitioned) {
			t.Errorf("Release: got %v, want ErrLockLost and ErrPartitioned", err)
		}
		c.Heal()
	})
}

// TestWaitWithoutWatchRechecksEveryTTL: on a backend that cannot watch, a
// waiter re-checks at least once per its own TTL, even when the holder's
// lease has much longer left, so an early release is seen within a TTL.
func TestWaitWithoutWatchRechecksEveryTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		alice := newLocker(t, client(t, store), "alice", &lock.Options{TTL: 10 * time.Second, Logger: quiet})
		bob := newLocker(t, noWatch{client(t, store)}, "bob", fastOpts()) // TTL 1s
		la, err := alice.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		go func() {
			time.Sleep(2500 * time.Millisecond)
			la.Release(context.Background())
		}()
		lb, err := bob.Acquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer lb.Release(t.Context())
		if d := time.Since(start); d != 3*time.Second {
			t.Errorf("bob acquired after %v, want 3s (his first re-check after the release at 2.5s)", d)
		}
	})
}

// TestReleaseOfLostLockReportsFailedRelease: releasing a lock lost at its
// deadline while the store does not answer reports both the loss and the
// failed release.
func TestReleaseOfLostLockReportsFailedRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := client(t, store)
		l := newLocker(t, c, "a", fastOpts())
		lk, err := l.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Partition()
		<-lk.Done()
		c.Heal()
		c.Hang()
		if err := lk.Release(t.Context()); !errors.Is(err, lock.ErrLockLost) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Release of a lost lock on a hung store: got %v, want ErrLockLost and the release's DeadlineExceeded", err)
		}
		c.Heal()
	})
}

// TestReleasedMetricOnce: a lock released twice (Release is idempotent) is
// reported to Metrics.Released once.
func TestReleasedMetricOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		m := &recMetrics{}
		o := fastOpts()
		o.Metrics = m
		l := newLocker(t, client(t, store), "a", o)
		lk, err := l.TryAcquire(t.Context(), "tally/1", nil)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		lk.Release(t.Context())
		lk.Release(t.Context())
		m.mu.Lock()
		defer m.mu.Unlock()
		if len(m.released) != 1 || m.held[0] != time.Second {
			t.Errorf("Released reports: got %v (held %v), want one, held 1s", m.released, m.held)
		}
	})
}
