package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestWatchLastLeavingWhileAnotherJoins: the last subscription of a
// Backend ends (its context cancelled, which stops the shared etcd watch)
// at the moment another Watch comes in, which either joins the running
// watch before it stops or starts the next one; either way the joiner gets
// the acquisition and the release made after its Watch returned, and the
// subscription that left has its channel closed.
func TestWatchLastLeavingWhileAnotherJoins(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	w := newBackend(t, newClient(t, nil, nil), opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	for i := range 30 {
		key := fmt.Sprintf("k%d", i)
		leaving, cancel := context.WithCancel(ctx)
		old, err := w.Watch(leaving, key)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		cancel() // the unsubscription runs concurrently with the Watch below
		joined, stop := context.WithCancel(ctx)
		events, err := w.Watch(joined, key)
		if err != nil {
			stop()
			t.Fatalf("Watch while the last subscription leaves: %v", err)
		}
		l, err := a.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute})
		if err != nil {
			stop()
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		if e := nextChange(t, events, "acquisition after Watch returned"); e.Type != backend.EventChanged {
			t.Fatalf("%q: got %v, want %v", key, e.Type, backend.EventChanged)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release(%q): %v", key, err)
		}
		if e := nextChange(t, events, "release"); e.Type != backend.EventReleased {
			t.Fatalf("%q: got %v, want %v", key, e.Type, backend.EventReleased)
		}
		// The subscription that left is closed (it saw nothing of the
		// acquisition made after it ended, or at most buffered events).
		timer := time.NewTimer(10 * time.Second)
	drain:
		for {
			select {
			case _, ok := <-old:
				if !ok {
					break drain
				}
			case <-timer.C:
				t.Fatalf("%q: the cancelled subscription's channel is still open", key)
			}
		}
		timer.Stop()
		stop()
	}
}

// TestWatchRacingClose: Watch calls racing Close of their Backend either
// fail with backend.ErrClosed or return a channel that Close closes;
// nothing they started outlives Close (the package's goleak check).
func TestWatchRacingClose(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	cli := newClient(t, nil, nil)
	for i := range 20 {
		b, err := etcdbackend.New(cli, opts)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			// A shared watch already running.
			if _, err := b.Watch(ctx, "running"); err != nil {
				t.Fatalf("Watch: %v", err)
			}
		}
		var wg sync.WaitGroup
		chans := make([]<-chan backend.Event, 8)
		errs := make([]error, len(chans))
		for j := range chans {
			wg.Go(func() { chans[j], errs[j] = b.Watch(ctx, fmt.Sprintf("k%d", j)) })
		}
		if err := b.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		wg.Wait()
		for j, ch := range chans {
			if errs[j] != nil {
				if !errors.Is(errs[j], backend.ErrClosed) {
					t.Errorf("round %d: Watch racing Close: got %v, want nil or ErrClosed", i, errs[j])
				}
				continue
			}
			timer := time.NewTimer(10 * time.Second)
		drain:
			for {
				select {
				case _, ok := <-ch:
					if !ok {
						break drain
					}
				case <-timer.C:
					t.Fatalf("round %d: a channel of a Watch racing Close is still open after Close", i)
				}
			}
			timer.Stop()
		}
	}
}

// nextChange returns the next event of ch that is not a
// backend.EventReset (which the contract allows at any time: the receiver
// looks again), within a generous bound.
func nextChange(t testing.TB, ch <-chan backend.Event, what string) backend.Event {
	t.Helper()
	for {
		if e := nextEvent(t, ch, what, 10*time.Second); e.Type != backend.EventReset {
			return e
		}
	}
}
