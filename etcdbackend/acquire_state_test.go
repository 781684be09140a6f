package etcdbackend_test

import (
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestAcquireForgetsSeenHeld: once an acquisition on a session succeeds,
// the key is no longer recorded as last seen held, so the next acquisition
// of it sends its transaction without a read-only probe first (one
// request, not two).
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
	// Seen held: probed first, then acquired.
	l, err := be.Acquire(ctx, req)
	if err != nil {
		t.Fatal(err)
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
