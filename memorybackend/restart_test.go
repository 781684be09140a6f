package memorybackend_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// closedAfter drains ch and reports the events it held before it was closed;
// it fails the test if ch is still open.
func closedAfter(t *testing.T, ch <-chan backend.Event, what string) []backend.EventType {
	t.Helper()
	var got []backend.EventType
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return got
			}
			got = append(got, e.Type)
		default:
			t.Fatalf("%s: watch channel still open (events %v), want closed", what, got)
			return nil
		}
	}
}

func TestRestartLosesLeasesAndBreaksWatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, b, w, cut := store.Client(), store.Client(), store.Client(), store.Client()
		defer a.Close()
		defer b.Close()
		defer w.Close()
		defer cut.Close()
		ctx := t.Context()

		held, err := w.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		free, err := w.Watch(ctx, "free")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		cutEvents, err := cut.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		cut.Partition() // a partitioned client's watches break too
		l := acquire(t, a, "k", "a", time.Second)
		if err := a.Heartbeat(ctx, "k", "a", time.Minute); err != nil {
			t.Fatalf("Heartbeat: %v", err)
		}

		store.Restart(nil)

		if got := closedAfter(t, held, "watch of a held key"); len(got) != 1 || got[0] != backend.EventChanged {
			t.Errorf("events before the restart closed the watch: got %v, want [changed] (no released or expired)", got)
		}
		closedAfter(t, free, "watch of a free key")
		closedAfter(t, cutEvents, "watch of a partitioned client")
		if _, err := b.Get(ctx, "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Get after restart: got %v, want ErrNotHeld", err)
		}
		if ms, err := b.Members(ctx, "k"); err != nil || len(ms) != 0 {
			t.Errorf("Members after restart: got %v, %v; want none", ms, err)
		}
		if err := a.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Renew after restart: got %v, want ErrLeaseLost", err)
		}
		if err := a.SetMetadata(ctx, l, map[string]string{"x": "y"}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("SetMetadata after restart: got %v, want ErrLeaseLost", err)
		}
		if err := a.Release(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Release after restart: got %v, want ErrLeaseLost", err)
		}
		if n := store.Len(); n != 0 {
			t.Errorf("Len after restart: got %d, want 0", n)
		}

		// Clients work at once: a new watch hears a new acquisition, whose
		// term is above the lost one's.
		again, err := w.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch after restart: %v", err)
		}
		lb := acquire(t, b, "k", "b", time.Hour)
		if lb.Term <= l.Term {
			t.Errorf("term after restart: got %d, want > %d", lb.Term, l.Term)
		}
		// The lost lease's expiry timer was stopped: its expiry time passes
		// without an event.
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := pending(again); len(got) != 1 || got[0] != backend.EventChanged {
			t.Errorf("events after restart: got %v, want [changed] only", got)
		}
	})
}

func TestRestartLoseTerms(t *testing.T) {
	store := memorybackend.NewStore()
	a := store.Client()
	defer a.Close()
	acquire(t, a, "k", "a", time.Minute)
	l := acquire(t, a, "other", "a", time.Minute)
	if l.Term != 2 {
		t.Fatalf("second term of the store: got %d, want 2", l.Term)
	}
	store.Restart(&memorybackend.RestartOptions{LoseTerms: true})
	if l := acquire(t, a, "k", "a", time.Minute); l.Term != 1 {
		t.Errorf("term after a restart that lost the terms: got %d, want 1 again", l.Term)
	}
	// LoseTerms applies to a restart that keeps the leases too.
	acquire(t, a, "other", "a", time.Minute)
	store.Restart(&memorybackend.RestartOptions{KeepLeases: true, LoseTerms: true})
	if l := acquire(t, a, "third", "a", time.Minute); l.Term != 1 {
		t.Errorf("term after a restart that kept the leases and lost the terms: got %d, want 1 again", l.Term)
	}
}

func TestRestartKeepLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a := store.Client()
		defer a.Close()
		ctx := t.Context()
		events, err := a.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		l := acquire(t, a, "k", "a", time.Second)
		if err := a.Heartbeat(ctx, "k", "a", time.Minute); err != nil {
			t.Fatalf("Heartbeat: %v", err)
		}
		store.Restart(&memorybackend.RestartOptions{KeepLeases: true})
		closedAfter(t, events, "watch after a restart that kept the leases")
		rec, err := a.Get(ctx, "k")
		if err != nil || rec.Token != l.Token || !rec.HasHeartbeat() {
			t.Fatalf("Get after restart: got %+v, %v; want a's lease with its heartbeat", rec, err)
		}
		if err := a.Renew(ctx, l); err != nil {
			t.Fatalf("Renew after restart: %v", err)
		}
		// The kept lease's expiry timer still runs.
		events, err = a.Watch(ctx, "k")
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := pending(events); len(got) != 1 || got[0] != backend.EventExpired {
			t.Fatalf("events at the kept lease's expiry: got %v, want [expired]", got)
		}
		if l2 := acquire(t, a, "k", "a", time.Second); l2.Term <= l.Term {
			t.Errorf("term after restart: got %d, want > %d", l2.Term, l.Term)
		}
	})
}

// TestTermsWithoutPerKeyState: terms come from one store-wide counter, so a
// key's terms keep increasing after the store has forgotten the key.
func TestTermsWithoutPerKeyState(t *testing.T) {
	store := memorybackend.NewStore()
	a := store.Client()
	defer a.Close()
	last := map[string]uint64{}
	for i := range 10 {
		for _, key := range []string{"x", "y"} {
			l := acquire(t, a, key, "a", time.Minute)
			if l.Term <= last[key] {
				t.Fatalf("round %d, key %q: got term %d, want > %d", i, key, l.Term, last[key])
			}
			last[key] = l.Term
			if err := a.Release(t.Context(), l); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if n := store.Len(); n != 0 {
				t.Fatalf("Len after release: got %d, want 0", n)
			}
		}
	}
}

// TestStateForgotten: a key is forgotten as soon as nothing of it is left:
// its lease released or expired, its heartbeat records expired or removed,
// its watches closed.
func TestStateForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a := store.Client()
		ctx := t.Context()
		wantLen := func(step string, want int) {
			t.Helper()
			if n := store.Len(); n != want {
				t.Fatalf("Len after %s: got %d, want %d", step, n, want)
			}
		}
		acquire(t, a, "expires", "a", time.Second)
		if err := a.Heartbeat(ctx, "beats", "a", 3*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := a.Heartbeat(ctx, "removed", "a", time.Hour); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		if _, err := a.Watch(wctx, "watched"); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Watch(ctx, "closed"); err != nil {
			t.Fatal(err)
		}
		wantLen("setting up", 5)
		if err := a.RemoveMember(ctx, "removed", "a"); err != nil {
			t.Fatal(err)
		}
		wantLen("RemoveMember", 4)
		cancel()
		synctest.Wait()
		wantLen("cancelling a watch", 3)
		time.Sleep(time.Second)
		wantLen("the lease expired", 2)
		time.Sleep(2 * time.Second)
		wantLen("the heartbeat expired", 1)
		a.Close()
		wantLen("Close", 0)
		// Heartbeats with an expired holder's lease, or with no lease at
		// all, and no Len or other call touching the key: the expiry timer
		// forgets the key.
		b := store.Client()
		defer b.Close()
		acquire(t, b, "k", "b", time.Second)
		if err := b.Heartbeat(ctx, "k", "b", 2*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := b.Heartbeat(ctx, "only-beats", "b", time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := memorybackend.KeysHeld(store); n != 0 {
			t.Errorf("keys held after expiry, before any call: got %d, want 0", n)
		}
	})
}

// TestBoundedState: 100,000 distinct keys acquired and released one at a
// time leave no state and no memory behind; keys held all at once are
// forgotten on release and their memory is given back.
func TestBoundedState(t *testing.T) {
	const (
		n    = 100_000 // keys acquired and released one at a time
		held = 20_000  // keys held at once, in each of two rounds
	)
	store := memorybackend.NewStore()
	a := store.Client()
	defer a.Close()
	ctx := t.Context()
	// heap returns the live heap. The runtime drops stopped timers from its
	// timer heap lazily, when it next schedules on their P, and they keep
	// their callbacks' state alive until then: let it schedule and collect
	// a few times.
	heap := func() uint64 {
		for range 3 {
			runtime.Gosched()
			runtime.GC()
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	const slack = 1 << 20 // allocations of the runtime and the test itself
	base := heap()

	for i := range n {
		l := acquire(t, a, fmt.Sprintf("lock/one-at-a-time:%d", i), "a", time.Hour)
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	if got := store.Len(); got != 0 {
		t.Fatalf("Len after %d keys acquired and released one at a time: got %d, want 0", n, got)
	}
	if got := heap(); got > base+slack {
		t.Errorf("heap after %d keys acquired and released one at a time: got %d KiB, want within %d KiB of the %d KiB before",
			n, got>>10, slack>>10, base>>10)
	}

	// Two rounds of keys held at once: the first grows the runtime's own
	// structures (its timer heap does not shrink), the second must not grow
	// anything further.
	var before, peak, after uint64
	for round := range 2 {
		before = heap()
		leases := make([]backend.Lease, held)
		for i := range leases {
			leases[i] = acquire(t, a, fmt.Sprintf("lock/all-at-once:%d/%d", round, i), "a", time.Hour)
		}
		if got := store.Len(); got != held {
			t.Fatalf("Len with %d keys held: got %d", held, got)
		}
		peak = heap()
		for _, l := range leases {
			if err := a.Release(ctx, l); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
		if got := store.Len(); got != 0 {
			t.Fatalf("Len after %d keys released: got %d, want 0", held, got)
		}
		leases = nil // what is left is the store's
		after = heap()
		t.Logf("round %d: heap %d KiB before, %d KiB with %d keys held, %d KiB after their release",
			round+1, before>>10, peak>>10, held, after>>10)
	}
	runtime.KeepAlive(store)
	if peak < before+held*100 {
		t.Fatalf("heap with %d keys held: got %d KiB, want at least 100 bytes a key above the %d KiB before (is the measure working?)",
			held, peak>>10, before>>10)
	}
	if after > before+slack {
		t.Errorf("heap after the second round: got %d KiB, want within %d KiB of the %d KiB before it", after>>10, slack>>10, before>>10)
	}
}
