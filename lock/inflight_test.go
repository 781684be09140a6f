package lock_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// heldAcquire is a memory client whose next Acquire, once armed, waits
// until the test lets it go: a call in flight, as a client retrying a
// command on a new connection keeps one across a restart of the store.
type heldAcquire struct {
	*memorybackend.Backend // every optional interface, the watch included
	mu                     sync.Mutex
	entered, proceed       chan struct{}
}

// arm makes the next Acquire close entered when it begins, then wait for
// proceed to close before it reaches the store.
func (h *heldAcquire) arm() (entered, proceed chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entered, h.proceed = make(chan struct{}), make(chan struct{})
	return h.entered, h.proceed
}

func (h *heldAcquire) pass() {
	h.mu.Lock()
	entered, proceed := h.entered, h.proceed
	h.entered, h.proceed = nil, nil
	h.mu.Unlock()
	if entered != nil {
		close(entered)
		<-proceed
	}
}

func (h *heldAcquire) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	h.pass()
	return h.Backend.Acquire(ctx, req)
}

func (h *heldAcquire) AcquireMode(ctx context.Context, req backend.ModeRequest) (backend.Lease, error) {
	h.pass()
	return h.Backend.AcquireMode(ctx, req)
}

// TestAcquisitionInFlightAcrossRestart: a waiter's attempt is in flight
// while the store restarts without its data, and reaches the store after
// the restart, which finds the key free. The holder is cut off, so nothing
// tells it that its lock is gone: it holds it until its renew deadline.
// The waiter's watch broke while its call was in flight, so it gives the
// acquisition up (released, never returned) and waits a TTL like a waiter
// that saw the break before its attempt: never two holders at once. So do
// a Fair waiter and a Shared one, which acquire through backend.Modes.
func TestAcquisitionInFlightAcrossRestart(t *testing.T) {
	for _, tc := range []struct {
		name       string
		holdOpts   *lock.AcquireOptions
		waiterOpts *lock.AcquireOptions
	}{
		{"exclusive", nil, nil},
		{"fair", &lock.AcquireOptions{Fair: true}, &lock.AcquireOptions{Fair: true}},
		{"shared waiter", nil, &lock.AcquireOptions{Mode: lock.Shared}},
	} {
		t.Run(tc.name, func(t *testing.T) { acquisitionInFlightAcrossRestart(t, tc.holdOpts, tc.waiterOpts) })
	}
}

func acquisitionInFlightAcrossRestart(t *testing.T, holdOpts, waiterOpts *lock.AcquireOptions) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		opts := fastOpts()
		ca := client(t, store)
		hb := &heldAcquire{Backend: client(t, store)}
		l := newLocker(t, ca, "a", opts)
		waiter := newLocker(t, hb, "b", opts)
		lk, err := l.TryAcquire(t.Context(), "k", holdOpts)
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAsync(t.Context(), waiter, "k", waiterOpts)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait() // the waiter found the key held and waits
		entered, proceed := hb.arm()
		<-entered // the waiter's next attempt (virtual time passes)
		if !lk.Held() {
			t.Fatal("the holder no longer holds the lock")
		}
		ca.Partition()
		restart := time.Now()
		store.Restart(nil)
		synctest.Wait()
		close(proceed) // the attempt reaches the empty store
		a := <-got
		if a.err != nil {
			t.Fatalf("waiter: %v", a.err)
		}
		defer a.lk.Release(context.Background())
		if took := a.at.Sub(restart); took < opts.TTL {
			t.Errorf("waiter acquired %v after the restart, want no acquisition of the free key before a TTL (%v)", took, opts.TTL)
		}
	})
}
