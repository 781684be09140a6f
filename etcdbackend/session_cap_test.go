package etcdbackend_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestSessionCap: once a session lease holds its cap of keys, the next
// acquisitions of that TTL go on a new session lease and the full one
// stays, with its keys. RenewBatch renews them all with one keep-alive and
// one look-up per session lease, sent together, each look-up returning only
// its session's keys; a session lease that is lost loses its keys alone.
func TestSessionCap(t *testing.T) {
	const perSession, count = 4, 10
	t.Cleanup(etcdbackend.SetSessionKeys(perSession))
	ctx := testCtx(t)
	var n counter
	prefix := newPrefix()
	cli := newClient(t, nil, n.configure)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	leases := make([]backend.Lease, count)
	sessions := make([]clientv3.LeaseID, count)
	keys := make(map[clientv3.LeaseID]int)
	var order []clientv3.LeaseID
	for i := range leases {
		key := fmt.Sprintf("cap/%d", i)
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: 10 * time.Second})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		leases[i] = l
		id := sessionOf(t, cli, prefix+key)
		sessions[i] = id
		if keys[id] == 0 {
			order = append(order, id)
		}
		keys[id]++
	}
	// Acquired one after the other: 4, 4 and 2 keys.
	if len(order) != 3 || keys[order[0]] != 4 || keys[order[1]] != 4 || keys[order[2]] != 2 {
		t.Fatalf("keys per session lease: got %d leases %v, want 4, 4 and 2 keys on three", len(order), keys)
	}
	for _, id := range order {
		resp, err := cli.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
		if err != nil {
			t.Fatal(err)
		}
		// The keys and the session's lease mark.
		if len(resp.Keys) != keys[id]+1 {
			t.Errorf("session lease %x: %d keys attached, want %d and its lease mark", id, len(resp.Keys), keys[id])
		}
	}

	renew := func(what string, lost clientv3.LeaseID, wantRequests int64) {
		t.Helper()
		n.reset()
		errs := b.RenewBatch(ctx, leases)
		if got := n.total(); got != wantRequests {
			t.Errorf("%s: RenewBatch of %d leases: got %d requests %v, want %d", what, count, got, n.byMethod(), wantRequests)
		}
		for i, err := range errs {
			switch {
			case sessions[i] == lost && !errors.Is(err, backend.ErrLeaseLost):
				t.Errorf("%s: lease %d (session %x, lost): got %v, want ErrLeaseLost", what, i, sessions[i], err)
			case sessions[i] != lost && err != nil:
				t.Errorf("%s: lease %d (session %x): got %v, want nil", what, i, sessions[i], err)
			}
		}
	}
	// A keep-alive and a look-up per session lease.
	renew("all held", 0, 6)
	// Every session lease was kept alive, the full ones included.
	for _, id := range order {
		resp, err := cli.TimeToLive(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if resp.TTL < 9 {
			t.Errorf("session lease %x: TTL left after RenewBatch %ds, want 9s or more", id, resp.TTL)
		}
	}

	// The second session lease is lost: its four keys are, no other.
	if _, err := cli.Revoke(ctx, order[1]); err != nil {
		t.Fatal(err)
	}
	renew("second session revoked", order[1], 6)
	// Its keys are now lost for good (not looked up again); the others
	// stay held.
	for i, err := range b.RenewBatch(ctx, leases) {
		if (sessions[i] == order[1]) != errors.Is(err, backend.ErrLeaseLost) || (sessions[i] != order[1] && err != nil) {
			t.Errorf("after the loss: lease %d (session %x): got %v", i, sessions[i], err)
		}
	}

	// A release from a full session lease leaves it with room, but new
	// acquisitions go on the current one until it is full.
	if err := b.Release(ctx, leases[0]); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for i := range 2 {
		key := fmt.Sprintf("more/%d", i)
		if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: 10 * time.Second}); err != nil {
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		if got := sessionOf(t, cli, prefix+key); got != order[2] {
			t.Errorf("Acquire(%q): on session lease %x, want the current one %x", key, got, order[2])
		}
	}
	// The current one is full now: the next acquisition goes on a fourth.
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "more/2", HolderID: "a", TTL: 10 * time.Second}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if got := sessionOf(t, cli, prefix+"more/2"); got == order[0] || got == order[1] || got == order[2] {
		t.Errorf("Acquire on a full current session lease: on %x, want a new one", got)
	}
}

// TestSessionCapRetiredForgotten: a full session lease is forgotten, with
// what this Backend recorded of its keys, once it has expired by the local
// clock (the TTL passed since its last keep-alive), as the current session
// lease is when it is granted again; until then its keys are renewed.
func TestSessionCapRetiredForgotten(t *testing.T) {
	t.Cleanup(etcdbackend.SetSessionKeys(2))
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	var leases []backend.Lease
	for i := range 3 {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("r/%d", i), HolderID: "a", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	full, current := sessionOf(t, cli, prefix+"r/0"), sessionOf(t, cli, prefix+"r/2")
	if full == current || sessionOf(t, cli, prefix+"r/1") != full {
		t.Fatalf("keys on session leases %x, %x, %x: want the first two on one, the third on another", full, sessionOf(t, cli, prefix+"r/1"), current)
	}
	// Renewed, it is kept.
	for i, err := range b.RenewBatch(ctx, leases) {
		if err != nil {
			t.Fatalf("RenewBatch: lease %d: %v", i, err)
		}
	}
	if !etcdbackend.KnowsLease(b, int64(full)) {
		t.Fatal("the full session lease was forgotten while its keys are renewed")
	}
	// Not renewed for its TTL (by the local clock): forgotten at the next
	// keep-alive of any session lease.
	if got := etcdbackend.AgeRetiredSessions(b, 20*time.Second); len(got) != 1 || got[0] != int64(full) {
		t.Fatalf("full session leases: got %x, want [%x]", got, full)
	}
	if errs := b.RenewBatch(ctx, leases[2:]); errs[0] != nil {
		t.Fatalf("RenewBatch of the current session's lease: %v", errs[0])
	}
	if etcdbackend.KnowsLease(b, int64(full)) {
		t.Error("a full session lease expired by the local clock is still recorded")
	}
	if !etcdbackend.KnowsLease(b, int64(current)) {
		t.Error("the current session lease was forgotten")
	}
}
