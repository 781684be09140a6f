package etcdbackend_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// goroutineSlack bounds how many goroutines the tests below tolerate as
// noise (the embedded server's and the gRPC connection's own come and go).
const goroutineSlack = 10

// TestWatchGoroutinesIndependentOfSubscriptions: a thousand subscriptions
// of one Backend cost no goroutine each (one etcd watch serves them all),
// each still gets its own key's events and no other's, heartbeat records
// wake nobody, and once the last subscription ends the shared watch stops,
// to start again with the next Watch.
func TestWatchGoroutinesIndependentOfSubscriptions(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	w := newBackend(t, newClient(t, nil, nil), opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	// Connected first, so the connection's goroutines are in the count.
	if _, err := w.List(ctx, ""); err != nil {
		t.Fatalf("List: %v", err)
	}
	before := runtime.NumGoroutine()

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const n = 1000
	chans := make([]<-chan backend.Event, n)
	var err error
	if chans[0], err = w.Watch(wctx, "k0"); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	one := runtime.NumGoroutine()
	for i := 1; i < n; i++ {
		// Keys with "/" and ":" as package lock's, one key watched twice.
		key := fmt.Sprintf("lock/k%d:x/y", i)
		if i == n-1 {
			key = "lock/k1:x/y"
		}
		if chans[i], err = w.Watch(wctx, key); err != nil {
			t.Fatalf("Watch %d: %v", i, err)
		}
	}
	all := runtime.NumGoroutine()
	t.Logf("goroutines: %d before, %d with one subscription, %d with %d", before, one, all, n)
	if all-one > goroutineSlack {
		t.Fatalf("goroutines: got %d more with %d subscriptions than with one, want at most %d", all-one, n, goroutineSlack)
	}

	// A heartbeat record of a watched key, then a change of another: the
	// events come in revision order, so once the change is delivered the
	// heartbeat would have been too.
	if err := a.Heartbeat(ctx, "lock/k1:x/y", "a", 10*time.Second); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "lock/k2:x/y", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// nextNonReset: a new client's first watch may get one spurious reset
	// (see startMonitor), which every subscription of the hub receives.
	if e := nextNonReset(t, chans[2], "acquisition"); e.Type != backend.EventChanged || e.Key != "lock/k2:x/y" {
		t.Fatalf("acquisition: got %v on %q, want %v on %q", e.Type, e.Key, backend.EventChanged, "lock/k2:x/y")
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if e := nextNonReset(t, chans[2], "release"); e.Type != backend.EventReleased {
		t.Fatalf("release: got %v, want %v", e.Type, backend.EventReleased)
	}
	for i, ch := range chans {
		if i == 2 {
			continue
		}
		for len(ch) > 0 {
			if e := <-ch; e.Type != backend.EventReset {
				t.Errorf("subscription %d: got %v on %q, want no event but a reset (the changes were of another key or a heartbeat)", i, e.Type, e.Key)
			}
		}
	}

	// Both subscriptions of one key get its events.
	l, err = a.Acquire(ctx, backend.AcquireRequest{Key: "lock/k1:x/y", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	for _, i := range []int{1, n - 1} {
		if e := nextNonReset(t, chans[i], "acquisition"); e.Type != backend.EventChanged {
			t.Fatalf("subscription %d: got %v, want %v", i, e.Type, backend.EventChanged)
		}
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}

	// The end of every subscription closes the channels and stops the
	// shared watch: the goroutines go back to what they were (the
	// connection monitor stays, until Close).
	cancel()
	for _, ch := range chans {
		waitClosed(t, ch, "context cancelled")
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+goroutineSlack {
		if time.Now().After(deadline) {
			t.Fatalf("goroutines 10s after the last subscription ended: got %d, want at most %d", runtime.NumGoroutine(), before+goroutineSlack)
		}
		time.Sleep(10 * time.Millisecond) // polling an observable condition
	}

	// A new subscription starts a new shared watch.
	events, err := w.Watch(ctx, "k0")
	if err != nil {
		t.Fatalf("Watch after the last subscription ended: %v", err)
	}
	if l, err = a.Acquire(ctx, backend.AcquireRequest{Key: "k0", HolderID: "a", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if e := nextEvent(t, events, "acquisition after a restart of the shared watch", 10*time.Second); e.Type != backend.EventChanged {
		t.Fatalf("got %v, want %v", e.Type, backend.EventChanged)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitClosed(t, events, "Close")
}

// TestWatchResetReachesEverySubscription: when the shared etcd watch has
// to start over (its revision was compacted while the client was cut off),
// every subscription of every key gets a backend.EventReset, and each is
// live again afterwards.
func TestWatchResetReachesEverySubscription(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	p := startProxy(t, shared.Endpoint(0))
	w := newBackend(t, newClient(t, nil, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.endpoint()} }), opts)
	writerCli := newClient(t, nil, nil)
	a := newBackend(t, writerCli, opts)
	keys := []string{"a", "b", "lock/c:d"}
	chans := make(map[string]<-chan backend.Event)
	for _, k := range keys {
		ch, err := w.Watch(ctx, k)
		if err != nil {
			t.Fatalf("Watch(%q): %v", k, err)
		}
		chans[k] = ch
	}
	p.setCut(true)
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "a", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := shared.Compact(ctx, writerCli); err != nil {
		t.Fatal(err)
	}
	p.setCut(false)
	for _, k := range keys {
		if e := nextEvent(t, chans[k], "reset after compaction", 20*time.Second); e.Type != backend.EventReset || e.Key != k {
			t.Fatalf("subscription of %q, first event after compaction: got %v on %q, want %v", k, e.Type, e.Key, backend.EventReset)
		}
	}
	// Live again: as in TestWatchSurvivesCompaction, a change made before
	// the watch started over is seen only by the re-read the reset asks
	// for, so change the keys until each has delivered one.
	for _, k := range keys {
		for attempt := 1; ; attempt++ {
			l, err := a.Acquire(ctx, backend.AcquireRequest{Key: k, HolderID: "a", TTL: time.Minute})
			if err != nil {
				t.Fatalf("Acquire(%q): %v", k, err)
			}
			_, ok := nextNonResetWithin(chans[k], 2*time.Second)
			if err := a.Release(ctx, l); err != nil {
				t.Fatalf("Release(%q): %v", k, err)
			}
			if ok {
				break
			}
			if attempt == 5 {
				t.Fatalf("subscription of %q: no change delivered after %d acquisitions", k, attempt)
			}
		}
	}
}

// TestWatchJoiningALiveSharedWatchMissesNothing: a Watch made while the
// shared etcd watch already runs returns without a round trip, and still
// delivers every change made after it returns, also while the shared watch
// is busy with other keys' changes.
func TestWatchJoiningALiveSharedWatchMissesNothing(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	w := newBackend(t, newClient(t, nil, nil), opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	if _, err := w.Watch(ctx, "busy"); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	for i := range 50 {
		// Traffic on another key keeps the shared watch behind the
		// store now and then.
		l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "busy", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		key := fmt.Sprintf("k%d", i)
		events, err := w.Watch(ctx, key)
		if err != nil {
			t.Fatalf("Watch(%q): %v", key, err)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
		k, err := a.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		if e := nextChange(t, events, "acquisition after Watch returned"); e.Type != backend.EventChanged {
			t.Fatalf("%q: got %v, want %v", key, e.Type, backend.EventChanged)
		}
		if err := a.Release(ctx, k); err != nil {
			t.Fatalf("Release(%q): %v", key, err)
		}
		if e := nextChange(t, events, "release"); e.Type != backend.EventReleased {
			t.Fatalf("%q: got %v, want %v", key, e.Type, backend.EventReleased)
		}
	}
}
