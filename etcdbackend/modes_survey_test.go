package etcdbackend_test

import (
	"context"
	"errors"
	"path"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
)

// The tests of this file each kill a mutation of modes.go that survived
// every other test (survey X33).

// TestModesDetachedWaiterStaysRegistered: a Detached (NoRenew, MaxHold)
// Exclusive acquisition that fails registers its waiter on the session,
// not on the lease granted for the attempt (revoked as it holds nothing),
// so writer preference holds for it: a new Shared reader is refused. (A
// mutation putting the registration on the attempt's grant survived every
// test.)
func TestModesDetachedWaiterStaysRegistered(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	reader, err := other.AcquireMode(ctx, modeRequest("k", "reader", backend.Shared))
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("k", "writer", backend.Exclusive)
	w.Detached, w.WaitID = true, "writer-wait"
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Detached Exclusive AcquireMode of a key with a reader: got %v, want ErrHeld", err)
	}
	l, err := other.AcquireMode(ctx, modeRequest("k", "late-reader", backend.Shared))
	var held *backend.HeldError
	if !errors.As(err, &held) || held.Waiting != 1 || len(held.Holders) != 0 {
		t.Fatalf("Shared reader while a Detached writer waits: got lease %+v, error %v; want a HeldError with Waiting 1 and no Holders", l, err)
	}
	if err := b.CancelWait(ctx, "k", w.WaitID); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, reader); err != nil {
		t.Fatal(err)
	}
}

// TestModesAcquisitionWithdrawsTheOtherMode: a WaitID registered in one
// mode (here a Fair Shared waiter) that then acquires the key in the other
// (a non-Fair Exclusive acquisition, which does not yield to waiters) has
// its registration deleted by the acquisition, whatever its mode: none is
// left to block Fair acquirers once the lock is released. (A mutation
// deleting only the registration in the acquisition's own mode survived
// every test: the Backend forgot the other one too, so nothing withdrew it
// while the session lived.)
func TestModesAcquisitionWithdrawsTheOtherMode(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	r := modeRequest("k", "w", backend.Shared)
	r.Fair, r.WaitID = true, "w"
	if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Fair Shared AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	x := modeRequest("k", "w", backend.Exclusive)
	x.WaitID = "w"
	l, err := b.AcquireMode(ctx, x)
	if err != nil {
		t.Fatalf("Exclusive AcquireMode, with the WaitID of a Fair Shared registration, of a free key: got %v, want nil", err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	f := modeRequest("k", "fair", backend.Exclusive)
	f.Fair = true
	l, err = other.AcquireMode(ctx, f)
	if err != nil {
		t.Fatalf("Fair AcquireMode of a free key without waiters: got %v, want nil (no registration left)", err)
	}
	if err := other.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestModesSetMetadataKeepsIntentsOnTheLease: SetMetadata rewrites the
// entry's intents on the entry's etcd lease, so they still end with it:
// once a Detached entry's lease is gone (revoked by hand here: its expiry
// in life), an Exclusive lock on the ancestor is free at once. (A mutation
// rewriting the intents without their lease, which left the ancestor
// blocked for good, survived every test.)
func TestModesSetMetadataKeepsIntentsOnTheLease(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	raw := newClient(t, nil, nil)
	for _, m := range []backend.Mode{backend.Exclusive, backend.Shared} {
		top := "t-" + m.String()
		req := modeRequest(top+"/a", "below", m)
		req.Ancestors, req.Detached = []string{top}, true
		l, err := b.AcquireMode(ctx, req)
		if err != nil {
			t.Fatalf("AcquireMode(%v, Detached, below %q): %v", m, top, err)
		}
		if err := b.SetMetadata(ctx, l, map[string]string{"v": "2"}); err != nil {
			t.Fatalf("SetMetadata: %v", err)
		}
		if _, err := raw.Revoke(ctx, clientv3.LeaseID(etcdbackend.LeaseOfToken(l.Token))); err != nil {
			t.Fatalf("Revoke of the entry's lease: %v", err)
		}
		above, err := other.AcquireMode(ctx, modeRequest(top, "above", backend.Exclusive))
		if err != nil {
			t.Fatalf("Exclusive AcquireMode of %q once the %v lock below has lost its lease: got %v, want nil", top, m, err)
		}
		if err := other.Release(ctx, above); err != nil {
			t.Fatal(err)
		}
	}
}

// TestModesLostReplyCleanedUp: a semaphore acquisition whose transaction
// committed but whose reply was lost (its outcome unknown: the caller gives
// the permit up) does not leave its slot taken by nobody: its entry is
// deleted in the background, whichever slot it took, well before the
// session (kept for a minute) would end it, and that clean-up leaves alone
// the permit of another holder on the same session. (Mutations cleaning up
// nothing, only the first slot, or any entry on the session whatever its
// token survived every test.)
func TestModesLostReplyCleanedUp(t *testing.T) {
	ctx := testCtx(t)
	// Set: the reply of the next transaction of b is lost (the transaction
	// reached the store and committed).
	var loseReply atomic.Bool
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if path.Base(method) == "Txn" && err == nil && loseReply.CompareAndSwap(true, false) {
					return status.Error(codes.Unknown, "test: reply lost")
				}
				return err
			}))
	})
	b := newBackend(t, cli, opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	const limit = 3
	first, err := b.AcquireMode(ctx, sharedLimit("sem", "first", limit))
	if err != nil {
		t.Fatal(err)
	}
	loseReply.Store(true)
	_, err = b.AcquireMode(ctx, sharedLimit("sem", "lost", limit))
	var he *backend.HeldError
	if err == nil || errors.As(err, &he) {
		t.Fatalf("AcquireMode with its reply lost: got %v, want a failure", err)
	}
	if loseReply.Load() {
		t.Fatal("AcquireMode sent no transaction")
	}
	electortest.Eventually(t, "the permit of the acquisition whose reply was lost deleted", func() bool {
		recs, err := other.Holders(ctx, "sem")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if r.HolderID == "lost" {
				return false
			}
		}
		return true
	})
	recs, err := other.Holders(ctx, "sem")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].HolderID != "first" || recs[0].Term != first.Term {
		t.Fatalf("Holders after the clean-up: got %+v, want the first permit alone (term %d)", recs, first.Term)
	}
	if err := b.Renew(ctx, first); err != nil {
		t.Fatalf("Renew of the first permit after the clean-up: got %v, want nil", err)
	}
	if err := b.Release(ctx, first); err != nil {
		t.Fatal(err)
	}
}

// sharedLimit returns a Shared request for key by holder with limit.
func sharedLimit(key, holder string, limit int) backend.ModeRequest {
	r := modeRequest(key, holder, backend.Shared)
	r.Limit = limit
	return r
}

// TestModesLeaseTTLIsWhatTheSessionHasLeft: an entry on a session ends
// with the session, so when the session has less than its full TTL left
// (but at least the TTL asked for: no keep-alive is sent), the lease's TTL
// says what is left, never the session's full TTL, which the store would
// not honour. (A mutation reporting the full TTL survived every test: the
// holder would believe its lock lasts longer than the store keeps it.)
func TestModesLeaseTTLIsWhatTheSessionHasLeft(t *testing.T) {
	ctx := testCtx(t)
	b, _ := modesPair(t, nil, nil)
	req := func(key string, m backend.Mode) backend.ModeRequest {
		r := modeRequest(key, "a", m)
		r.TTL = 16 * time.Second // a session of 18 s: 2 s of headroom
		return r
	}
	first, err := b.AcquireMode(ctx, req("first", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	full := 16*time.Second + etcdbackend.SessionHeadroom(16*time.Second)
	etcdbackend.AgeSessions(b, time.Second) // 17 s left of 18: no keep-alive needed
	for _, r := range []backend.ModeRequest{req("x", backend.Exclusive), req("s", backend.Shared), sharedLimit("p", "a", 2)} {
		r.TTL = 16 * time.Second
		l, err := b.AcquireMode(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if l.TTL < r.TTL || l.TTL > full-time.Second {
			t.Errorf("AcquireMode(%v %q, limit %d) on a session with 17 s of 18 left: got Lease.TTL %v, want between %v and %v",
				r.Mode, r.Key, r.Limit, l.TTL, r.TTL, full-time.Second)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Error(err)
		}
	}
	if err := b.Release(ctx, first); err != nil {
		t.Error(err)
	}
}

// TestModesAcquisitionWhoseKeepAliveFailed: an AcquireMode that needed a
// keep-alive of the session (the session had less than the TTL asked for
// left) fails when that keep-alive fails, and gives its entry and intents
// up (deleted in the background, well before the session would end them),
// in every mode: the entry might end before its TTL. (A mutation keeping
// the entry and returning a lease of the session's full TTL survived every
// test.)
func TestModesAcquisitionWhoseKeepAliveFailed(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	var fail failingKeepAlives
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, fail.configure), &etcdbackend.Options{Prefix: prefix, RequestTimeout: 2 * time.Second})
	const ttl = 10 * time.Second // a session of 11 s
	kept, err := b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "kept", HolderID: "a", TTL: ttl}})
	if err != nil {
		t.Fatal(err)
	}
	fail.on.Store(true)
	// The session, as if last kept alive 5 s ago, has 6 s left: less than
	// the TTL, so each acquisition sends a keep-alive with its transaction
	// (which fails: the session's send time stays).
	etcdbackend.AgeSessions(b, 5*time.Second)
	for _, r := range []backend.ModeRequest{
		{AcquireRequest: backend.AcquireRequest{Key: "t/x", HolderID: "a", TTL: ttl}, Ancestors: []string{"t"}},
		{AcquireRequest: backend.AcquireRequest{Key: "t/s", HolderID: "a", TTL: ttl}, Ancestors: []string{"t"}, Mode: backend.Shared},
		{AcquireRequest: backend.AcquireRequest{Key: "t/p", HolderID: "a", TTL: ttl}, Ancestors: []string{"t"}, Mode: backend.Shared, Limit: 2},
	} {
		if got, err := b.AcquireMode(ctx, r); err == nil {
			t.Errorf("AcquireMode(%v %q, limit %d) whose keep-alive failed: got lease %+v, want a failure", r.Mode, r.Key, r.Limit, got)
		}
	}
	electortest.Eventually(t, "the entries and intents of the failed acquisitions given up", func() bool {
		resp, err := raw.Get(ctx, prefix+"t", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			if k := string(kv.Key); k[len(k)-1] != 0 { // not a release marker
				return false
			}
		}
		return true
	})
	fail.on.Store(false)
	if err := b.Release(ctx, kept); err != nil {
		t.Error(err)
	}
}

// TestModesRetryTakesTheRegistrationBack: a waiter registration rides on
// the session of the Backend whose waiter keeps re-trying. When another
// Backend registered the same WaitID since (a wait moved between clients),
// a retry does not count that registration as its own refresh: it puts it
// back on its own session, so the registration outlives the other
// Backend's session (ended by hand here: a crash in life) and new readers
// stay refused. (A mutation taking a registration on any lease for this
// Backend's own survived every test.)
func TestModesRetryTakesTheRegistrationBack(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	opts := &etcdbackend.Options{Prefix: prefix}
	raw := newClient(t, nil, nil)
	a := newBackend(t, newClient(t, nil, nil), opts)
	c := newBackend(t, newClient(t, nil, nil), opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	reader, err := other.AcquireMode(ctx, modeRequest("k", "reader", backend.Shared))
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("k", "writer", backend.Exclusive)
	w.WaitID = "w"
	for _, b := range []*etcdbackend.Backend{a, c} {
		if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("Exclusive AcquireMode of a key with a reader: got %v, want ErrHeld", err)
		}
	}
	resp, err := raw.Get(ctx, prefix+"k\x00wx/w")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the registration: got %v, %v; want one key", resp, err)
	}
	cSession := clientv3.LeaseID(resp.Kvs[0].Lease)
	if _, err := a.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("retry of the waiter on its first Backend: got %v, want ErrHeld", err)
	}
	if _, err := raw.Revoke(ctx, cSession); err != nil {
		t.Fatalf("Revoke of the other Backend's session: %v", err)
	}
	l, err := other.AcquireMode(ctx, modeRequest("k", "late-reader", backend.Shared))
	var held *backend.HeldError
	if !errors.As(err, &held) || held.Waiting != 1 {
		t.Fatalf("Shared reader while the writer keeps re-trying: got lease %+v, error %v; want a HeldError with Waiting 1", l, err)
	}
	if err := a.CancelWait(ctx, "k", w.WaitID); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx, reader); err != nil {
		t.Fatal(err)
	}
}
