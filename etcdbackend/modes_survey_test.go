package etcdbackend_test

import (
	"context"
	"errors"
	"path"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
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
// the permit of another holder on the same session; a Detached one revokes
// its grant before it returns, freeing its key and ancestors at once.
// (Mutations cleaning up nothing, only the first slot, or any entry on the
// session whatever its token, or not revoking the grant, survived every
// test.)
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

	// A Detached acquisition revokes its grant before it returns: the key
	// and its ancestor are free at once.
	d := modeRequest("t/d", "lost", backend.Exclusive)
	d.Detached, d.Ancestors = true, []string{"t"}
	loseReply.Store(true)
	if _, err = b.AcquireMode(ctx, d); err == nil || errors.As(err, &he) {
		t.Fatalf("Detached AcquireMode with its reply lost: got %v, want a failure", err)
	}
	above, err := other.AcquireMode(ctx, modeRequest("t", "above", backend.Exclusive))
	if err != nil {
		t.Fatalf("Exclusive AcquireMode of the ancestor right after a Detached acquisition below failed with its reply lost: got %v, want nil", err)
	}
	if err := other.Release(ctx, above); err != nil {
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

// TestModesAcquisitionForgetsSeenHeld: as for Acquire
// (TestAcquireForgetsSeenHeld), an AcquireMode of a key this Backend found
// held before is probed with a read-only transaction first; once one
// succeeds, the next AcquireMode of the key is its transaction alone (one
// request, as the package doc's table says). (A mutation leaving the key
// recorded as seen held survived every test.)
func TestModesAcquisitionForgetsSeenHeld(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	b, other := modesPair(t, &n, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	req := modeRequest("k", "a", backend.Shared)
	if _, err := b.AcquireMode(ctx, req); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	n.reset()
	l, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.byMethod()["Txn"]; got != 2 {
		t.Errorf("AcquireMode of a key found held before: %d transactions (%v), want 2 (the probe, then the acquisition)", got, n.byMethod())
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	n.reset()
	if l, err = b.AcquireMode(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := n.total(); got != 1 {
		t.Errorf("AcquireMode after a successful one: %d requests (%v), want 1 (no probe)", got, n.byMethod())
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// TestModesFairPlaceLostWithTheRegistration: a Fair waiter whose
// registration was withdrawn (CancelWait, here from another Backend; or
// its TTL) has lost its place in line, although its Backend remembers it:
// a waiter that registered after it but is still registered goes first.
// (A mutation dropping the check that the registration is still there
// survived every test.)
func TestModesFairPlaceLostWithTheRegistration(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "holder", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	fair := func(holder, waitID string) backend.ModeRequest {
		r := modeRequest("k", holder, backend.Exclusive)
		r.Fair, r.WaitID = true, waitID
		return r
	}
	first, second := fair("first", "first-wait"), fair("second", "second-wait")
	if _, err := b.AcquireMode(ctx, first); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Fair AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	if err := other.CancelWait(ctx, "k", first.WaitID); err != nil {
		t.Fatal(err)
	}
	if _, err := other.AcquireMode(ctx, second); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Fair AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	l, err := b.AcquireMode(ctx, first)
	var he *backend.HeldError
	if !errors.As(err, &he) || he.Waiting != 1 {
		t.Fatalf("Fair retry of a waiter whose registration was withdrawn, with another waiting: got lease %+v, error %v; want a HeldError with Waiting 1", l, err)
	}
	if l, err = other.AcquireMode(ctx, second); err != nil {
		t.Fatalf("Fair retry of the first waiter in line: got %v, want nil", err)
	}
	if err := other.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := b.CancelWait(ctx, "k", first.WaitID); err != nil {
		t.Fatal(err)
	}
}

// TestModesLimitMismatchRegistersNothing: a Fair Shared acquisition whose
// limit differs from the live holders' fails with ErrLimitMismatch and
// writes nothing, not even its waiter registration, which would hold up
// every Fair acquirer of the key. (A mutation registering it anyway
// survived every test.)
func TestModesLimitMismatchRegistersNothing(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	p, err := other.AcquireMode(ctx, sharedLimit("k", "permit", 3))
	if err != nil {
		t.Fatal(err)
	}
	r := sharedLimit("k", "mismatch", 2)
	r.Fair, r.WaitID = true, "mismatch-wait"
	if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrLimitMismatch) {
		t.Fatalf("Fair Shared AcquireMode with limit 2, holders of 3: got %v, want ErrLimitMismatch", err)
	}
	f := sharedLimit("k", "fair", 3)
	f.Fair = true
	l, err := other.AcquireMode(ctx, f)
	if err != nil {
		t.Fatalf("Fair Shared AcquireMode with a free permit and no waiter: got %v, want nil", err)
	}
	for _, x := range []backend.Lease{l, p} {
		if err := other.Release(ctx, x); err != nil {
			t.Error(err)
		}
	}
}

// TestModesWithdrawalBegunDuringTheProbe: a waiter's retry whose read-only
// probe is under way when its Backend begins withdrawing the registration
// as due (the probe was sent with no withdrawal under way, and finds the
// registration still there) does not count that read as a refresh: it puts
// the registration again, which the withdrawal's delete then leaves alone,
// so a Shared reader that comes after the retry is refused. (A mutation
// trusting the probe whenever it found the registration survived every
// test; TestModesRetryDuringWithdrawal covers a withdrawal begun before
// the probe was sent.)
func TestModesWithdrawalBegunDuringTheProbe(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	var (
		b       *etcdbackend.Backend
		armed   atomic.Bool
		at      time.Time // the instant the withdrawal runs at
		proceed = make(chan struct{})
		done    = make(chan struct{})
	)
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if tr, ok := req.(*etcdserverpb.TxnRequest); ok && readOnly(tr) && armed.CompareAndSwap(true, false) {
					// The probe is on its way: a withdrawal begins, and
					// waits before its delete until the retry is over.
					began := make(chan struct{})
					etcdbackend.OnWithdrawal(b, func(stage string) {
						if stage == "delete" {
							close(began)
							<-proceed
						}
					})
					go func() {
						defer close(done)
						etcdbackend.ExpireRegistrations(b, at)
					}()
					<-began
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}))
	})
	b = newBackend(t, cli, opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Shared))
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("k", "waiter", backend.Exclusive)
	w.WaitID = "wait"
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	at = time.Now().Add(w.TTL + time.Second) // the registration is due
	armed.Store(true)
	_, err = b.AcquireMode(ctx, w)
	close(proceed)
	if armed.Load() {
		t.Fatal("the waiter's retry sent no read-only probe")
	}
	<-done
	etcdbackend.OnWithdrawal(b, nil)
	if !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("the waiter's retry: got %v, want ErrHeld", err)
	}
	var he *backend.HeldError
	l, err := other.AcquireMode(ctx, modeRequest("k", "reader", backend.Shared))
	if err == nil {
		_ = other.Release(ctx, l)
	}
	if !errors.As(err, &he) || he.Waiting != 1 {
		t.Errorf("Shared reader after the waiter's retry: got %v, want a HeldError with Waiting 1 (the retry keeps the waiter registered)", err)
	}
	if err := b.CancelWait(ctx, "k", w.WaitID); err != nil {
		t.Error(err)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Error(err)
	}
}

// TestModesWaitingCountsExclusiveWaitersOnly: a Shared acquisition that is
// not Fair yields to Exclusive waiters alone (writer preference), so its
// HeldError's Waiting does not count a Fair Shared waiter of the key: a
// full semaphore with one such waiter refuses it naming the permit holder,
// with Waiting 0. (A mutation counting every waiter survived every test.)
func TestModesWaitingCountsExclusiveWaitersOnly(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	p, err := other.AcquireMode(ctx, sharedLimit("k", "permit", 1))
	if err != nil {
		t.Fatal(err)
	}
	f := sharedLimit("k", "fair", 1)
	f.Fair, f.WaitID = true, "fair-wait"
	if _, err := other.AcquireMode(ctx, f); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Fair Shared AcquireMode of a full semaphore: got %v, want ErrHeld", err)
	}
	_, err = b.AcquireMode(ctx, sharedLimit("k", "plain", 1))
	var he *backend.HeldError
	if !errors.As(err, &he) || len(he.Holders) != 1 || he.Holders[0].Term != p.Term || he.Waiting != 0 {
		t.Fatalf("Shared AcquireMode of a full semaphore with a Fair Shared waiter: got %v (%+v), want a HeldError naming the permit (term %d) with Waiting 0", err, he, p.Term)
	}
	if err := other.CancelWait(ctx, "k", f.WaitID); err != nil {
		t.Error(err)
	}
	if err := other.Release(ctx, p); err != nil {
		t.Error(err)
	}
}

// TestModesFairWaitingLeavesOutItsOwnRegistration: a Fair waiter whose
// WaitID was registered in the other mode (its registration is replaced in
// the same transaction) is not counted ahead of itself: alone in line, its
// HeldError says Waiting 0. (A mutation counting the registration in the
// other mode survived every test.)
func TestModesFairWaitingLeavesOutItsOwnRegistration(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "holder", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []backend.Mode{backend.Exclusive, backend.Shared, backend.Exclusive} {
		r := modeRequest("k", "w", m)
		r.Fair, r.WaitID = true, "w"
		_, err := b.AcquireMode(ctx, r)
		var he *backend.HeldError
		if !errors.As(err, &he) || len(he.Holders) != 1 || he.Holders[0].Term != held.Term || he.Waiting != 0 {
			t.Fatalf("Fair %v AcquireMode, alone in line: got %v (%+v), want a HeldError naming the holder (term %d) with Waiting 0", m, err, he, held.Term)
		}
	}
	if err := b.CancelWait(ctx, "k", "w"); err != nil {
		t.Error(err)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Error(err)
	}
}

// TestModesAncestorSharedWaitersNotCounted: only Exclusive waiters on an
// ancestor hold up a hierarchical lock below; when they do, the HeldError
// names the outermost ancestor that has any and counts them alone: a Fair
// Shared waiter on an ancestor further out (waiting for a full semaphore)
// is neither named nor counted. (A mutation counting every waiter of the
// ancestors survived every test.)
func TestModesAncestorSharedWaitersNotCounted(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	// On "t": a full semaphore and a Fair Shared waiter for it.
	permit, err := other.AcquireMode(ctx, sharedLimit("t", "permit", 1))
	if err != nil {
		t.Fatal(err)
	}
	sw := sharedLimit("t", "shared-waiter", 1)
	sw.Fair, sw.WaitID = true, "shared-wait"
	if _, err := other.AcquireMode(ctx, sw); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Fair Shared AcquireMode of a full semaphore: got %v, want ErrHeld", err)
	}
	// On "t/a": a reader and an Exclusive waiter.
	reader, err := other.AcquireMode(ctx, modeRequest("t/a", "reader", backend.Shared))
	if err != nil {
		t.Fatal(err)
	}
	xw := modeRequest("t/a", "writer", backend.Exclusive)
	xw.WaitID = "writer-wait"
	if _, err := other.AcquireMode(ctx, xw); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Exclusive AcquireMode of a key with a reader: got %v, want ErrHeld", err)
	}
	below := modeRequest("t/a/b", "below", backend.Shared)
	below.Ancestors = []string{"t", "t/a"}
	l, err := b.AcquireMode(ctx, below)
	var he *backend.HeldError
	if !errors.As(err, &he) || len(he.Holders) != 0 || he.Waiting != 1 || he.Holder.Key != "t/a" {
		t.Fatalf("Shared AcquireMode of %q below an Exclusive waiter on %q: got lease %+v, error %v (%+v); want a HeldError with no Holders, Waiting 1, Holder.Key %q",
			below.Key, "t/a", l, err, he, "t/a")
	}
	for _, c := range []struct{ key, id string }{{"t", sw.WaitID}, {"t/a", xw.WaitID}} {
		if err := other.CancelWait(ctx, c.key, c.id); err != nil {
			t.Error(err)
		}
	}
	for _, x := range []backend.Lease{permit, reader} {
		if err := other.Release(ctx, x); err != nil {
			t.Error(err)
		}
	}
}

// TestModesAncestorMustBeAValidKey: every ancestor must pass ValidateKey
// (the backend.Modes contract): one that ends with "/heartbeat", although
// a proper prefix of a valid key, is refused with ErrInvalid before any
// request. (A mutation checking the key alone survived every test.)
func TestModesAncestorMustBeAValidKey(t *testing.T) {
	ctx := testCtx(t)
	b, _ := modesPair(t, nil, nil)
	r := modeRequest("a/heartbeat-x", "a", backend.Exclusive)
	if err := b.ValidateKey(r.Key); err != nil {
		t.Fatalf("ValidateKey(%q): %v", r.Key, err)
	}
	r.Ancestors = []string{"a/heartbeat"}
	if l, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("AcquireMode(%q) below %q: got lease %+v, error %v; want ErrInvalid", r.Key, r.Ancestors[0], l, err)
	}
}

// TestModesCancelWaitRefusesAnEmptyWaitID: CancelWait with an empty wait
// ID is ErrInvalid (the backend.Modes contract), not a silent no-op. (A
// mutation accepting it survived every test.)
func TestModesCancelWaitRefusesAnEmptyWaitID(t *testing.T) {
	ctx := testCtx(t)
	b, _ := modesPair(t, nil, nil)
	if err := b.CancelWait(ctx, "k", ""); !errors.Is(err, backend.ErrInvalid) {
		t.Fatalf("CancelWait with an empty wait ID: got %v, want ErrInvalid", err)
	}
}

// TestModesFailedDetachedAttemptRevokesItsGrant: a Detached acquisition
// that finds its key held revokes the etcd lease it was granted for the
// attempt (which holds nothing) before it returns: failed attempts leave
// no lease behind for their TTL. (A mutation leaving the grant to expire
// survived every test.)
func TestModesFailedDetachedAttemptRevokesItsGrant(t *testing.T) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	raw := newClient(t, nil, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "holder", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	leases := func() int {
		t.Helper()
		resp, err := raw.Leases(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Leases)
	}
	// No other test runs meanwhile: leases of earlier ones may only end.
	before := leases()
	for _, m := range []backend.Mode{backend.Exclusive, backend.Shared} {
		r := modeRequest("k", "detached", m)
		r.Detached = true
		if _, err := b.AcquireMode(ctx, r); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("Detached %v AcquireMode of a held key: got %v, want ErrHeld", m, err)
		}
	}
	if after := leases(); after > before {
		t.Errorf("after 2 failed Detached attempts: %d leases on the server, want at most the %d before", after, before)
	}
	if err := other.Release(ctx, held); err != nil {
		t.Error(err)
	}
}
