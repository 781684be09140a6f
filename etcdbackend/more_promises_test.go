package etcdbackend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestRecordTTLInSeconds: the remaining TTL that Get, List and a HeldError
// report is etcd's, in whole seconds: a key just acquired for a minute has
// most of it left. (A mutation reading etcd's seconds as milliseconds
// survived every test.)
func TestRecordTTLInSeconds(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	b := newBackend(t, newClient(t, nil, nil), opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	check := func(what string, ttl time.Duration) {
		t.Helper()
		// At least 30 s left: the test would have to pause half a minute.
		if ttl < 30*time.Second || ttl > 2*time.Minute {
			t.Errorf("%s: TTL %v, want most of a minute", what, ttl)
		}
	}
	rec, err := other.Get(ctx, "k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	check("Get", rec.TTL)
	recs, err := other.List(ctx, "")
	if err != nil || len(recs) != 1 {
		t.Fatalf("List: got %v, %v; want one record", recs, err)
	}
	check("List", recs[0].TTL)
	_, err = other.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: time.Minute})
	var he *backend.HeldError
	if !errors.As(err, &he) {
		t.Fatalf("Acquire of the held key: got %v, want a HeldError", err)
	}
	check("HeldError", he.Holder.TTL)
}

// TestCancelWaitWithdrawsEitherMode: CancelWait withdraws a waiter's
// registration whatever its mode, Shared as well as Exclusive. (A mutation
// deleting only the Exclusive registration survived every test.)
func TestCancelWaitWithdrawsEitherMode(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	base := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}
	if _, err := b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: base, Mode: backend.Exclusive}); err != nil {
		t.Fatalf("AcquireMode: %v", err)
	}
	waiters := func() int64 {
		t.Helper()
		resp, err := cli.Get(context.WithoutCancel(ctx), prefix+"k\x00w", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	for _, m := range []backend.Mode{backend.Shared, backend.Exclusive} {
		req := backend.ModeRequest{AcquireRequest: base, Mode: m, Fair: true, WaitID: "w-" + m.String()}
		req.HolderID = "b"
		if _, err := b.AcquireMode(ctx, req); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("AcquireMode %v of the held key: got %v, want ErrHeld", m, err)
		}
		if got := waiters(); got != 1 {
			t.Fatalf("after a failed %v acquisition with a WaitID: %d registrations, want 1", m, got)
		}
		if err := b.CancelWait(ctx, "k", req.WaitID); err != nil {
			t.Fatalf("CancelWait: %v", err)
		}
		if got := waiters(); got != 0 {
			t.Errorf("after CancelWait of a %v waiter: %d registrations, want 0", m, got)
		}
	}
}
