package etcdbackend_test

import (
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestAcquireForgetsSeenHeld: an acquisition of a key that this Backend
// found held before probes it with a read-only transaction first; once an
// acquisition on a session succeeds, the key is no longer recorded as last
// seen held, so the next acquisition of it sends its transaction without a
// read-only probe first (one request, not two).
func TestAcquireForgetsSeenHeld(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	other := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	var n counter
	be := newBackend(t, newClient(t, nil, n.configure), &etcdbackend.Options{Prefix: prefix})
	req := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second}
	held, err := other.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := be.Acquire(ctx, req); err == nil {
		t.Fatal("Acquire of a held key: got nil error")
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	// Seen held: probed first (a read-only transaction), then acquired.
	n.reset()
	l, err := be.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.byMethod()["Txn"]; got != 2 {
		t.Errorf("Acquire of a key found held before: %d transactions (%v), want 2 (the probe, then the acquisition)", got, n.byMethod())
	}
	if err := be.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	n.reset()
	if l, err = be.Acquire(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := n.total(); got != 1 {
		t.Errorf("Acquire after a successful one: %d requests (%v), want 1 (no probe)", got, n.byMethod())
	}
	if err := be.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestWatchForgetsSeenHeld: once a watch of this Backend has seen a key
// that it found held deleted, the next acquisition of the key sends its
// transaction without the read-only probe (one request, not two), as the
// package doc says.
func TestWatchForgetsSeenHeld(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	other := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	var n counter
	be := newBackend(t, newClient(t, nil, n.configure), &etcdbackend.Options{Prefix: prefix})
	req := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second}
	held, err := other.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := be.Acquire(ctx, req); err == nil {
		t.Fatal("Acquire of a held key: got nil error")
	}
	events, err := be.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	ev := nextEvent(t, events, "the release", 20*time.Second)
	for ev.Type == backend.EventReset { // a reconnection: not what this test is about
		ev = nextEvent(t, events, "the release", 20*time.Second)
	}
	if ev.Type != backend.EventReleased {
		t.Fatalf("event after the release: got %v, want released", ev.Type)
	}
	n.reset()
	l, err := be.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.byMethod()["Txn"]; got != 1 {
		t.Errorf("Acquire after its watch saw the key released: %d transactions (%v), want 1 (no probe)", got, n.byMethod())
	}
	if err := be.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestResetForgetsSeenHeld: a reset of the Backend's watch (the connection
// came back: the store may have lost data, a holder with it) forgets which
// keys were last seen held, as a deletion seen by the watch does, so the
// next acquisition of such a key sends its transaction without the
// read-only probe first (one request, not two).
func TestResetForgetsSeenHeld(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	other := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	var n counter
	cli := newClient(t, nil, n.configure)
	bw := newBreakableWatcher(cli.Watcher)
	cli.Watcher = bw
	be := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	req := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second}
	events, err := be.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	held, err := other.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := be.Acquire(ctx, req); err == nil {
		t.Fatal("Acquire of a held key: got nil error")
	}
	// The key goes without the watch seeing it.
	bw.mute()
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	bw.waitDropped(t, resp.Header.Revision)
	for len(events) > 0 {
		<-events // the acquisition's event, and any spurious reset
	}

	etcdbackend.SignalReconnection(be)
	if e := next(t, events); e.Type != backend.EventReset {
		t.Fatalf("after the reconnection: got %v, want %v", e.Type, backend.EventReset)
	}
	n.reset()
	l, err := be.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.byMethod()["Txn"]; got != 1 {
		t.Errorf("Acquire after a reset: %d transactions (%v), want 1 (no probe)", got, n.byMethod())
	}
	if err := be.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}
