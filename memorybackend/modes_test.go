package memorybackend_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func modeReq(key, id string, m backend.Mode, ttl time.Duration) backend.ModeRequest {
	return backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: key, HolderID: id, TTL: ttl}, Mode: m}
}

func acquireMode(t *testing.T, b *memorybackend.Backend, r backend.ModeRequest) backend.Lease {
	t.Helper()
	l, err := b.AcquireMode(t.Context(), r)
	if err != nil {
		t.Fatalf("AcquireMode(%v %q by %q): got error %v, want nil", r.Mode, r.Key, r.HolderID, err)
	}
	return l
}

// An entry's expiry is delivered by its key's timer, to the watchers of the
// key and of its ancestors, at the entry's own expiry time; the store then
// forgets every key the entry touched without anybody calling it.
func TestModesEntryExpiryInVirtualTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, w := store.Client(), store.Client()
		defer a.Close()
		defer w.Close()
		ctx := t.Context()
		r := modeReq("lock/a/b", "a", backend.Exclusive, time.Second)
		r.Ancestors = []string{"lock/a"}
		l := acquireMode(t, a, r)
		long := modeReq("lock/a/c", "c", backend.Shared, time.Hour)
		long.Ancestors = []string{"lock/a"}
		lc := acquireMode(t, a, long)
		wctx, cancel := context.WithCancel(ctx)
		onKey, err := w.Watch(wctx, "lock/a/b")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		onAncestor, err := w.Watch(wctx, "lock/a")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		if got := pending(onKey); len(got) != 0 {
			t.Fatalf("events before expiry: got %v, want none", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := pending(onKey); len(got) != 1 || got[0] != backend.EventExpired {
			t.Fatalf("events on the key at expiry: got %v, want [expired]", got)
		}
		if got := pending(onAncestor); len(got) != 1 || got[0] != backend.EventExpired {
			t.Fatalf("events on the ancestor at expiry: got %v, want [expired]", got)
		}
		if err := a.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
			t.Fatalf("Renew after expiry: got %v, want ErrLeaseLost", err)
		}
		cancel()
		synctest.Wait()
		// lock/a/c and its intent on lock/a remain.
		if n := memorybackend.KeysHeld(store); n != 2 {
			t.Fatalf("keys held with one entry below lock/a: got %d, want 2", n)
		}
		if err := a.Release(ctx, lc); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if n := memorybackend.KeysHeld(store); n != 0 {
			t.Fatalf("keys held after the last release: got %d, want 0", n)
		}
	})
}

// Waiters, intents and entries left to expire are forgotten by the expiry
// timers alone.
func TestModesTimersForgetEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a := store.Client()
		defer a.Close()
		ctx := t.Context()
		for i := range 10 {
			k := fmt.Sprintf("lock/t/%d", i)
			r := modeReq(k, "a", backend.Shared, time.Duration(i+1)*time.Second)
			r.Ancestors = []string{"lock/t"}
			r.Limit = 1
			acquireMode(t, a, r)
			w := modeReq(k, "w", backend.Exclusive, time.Duration(20-i)*time.Second)
			w.WaitID = "w"
			if _, err := a.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
				t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
			}
		}
		if n := memorybackend.KeysHeld(store); n != 11 {
			t.Fatalf("keys held: got %d, want 11", n)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := memorybackend.KeysHeld(store); n != 10 {
			t.Fatalf("keys held after the entries expired, with waiters left: got %d, want 10", n)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := memorybackend.KeysHeld(store); n != 0 {
			t.Fatalf("keys held after every waiter expired: got %d, want 0", n)
		}
	})
}

// A semaphore of 3 under 50 concurrent acquirers on separate clients: exactly
// 3 win, and the losers' HeldErrors list 3 holders at most.
func TestModesSemaphoreUnderContention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		const contenders, limit = 50, 3
		var mu sync.Mutex
		var won int
		var wg sync.WaitGroup
		for i := range contenders {
			c := store.Client()
			defer c.Close()
			wg.Go(func() {
				r := modeReq("lock/sem", fmt.Sprint(i), backend.Shared, time.Minute)
				r.Limit = limit
				_, err := c.AcquireMode(t.Context(), r)
				var held *backend.HeldError
				switch {
				case err == nil:
					mu.Lock()
					won++
					mu.Unlock()
				case errors.As(err, &held):
					if len(held.Holders) != limit {
						t.Errorf("HeldError.Holders: got %d, want %d", len(held.Holders), limit)
					}
				default:
					t.Errorf("AcquireMode: %v", err)
				}
			})
		}
		wg.Wait()
		if won != limit {
			t.Fatalf("winners: got %d, want %d", won, limit)
		}
	})
}

// Restart loses entries, intents and waiters like leases; terms go on.
func TestModesRestartLosesEntries(t *testing.T) {
	store := memorybackend.NewStore()
	a := store.Client()
	defer a.Close()
	ctx := t.Context()
	r := modeReq("lock/r/x", "a", backend.Exclusive, time.Minute)
	r.Ancestors = []string{"lock/r"}
	l := acquireMode(t, a, r)
	w := modeReq("lock/r/x", "w", backend.Exclusive, time.Minute)
	w.WaitID = "w"
	if _, err := a.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	store.Restart(nil)
	if n := store.Len(); n != 0 {
		t.Fatalf("Len after Restart: got %d, want 0", n)
	}
	if err := a.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("Renew after Restart: got %v, want ErrLeaseLost", err)
	}
	x := acquireMode(t, a, modeReq("lock/r", "b", backend.Exclusive, time.Minute))
	if x.Term <= l.Term {
		t.Fatalf("term after Restart: got %d, want > %d", x.Term, l.Term)
	}
}

// SetModeSupport makes a client refuse what it no longer supports, and
// Calls counts the Modes methods.
func TestSetModeSupportAndCalls(t *testing.T) {
	b := memorybackend.New()
	defer b.Close()
	ctx := t.Context()
	b.SetModeSupport(backend.ModeSupport{})
	if got := b.ModeSupport(); got != (backend.ModeSupport{}) {
		t.Fatalf("ModeSupport after SetModeSupport: got %+v, want none", got)
	}
	r := modeReq("lock/s/x", "a", backend.Shared, time.Minute)
	if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrUnsupported) {
		t.Fatalf("Shared with no support: got %v, want ErrUnsupported", err)
	}
	l := acquireMode(t, b, modeReq("lock/s/x", "a", backend.Exclusive, time.Minute))
	if _, err := b.Holders(ctx, "lock/s/x"); err != nil {
		t.Fatalf("Holders: %v", err)
	}
	if err := b.CancelWait(ctx, "lock/s/x", "w"); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	calls := b.Calls()
	for op, want := range map[string]int64{"AcquireMode": 2, "Holders": 1, "CancelWait": 1, "ModeSupport": 1, "Release": 1} {
		if calls[op] != want {
			t.Errorf("Calls()[%q]: got %d, want %d (%v)", op, calls[op], want, calls)
		}
	}
}

// The conformance suite against clients without some parts of Modes: the
// cases that need them skip, and ModesUnsupported checks the refusals.
func TestConformanceRestrictedModes(t *testing.T) {
	if testing.Short() {
		t.Skip("the full suite again; -short skips it")
	}
	for name, ms := range map[string]backend.ModeSupport{
		"ExclusiveOnly": {},
		"NoFair":        {Shared: true, Hierarchical: true, WriterFirst: true, AncestorWaiters: true},
		"HierarchyOnly": {Hierarchical: true, AncestorWaiters: true},
	} {
		t.Run(name, func(t *testing.T) {
			backendtest.Run(t, func(t *testing.T) backendtest.Env {
				store := memorybackend.NewStore()
				return backendtest.Env{
					Open: func() backend.Backend {
						c := store.Client()
						c.SetModeSupport(ms)
						return c
					},
					ShortTTL: 300 * time.Millisecond,
					Size:     store.Len,
				}
			})
		})
	}
}

// A waiter's registration that expires, and one withdrawn with CancelWait,
// send EventChanged to the key's watchers, so that the waiters behind it
// look again; a registration itself sends nothing.
func TestModesWaiterEndIsReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, w := store.Client(), store.Client()
		defer a.Close()
		defer w.Close()
		ctx := t.Context()
		acquireMode(t, a, modeReq("lock/w", "reader", backend.Shared, time.Hour))
		events, err := w.Watch(ctx, "lock/w")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		register := func(waitID string) {
			t.Helper()
			r := modeReq("lock/w", "writer", backend.Exclusive, time.Second)
			r.WaitID = waitID
			if _, err := a.AcquireMode(ctx, r); !errors.Is(err, backend.ErrHeld) {
				t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
			}
		}
		register("w1")
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		if got := pending(events); len(got) != 0 {
			t.Fatalf("events before the registration expired: got %v, want none", got)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := pending(events); len(got) != 1 || got[0] != backend.EventChanged {
			t.Fatalf("events when the registration expired: got %v, want [changed]", got)
		}
		register("w2")
		if err := a.CancelWait(ctx, "lock/w", "w2"); err != nil {
			t.Fatalf("CancelWait: %v", err)
		}
		if got := pending(events); len(got) != 1 || got[0] != backend.EventChanged {
			t.Fatalf("events after CancelWait: got %v, want [changed]", got)
		}
	})
}

// The release of an entry is reported as EventReleased, both to the
// watchers of its key and to those of its ancestors (an expiry as
// EventExpired: TestModesEntryExpiryInVirtualTime).
func TestModesReleaseReported(t *testing.T) {
	store := memorybackend.NewStore()
	a, w := store.Client(), store.Client()
	defer a.Close()
	defer w.Close()
	ctx := t.Context()
	onKey, err := w.Watch(ctx, "lock/a/b")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	onAncestor, err := w.Watch(ctx, "lock/a")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	r := modeReq("lock/a/b", "a", backend.Shared, time.Minute)
	r.Ancestors = []string{"lock/a"}
	l := acquireMode(t, a, r)
	if got := pending(onKey); !slices.Equal(got, []backend.EventType{backend.EventChanged}) {
		t.Fatalf("events on the key after AcquireMode: got %v, want [changed]", got)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := pending(onKey); !slices.Equal(got, []backend.EventType{backend.EventReleased}) {
		t.Fatalf("events on the key after Release: got %v, want [released]", got)
	}
	if got := pending(onAncestor); !slices.Equal(got, []backend.EventType{backend.EventReleased}) {
		t.Fatalf("events on the ancestor after Release: got %v, want [released]", got)
	}
}

// A waiter that registers again with the same WaitID in another mode is
// counted in its new mode: a Fair Shared waiter that retries as Exclusive
// then blocks new Shared holders (writer preference).
func TestModesWaiterChangesMode(t *testing.T) {
	store := memorybackend.NewStore()
	a, b := store.Client(), store.Client()
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	x := acquireMode(t, a, modeReq("lock/m", "x", backend.Exclusive, time.Minute))
	r := modeReq("lock/m", "w", backend.Shared, time.Minute)
	r.Fair, r.WaitID = true, "w"
	if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Fair Shared AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	r.Mode, r.Fair = backend.Exclusive, false
	if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Exclusive AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	if err := a.Release(ctx, x); err != nil {
		t.Fatalf("Release: %v", err)
	}
	_, err := a.AcquireMode(ctx, modeReq("lock/m", "reader", backend.Shared, time.Minute))
	var held *backend.HeldError
	if !errors.As(err, &held) || held.Waiting != 1 {
		t.Fatalf("Shared AcquireMode with the waiter now Exclusive: got %v, want a HeldError with Waiting 1", err)
	}
}

// A waiter's own Exclusive registration does not block it: retrying as
// Shared with the same WaitID, it gets in beside the Shared holder.
func TestModesOwnRegistrationDoesNotBlock(t *testing.T) {
	store := memorybackend.NewStore()
	a, b := store.Client(), store.Client()
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	acquireMode(t, a, modeReq("lock/o", "reader", backend.Shared, time.Minute))
	r := modeReq("lock/o", "w", backend.Exclusive, time.Minute)
	r.WaitID = "w"
	if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Exclusive AcquireMode beside a Shared holder: got %v, want ErrHeld", err)
	}
	r.Mode = backend.Shared
	acquireMode(t, b, r)
	// Its success removed the registration: other readers get in too.
	acquireMode(t, a, modeReq("lock/o", "reader-2", backend.Shared, time.Minute))
}
