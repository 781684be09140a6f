package lock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestStartedDuringShortOutageAcquiresOnceBack: a waiter that started
// while the store was down never heard from it, so it knows of no lease the
// store could have lost: its failed attempts start no wait, and it takes
// the free key as soon as the store is back, not a TTL later.
func TestStartedDuringShortOutageAcquiresOnceBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		cw := client(t, store)
		w := newLocker(t, cw, "w", fastOpts())
		cw.Partition()
		got := acquireAsync(t.Context(), w, "k", nil)
		time.Sleep(300 * time.Millisecond) // less than a TTL
		cw.Heal()
		healed := time.Now()
		a := <-got
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		// The next attempt comes within a backoff (at most the renew
		// interval, 200 ms); a wait would last until a TTL after the first
		// failure (700 ms after the store is back).
		if d := a.at.Sub(healed); d > 400*time.Millisecond {
			t.Errorf("acquired %v after the store came back, want within 400 ms (no wait: the waiter never heard from the store)", d)
		}
	})
}

// TestLongOutageWaitRunsFromFirstFailure: a waiter is cut off from the
// store for three TTLs, its attempts failing all along, and the holder
// releases meanwhile. The wait starts at the first failure of the run, not
// at each: once the store answers again, the waiter takes the free key at
// its next attempt rather than a TTL after its last failure.
func TestLongOutageWaitRunsFromFirstFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		h := newLocker(t, client(t, store), "h", o)
		cw := client(t, store)
		w := newLocker(t, cw, "w", o)
		lk, err := h.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(t.Context(), w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		cw.Partition()
		time.Sleep(500 * time.Millisecond)
		if err := lk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3*o.TTL - 500*time.Millisecond)
		cw.Heal()
		healed := time.Now()
		a := <-got
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		if d := a.at.Sub(healed); d > 400*time.Millisecond {
			t.Errorf("acquired %v after the store answered again, want within 400 ms (the wait began at the first failure, 3 TTLs ago)", d)
		}
	})
}

// TestStoreRestartDataKeptHandsOverAtOnce: the store restarts with its
// data (the waiter's watch breaks, the holder's lease is kept). The
// waiter's read finds the lease it saw before: nothing was lost, so it does
// not wait a TTL, and a release right after the restart hands over at once.
func TestStoreRestartDataKeptHandsOverAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		h := newLocker(t, client(t, store), "h", o)
		w := newLocker(t, client(t, store), "w", o)
		lk, err := h.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(t.Context(), w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		store.Restart(&memorybackend.RestartOptions{KeepLeases: true})
		time.Sleep(50 * time.Millisecond)
		if !lk.Held() {
			t.Fatal("the holder lost its lock in a restart that kept the data")
		}
		if err := lk.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		a := <-got
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		if d := a.at.Sub(released); d > 10*time.Millisecond {
			t.Errorf("acquired %v after the release, want at once (the restart kept the data)", d)
		}
	})
}

// TestSecondResetDuringWaitRestartsIt: the store restarts without its data
// (the holder cut off), and while the waiter waits a TTL another caller
// takes the free key; then the store restarts again, losing that lease
// too, with its holder cut off. The second reset starts the wait over: the
// waiter never holds the lock beside the second holder, and takes it a TTL
// after the second restart.
func TestSecondResetDuringWaitRestartsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		ca, cc := client(t, store), client(t, store)
		h := newLocker(t, ca, "h", o)
		c := newLocker(t, cc, "c", o)
		w := newLocker(t, client(t, store), "w", o)
		lk, err := h.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(t.Context(), w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		ca.Partition()
		store.Restart(nil)
		time.Sleep(100 * time.Millisecond)
		lc, err := c.TryAcquire(t.Context(), "k", nil) // it never heard of h's lease
		if err != nil {
			t.Fatal(err)
		}
		// After c's renewal at 500 ms its deadline is 1.2 s after the first
		// restart: past the end of the first wait (1 s).
		time.Sleep(450 * time.Millisecond)
		cc.Partition()
		second := time.Now()
		store.Restart(nil)
		a := <-got
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		if lc.Held() || lk.Held() {
			t.Fatalf("the waiter acquired %v after the second restart while a cut holder still held the lock (c %v, h %v)",
				a.at.Sub(second), lc.Held(), lk.Held())
		}
		if d := a.at.Sub(second); d < o.TTL {
			t.Errorf("acquired %v after the second restart, want no acquisition of the free key before a TTL (%v)", d, o.TTL)
		}
	})
}

// TestWaitEndsJustAfterTheTTL: a lease renewed as the store went down
// expires a TTL later, and on a store that counts the expiry instant as
// still held (Redis: a key lives while now <= its expiry) an attempt at
// that very instant would find it. So the waiter's wait after a reset ends
// just after a TTL (expiryMargin), not at it, and not much later.
func TestWaitEndsJustAfterTheTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		ca := client(t, store)
		h := newLocker(t, ca, "h", o)
		w := newLocker(t, client(t, store), "w", o)
		if _, err := h.TryAcquire(t.Context(), "k", nil); err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(t.Context(), w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		ca.Partition()
		restart := time.Now()
		store.Restart(nil)
		a := <-got
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		if d := a.at.Sub(restart); d <= o.TTL || d > o.TTL+50*time.Millisecond {
			t.Errorf("acquired %v after the restart, want just after a TTL: in (%v, %v]", d, o.TTL, o.TTL+50*time.Millisecond)
		}
	})
}

// TestGiveUpDuringWaitNamesLastHolder: a waiter that gives up while it
// waits after a reset reports the holder its last read found (one that
// took the key after the restart), not the one it saw before the restart.
func TestGiveUpDuringWaitNamesLastHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		ca := client(t, store)
		h := newLocker(t, ca, "h", o)
		c := newLocker(t, client(t, store), "c", o)
		w := newLocker(t, client(t, store), "w", o)
		if _, err := h.TryAcquire(t.Context(), "k", nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		got := acquireAsync(ctx, w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		ca.Partition()
		store.Restart(nil)
		time.Sleep(100 * time.Millisecond)
		if _, err := c.TryAcquire(t.Context(), "k", nil); err != nil {
			t.Fatal(err)
		}
		a := <-got
		var held *lock.HeldError
		if !errors.As(a.err, &held) || !errors.Is(a.err, context.DeadlineExceeded) {
			t.Fatalf("Acquire: got %v, want a HeldError wrapping context.DeadlineExceeded", a.err)
		}
		if held.Holder.HolderID != "c" {
			t.Errorf("the error names holder %q, want %q (the one the last read found)", held.Holder.HolderID, "c")
		}
	})
}

// getCounter is a memory client that counts its Get calls, and fails
// them while fail is set.
type getCounter struct {
	*memorybackend.Backend
	gets atomic.Int32
	fail atomic.Bool
}

func (g *getCounter) Get(ctx context.Context, key string) (backend.Record, error) {
	g.gets.Add(1)
	if g.fail.Load() {
		return backend.Record{}, errors.New("injected read failure")
	}
	return g.Backend.Get(ctx, key)
}

// TestWaitReadsOnce: a waiter whose watch broke in a restart that lost the
// data (the holder cut off) reads the key once, finds it free, and waits
// out the TTL without reading it again: one read, then the acquisition.
func TestWaitReadsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		ca := client(t, store)
		h := newLocker(t, ca, "h", o)
		cw := &getCounter{Backend: client(t, store)}
		w := newLocker(t, cw, "w", o)
		if _, err := h.TryAcquire(t.Context(), "k", nil); err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(t.Context(), w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		before := cw.gets.Load()
		ca.Partition()
		store.Restart(nil)
		a := <-got
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		if n := cw.gets.Load() - before; n != 1 {
			t.Errorf("the waiter read the key %d times during the wait, want 1", n)
		}
	})
}

// pollingHook wraps a backend, hiding every optional interface (no watch:
// the waiter polls), and runs onAcquire before each Acquire: a non-nil
// error fails the call.
type pollingHook struct {
	backend.Backend
	onAcquire func() error
}

func (h *pollingHook) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	if err := h.onAcquire(); err != nil {
		return backend.Lease{}, err
	}
	return h.Backend.Acquire(ctx, req)
}

// TestFailedAttemptStartsTheWait: a polling waiter's attempt fails because
// the store is restarting; it comes back without its data, with the holder
// cut off from it. The failed attempt is lost contact, as a broken watch
// is: the waiter reads the key instead of acquiring it until a TTL has
// passed since the failure, and never holds the lock beside the cut holder.
func TestFailedAttemptStartsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		ca := client(t, store)
		h := newLocker(t, ca, "h", o)
		var mu sync.Mutex
		var attempts int
		var failed time.Time // guarded by mu
		cw := &pollingHook{Backend: client(t, store), onAcquire: func() error {
			mu.Lock()
			defer mu.Unlock()
			if attempts++; attempts == 2 { // the first found h's lease
				ca.Partition()
				store.Restart(nil)
				failed = time.Now()
				return errors.New("injected: the store is restarting")
			}
			return nil
		}}
		w := newLocker(t, cw, "w", o)
		lk, err := h.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		a := <-acquireAsync(t.Context(), w, "k", nil)
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		mu.Lock()
		f := failed
		mu.Unlock()
		if f.IsZero() {
			t.Fatal("the waiter acquired, but its attempt never failed; the test proves nothing")
		}
		if lk.Held() {
			t.Fatalf("the waiter acquired %v after its failed attempt while the cut holder still held the lock", a.at.Sub(f))
		}
		if d := a.at.Sub(f); d < o.TTL {
			t.Errorf("acquired %v after the failed attempt, want no acquisition of the free key before a TTL (%v)", d, o.TTL)
		}
	})
}

// resubscriber is a memory client whose watches outlive a broken
// subscription, as some backends' do: when the store breaks one, it
// subscribes again and reports an EventReset on the same channel.
type resubscriber struct {
	*memorybackend.Backend
}

func (r *resubscriber) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	in, err := r.Backend.Watch(ctx, key)
	if err != nil {
		return nil, err
	}
	out := make(chan backend.Event)
	go func() {
		defer close(out)
		for {
			for ev := range in {
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
			for {
				if ctx.Err() != nil {
					return
				}
				if in, err = r.Backend.Watch(ctx, key); err == nil {
					break
				}
				select {
				case <-time.After(10 * time.Millisecond):
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- backend.Event{Key: key, Type: backend.EventReset}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// TestEventResetStartsTheWait: on a backend that reports a re-established
// subscription as an EventReset (rather than closing the channel), the
// reset is lost contact as a closed channel is: after a restart that lost
// the data, with the holder cut off, the waiter takes the free key only a
// TTL later, never beside the cut holder.
func TestEventResetStartsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		ca := client(t, store)
		h := newLocker(t, ca, "h", o)
		w := newLocker(t, &resubscriber{client(t, store)}, "w", o)
		lk, err := h.TryAcquire(t.Context(), "k", nil)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(t.Context(), w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		ca.Partition()
		restart := time.Now()
		store.Restart(nil)
		a := <-got
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		if lk.Held() {
			t.Fatalf("the waiter acquired %v after the restart while the cut holder still held the lock", a.at.Sub(restart))
		}
		if d := a.at.Sub(restart); d < o.TTL {
			t.Errorf("acquired %v after the restart, want no acquisition of the free key before a TTL (%v)", d, o.TTL)
		}
	})
}

// TestFailedReadsDuringWaitBackOff: a waiter whose reads fail while it
// waits after a reset retries them with the usual backoff (growing to the
// renew interval), not at a fixed short interval.
func TestFailedReadsDuringWaitBackOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		ca := client(t, store)
		h := newLocker(t, ca, "h", o)
		cw := &getCounter{Backend: client(t, store)}
		w := newLocker(t, cw, "w", o)
		if _, err := h.TryAcquire(t.Context(), "k", nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		got := acquireAsync(ctx, w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		before := cw.gets.Load()
		cw.fail.Store(true)
		ca.Partition()
		store.Restart(nil)
		time.Sleep(900 * time.Millisecond) // within the wait (a TTL)
		// Backoff from 1/8 of the renew interval (25 ms) doubling up to it
		// (200 ms), with jitter: at most 12 reads in 900 ms.
		if n := cw.gets.Load() - before; n < 2 || n > 15 {
			t.Errorf("the waiter read the key %d times in 900 ms of failing reads, want 2 to 15 (a backoff)", n)
		}
		cancel()
		if a := <-got; a.err == nil {
			a.lk.Release(context.Background())
		}
	})
}

// getHook is a memory client whose Get runs onGet first (when set): a
// non-nil error fails the call.
type getHook struct {
	*memorybackend.Backend
	mu    sync.Mutex
	onGet func() error
}

func (g *getHook) Get(ctx context.Context, key string) (backend.Record, error) {
	g.mu.Lock()
	f := g.onGet
	g.mu.Unlock()
	if f != nil {
		if err := f(); err != nil {
			return backend.Record{}, err
		}
	}
	return g.Backend.Get(ctx, key)
}

// TestResetDuringFailedReadAtWaitEnd: the store restarts without its data
// (holder h cut off) and the waiter waits a TTL. Near the end of the wait
// another caller, c, takes the free key; the waiter's read at that change
// fails, slowly, because the store restarts again meanwhile, losing c's
// lease with c cut off, and by the time the read has failed the first wait
// is over. The second restart broke the waiter's watch: the waiter must
// take that reset (or count the failed read as lost contact) before it
// attempts, and so never hold the lock beside c.
func TestResetDuringFailedReadAtWaitEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		o := fastOpts()
		ca, cc := client(t, store), client(t, store)
		h := newLocker(t, ca, "h", o)
		c := newLocker(t, cc, "c", o)
		cw := &getHook{Backend: client(t, store)}
		w := newLocker(t, cw, "w", o)
		if _, err := h.TryAcquire(t.Context(), "k", nil); err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(t.Context(), w, "k", nil)
		time.Sleep(500 * time.Millisecond)
		ca.Partition()
		store.Restart(nil)
		first := time.Now()
		time.Sleep(o.TTL - 10*time.Millisecond)
		var second time.Time
		cw.mu.Lock()
		cw.onGet = func() error {
			cw.mu.Lock()
			cw.onGet = nil // once
			cw.mu.Unlock()
			cc.Partition()
			store.Restart(nil)
			second = time.Now()
			time.Sleep(30 * time.Millisecond) // the read fails after the first wait is over
			return errors.New("injected: the store is restarting")
		}
		cw.mu.Unlock()
		lc, err := c.TryAcquire(t.Context(), "k", nil) // it never heard of h's lease
		if err != nil {
			t.Fatal(err)
		}
		a := <-got
		if a.err != nil {
			t.Fatalf("Acquire: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		if second.IsZero() {
			t.Fatal("the waiter never read the key at c's acquisition; the test proves nothing")
		}
		if lc.Held() {
			t.Fatalf("the waiter acquired %v after the first restart, %v after the second, while c, cut off, still held the lock",
				a.at.Sub(first), a.at.Sub(second))
		}
		if d := a.at.Sub(second); d < o.TTL {
			t.Errorf("acquired %v after the second restart, want no acquisition of the free key before a TTL (%v)", d, o.TTL)
		}
	})
}
