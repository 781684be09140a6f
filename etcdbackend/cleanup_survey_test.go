package etcdbackend_test

import (
	"context"
	"errors"
	"path"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
)

// TestAcquisitionWhoseKeepAliveFailed: an Acquire on a session that sends
// a keep-alive with its transaction (the session had less than the TTL
// asked for left) fails when that keep-alive fails, and gives its record
// up, deleted in the background well before the session would end it: the
// record might end before its TTL. (A mutation skipping that clean-up
// survived every test; TestModesAcquisitionWhoseKeepAliveFailed covers
// AcquireMode.)
func TestAcquisitionWhoseKeepAliveFailed(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	var fail failingKeepAlives
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, fail.configure), &etcdbackend.Options{Prefix: prefix, RequestTimeout: 2 * time.Second})
	const ttl = 10 * time.Second // a session of 11 s
	kept, err := b.Acquire(ctx, backend.AcquireRequest{Key: "kept", HolderID: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	fail.on.Store(true)
	// The session, as if last kept alive 5 s ago, has 6 s left: less than
	// the TTL, so the acquisition sends a keep-alive with its transaction
	// (which fails).
	etcdbackend.AgeSessions(b, 5*time.Second)
	if got, err := b.Acquire(ctx, backend.AcquireRequest{Key: "x", HolderID: "a", TTL: ttl}); err == nil {
		t.Fatalf("Acquire whose keep-alive failed: got lease %+v, want a failure", got)
	}
	electortest.Eventually(t, "the record of the failed acquisition given up", func() bool {
		resp, err := raw.Get(ctx, prefix+"x", clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count == 0
	})
	fail.on.Store(false)
	if err := b.Release(ctx, kept); err != nil {
		t.Error(err)
	}
}

// TestFailedReleaseFreesSessionRoom: a lease or entry whose Release failed
// stops counting as held on its session once the background clean-up has
// deleted it, so the session lease, full at the cap, has room again for
// the next acquisition. (Mutations skipping that step after cleanUp or
// cleanUpEntries survived every test.)
func TestFailedReleaseFreesSessionRoom(t *testing.T) {
	for _, entry := range []bool{false, true} {
		t.Run(map[bool]string{false: "Acquire", true: "AcquireMode"}[entry], func(t *testing.T) {
			t.Cleanup(etcdbackend.SetSessionKeys(2))
			ctx := testCtx(t)
			p := startProxy(t, shared.Endpoint(0))
			cli := newClient(t, nil, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.endpoint()} })
			b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix(), RequestTimeout: 500 * time.Millisecond})
			acquire := func(key string) backend.Lease {
				t.Helper()
				var l backend.Lease
				var err error
				if entry {
					l, err = b.AcquireMode(ctx, modeRequest(key, "a", backend.Exclusive))
				} else {
					l, err = b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute})
				}
				if err != nil {
					t.Fatalf("acquire %q: %v", key, err)
				}
				return l
			}
			kept := acquire("kept")
			x := acquire("x")
			session := etcdbackend.LeaseOfToken(kept.Token)
			if got := etcdbackend.LeaseOfToken(x.Token); got != session {
				t.Fatalf("x on lease %x, want the session lease %x (the test needs one)", got, session)
			}
			p.setCut(true)
			if err := b.Release(ctx, x); err == nil || errors.Is(err, backend.ErrLeaseLost) {
				t.Fatalf("Release with the store unreachable: got %v, want a failure", err)
			}
			p.setCut(false)
			electortest.Eventually(t, "x, cleaned up, no longer counted as held", func() bool {
				return !etcdbackend.Owns(b, "x")
			})
			if y := acquire("y"); etcdbackend.LeaseOfToken(y.Token) != session {
				t.Errorf("y on lease %x, want the session lease %x (room freed by x's clean-up)", etcdbackend.LeaseOfToken(y.Token), session)
			}
		})
	}
}

// TestCleanUpEntriesSparesANewPermit: the background clean-up of an entry
// whose Release failed (or whose acquisition's outcome is unknown) is
// owner-checked by its token, also for a permit of a semaphore with a
// limit, whose etcd key (its slot) any permit in that slot shares: when
// this Backend has taken the slot again since, on the same session, the
// clean-up leaves the new permit alone, and so does the clean-up of a
// later acquisition; the clean-up of the new permit's token does delete
// it. (Mutations dropping either bound of the token comparison survived
// every test; TestCleanUpSparesANewRecord covers Acquire's keys.)
func TestCleanUpEntriesSparesANewPermit(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	// Each transaction the Backend's client completes is reported here.
	txns := make(chan struct{}, 64)
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if path.Base(method) == "Txn" {
					select {
					case txns <- struct{}{}:
					default:
					}
				}
				return err
			}))
	})
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	other := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	req := sharedLimit("sem", "a", 1) // one slot
	old, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatalf("AcquireMode: %v", err)
	}
	if err := b.Release(ctx, old); err != nil {
		t.Fatalf("Release: %v", err)
	}
	cur, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatalf("second AcquireMode: %v", err)
	}
	session := etcdbackend.LeaseOfToken(cur.Token)
	if session == 0 || etcdbackend.LeaseOfToken(old.Token) != session {
		t.Fatalf("the two permits went on leases %x and %x: the test needs one session", etcdbackend.LeaseOfToken(old.Token), session)
	}
	// The clean-up waits for its transaction's reply, so one completed
	// transaction after this point is its (nothing else runs here).
	cleanUp := func(l backend.Lease) {
		t.Helper()
		for len(txns) > 0 {
			<-txns
		}
		etcdbackend.CleanUpEntries(b, l)
		select {
		case <-txns:
		case <-time.After(20 * time.Second):
			t.Fatal("the clean-up sent no transaction within 20s")
		}
	}
	holders := func() []backend.Record {
		t.Helper()
		recs, err := other.Holders(ctx, "sem")
		if err != nil {
			t.Fatal(err)
		}
		return recs
	}

	cleanUp(old)
	if recs := holders(); len(recs) != 1 || recs[0].Term != cur.Term {
		t.Fatalf("after the clean-up of the released permit: got %+v, want the new permit (term %d) still there", recs, cur.Term)
	}
	// An acquisition of the slot by this Backend whose outcome is unknown,
	// made after cur (its token sorts after cur's); the slot was taken, so
	// it wrote nothing, and cur stays.
	later := cur
	later.Token = etcdbackend.SessionToken(session, time.Now().Add(time.Hour)) + "-00000000"
	cleanUp(later)
	if recs := holders(); len(recs) != 1 || recs[0].Term != cur.Term {
		t.Fatalf("after the clean-up of a later acquisition: got %+v, want the permit (term %d) still there", recs, cur.Term)
	}
	if err := b.Renew(ctx, cur); err != nil {
		t.Errorf("Renew of the new permit after the clean-ups: got %v, want nil", err)
	}

	cleanUp(cur)
	if recs := holders(); len(recs) != 0 {
		t.Errorf("after the clean-up of the current permit: got %+v, want it deleted", recs)
	}
}
