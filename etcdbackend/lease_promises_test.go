package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
)

// TestDetachedReleaseIsOwnerChecked: Renew, Release and SetMetadata of a
// Detached lease act only while the store holds exactly that lease: once
// its key was deleted and acquired by another holder, they report
// backend.ErrLeaseLost and leave the new holder's record as it is. (A
// mutation dropping the owner check of a Detached Release, which then
// deleted the new holder's record and returned nil, survived every test.)
func TestDetachedReleaseIsOwnerChecked(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	other := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	for _, detachedOther := range []bool{false, true} {
		key := "k"
		if detachedOther {
			key = "k-detached"
		}
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute, Detached: true})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if _, err := raw.Delete(ctx, prefix+key); err != nil {
			t.Fatal(err)
		}
		newer, err := other.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "b", TTL: time.Minute, Detached: detachedOther})
		if err != nil {
			t.Fatalf("Acquire by another holder after the deletion: %v", err)
		}
		if err := b.SetMetadata(ctx, l, map[string]string{"stale": "yes"}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("%q: SetMetadata of the lost lease: got %v, want ErrLeaseLost", key, err)
		}
		if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("%q: Renew of the lost lease: got %v, want ErrLeaseLost", key, err)
		}
		if err := b.Release(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("%q: Release of the lost lease: got %v, want ErrLeaseLost", key, err)
		}
		rec, err := other.Get(ctx, key)
		switch {
		case err != nil:
			t.Errorf("%q: Get after the stale calls: %v, want the new holder's record", key, err)
		case rec.Token != newer.Token || rec.Term != newer.Term || rec.Metadata != nil:
			t.Errorf("%q: record after the stale calls: token %s, term %d, metadata %v; want token %s, term %d, no metadata",
				key, rec.Token, rec.Term, rec.Metadata, newer.Token, newer.Term)
		}
		if err := other.Renew(ctx, newer); err != nil {
			t.Errorf("%q: Renew by the new holder: %v", key, err)
		}
	}
}

// TestDetachedOwnerCheckComparesLeaseAndRevision: the owner check of a
// Detached lease compares the etcd lease its record is attached to and
// the record's create revision (its term), not only the token and holder
// in its value: a record written again by hand with the same value, but
// without its etcd lease (it would never expire) or as a new key (another
// term), is no longer that lease. (A mutation dropping the comparison of
// the attached etcd lease survived every test.)
func TestDetachedOwnerCheckComparesLeaseAndRevision(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	for _, c := range []struct {
		name    string
		rewrite func(k, value string, id clientv3.LeaseID) error
	}{
		{"written again without its etcd lease", func(k, value string, _ clientv3.LeaseID) error {
			_, err := raw.Put(ctx, k, value)
			return err
		}},
		{"deleted and written again with its etcd lease", func(k, value string, id clientv3.LeaseID) error {
			if _, err := raw.Delete(ctx, k); err != nil {
				return err
			}
			_, err := raw.Put(ctx, k, value, clientv3.WithLease(id))
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			key := c.name
			l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute, Detached: true})
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			k := prefix + key
			resp, err := raw.Get(ctx, k)
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("raw Get: got %v, %v; want the record", resp, err)
			}
			value := string(resp.Kvs[0].Value)
			if err := c.rewrite(k, value, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
				t.Fatal(err)
			}
			if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
				t.Errorf("Renew: got %v, want ErrLeaseLost", err)
			}
			if err := b.SetMetadata(ctx, l, map[string]string{"stale": "yes"}); !errors.Is(err, backend.ErrLeaseLost) {
				t.Errorf("SetMetadata: got %v, want ErrLeaseLost", err)
			}
			if err := b.Release(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
				t.Errorf("Release: got %v, want ErrLeaseLost", err)
			}
			after, err := raw.Get(ctx, k)
			if err != nil || len(after.Kvs) != 1 || string(after.Kvs[0].Value) != value {
				t.Errorf("after the calls: got %v, %v; want the record written by hand, unchanged", after, err)
			}
		})
	}
}

// TestSessionLeaseTTLIsWhatTheSessionHasLeft: an acquisition on a session
// that sends no keep-alive of its own (the session was kept alive within
// its headroom) reports as Lease.TTL what the session has left from the
// acquisition's send time, which is less than the session's granted TTL:
// the key ends with the session, not a granted TTL after the acquisition.
// (A mutation reporting the session's granted TTL survived every test.)
func TestSessionLeaseTTLIsWhatTheSessionHasLeft(t *testing.T) {
	ctx := testCtx(t)
	const ttl = 80 * time.Second // a session of 90 s: 10 s of headroom
	headroom := etcdbackend.SessionHeadroom(ttl)
	const aged = 5 * time.Second // within the headroom, with 5 s to spare
	var n counter
	b := newBackend(t, newClient(t, nil, n.configure), &etcdbackend.Options{Prefix: newPrefix()})
	first, err := b.Acquire(ctx, backend.AcquireRequest{Key: "a", HolderID: "a", TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if first.TTL != ttl+headroom {
		t.Fatalf("first acquisition, sent before the grant: TTL %v, want the session's %v", first.TTL, ttl+headroom)
	}
	etcdbackend.AgeSessions(b, aged)
	n.reset()
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "b", HolderID: "a", TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if got := n.byMethod()["LeaseKeepAlive"]; got != 0 {
		// Only if the test paused for the rest of the headroom.
		t.Fatalf("the second acquisition sent %d keep-alives, want 0", got)
	}
	if l.TTL < ttl || l.TTL > ttl+headroom-aged {
		t.Errorf("acquisition %v after the session's last keep-alive: TTL %v, want between %v and %v", aged, l.TTL, ttl, ttl+headroom-aged)
	}
}

// failingKeepAlives makes, while it is set, every lease keep-alive of a
// client fail before it reaches the server: a keep-alive stream cannot be
// opened, and a message sent on one already open fails (breaking it).
type failingKeepAlives struct{ on atomic.Bool }

var errInjected = errors.New("injected keep-alive failure")

// configure adds the failing interceptor to cfg.
func (f *failingKeepAlives) configure(cfg *clientv3.Config) {
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainStreamInterceptor(
		func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if path.Base(method) != "LeaseKeepAlive" {
				return streamer(ctx, desc, cc, method, opts...)
			}
			if f.on.Load() {
				return nil, errInjected
			}
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return s, err
			}
			return &failingSends{ClientStream: s, f: f}, nil
		}))
}

// failingSends fails each message sent while failingKeepAlives is set.
type failingSends struct {
	grpc.ClientStream
	f *failingKeepAlives
}

func (s *failingSends) SendMsg(m any) error {
	if s.f.on.Load() {
		return errInjected
	}
	return s.ClientStream.SendMsg(m)
}

// TestFailedKeepAliveIsNoRenewal: a renewal or an acquisition on a session
// whose keep-alive fails (the store cannot be reached for it) does not
// succeed on the owner check alone: Renew and RenewBatch report the
// failure, for a plain key and an entry of backend.Modes alike (not
// backend.ErrLeaseLost: the lease may still be there), as
// does a Heartbeat whose record is in place, and an
// acquisition that needed the keep-alive (the session had less than its TTL
// left) fails and gives its key up. Once keep-alives go through again, the
// lease renews. (Mutations making Renew, of a key or an entry, or
// RenewBatch ignore a keep-alive failure, the acquisition keep the key when its keep-alive failed, and
// the keep-alive fall back to success when its stream cannot be opened,
// survived every test.)
func TestFailedKeepAliveIsNoRenewal(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	var fail failingKeepAlives
	raw := newClient(t, nil, nil)
	b := newBackend(t, newClient(t, nil, fail.configure), &etcdbackend.Options{Prefix: prefix, RequestTimeout: 2 * time.Second})
	const ttl = 10 * time.Second
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: ttl})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if err := b.Heartbeat(ctx, "k", "a", ttl); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	entry, err := b.AcquireMode(ctx, backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: "e", HolderID: "a", TTL: ttl}, Mode: backend.Shared, Limit: 2,
	})
	if err != nil {
		t.Fatalf("AcquireMode: %v", err)
	}
	fail.on.Store(true)
	renewed := func(what string, err error) {
		t.Helper()
		if err == nil || errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("%s with its keep-alive failing: got %v, want a failure other than ErrLeaseLost", what, err)
		}
	}
	renewed("Renew", b.Renew(ctx, l))
	renewed("RenewBatch", b.RenewBatch(ctx, []backend.Lease{l})[0])
	renewed("Heartbeat", b.Heartbeat(ctx, "k", "a", ttl))
	renewed("Renew of an entry", b.Renew(ctx, entry))
	renewed("RenewBatch of an entry", b.RenewBatch(ctx, []backend.Lease{entry})[0])
	// The session, as if last kept alive 5 s ago, has 6 s left: less than
	// the TTL, so the acquisition sends a keep-alive with its transaction.
	etcdbackend.AgeSessions(b, 5*time.Second)
	if got, err := b.Acquire(ctx, backend.AcquireRequest{Key: "needs-keepalive", HolderID: "a", TTL: ttl}); err == nil {
		t.Errorf("Acquire whose keep-alive failed: got lease %+v, want a failure", got)
	}
	electortest.Eventually(t, "the key of the failed acquisition given up", func() bool {
		resp, err := raw.Get(ctx, prefix+"needs-keepalive", clientv3.WithCountOnly())
		return err == nil && resp.Count == 0
	})
	fail.on.Store(false)
	if err := b.Renew(ctx, l); err != nil {
		t.Errorf("Renew once keep-alives go through: %v", err)
	}
	if err := b.Renew(ctx, entry); err != nil {
		t.Errorf("Renew of the entry once keep-alives go through: %v", err)
	}
}

// TestSessionExpiredByTheLocalClockGrantedAgain: a session lease whose TTL
// has passed, by the local clock, since the send time of its last grant or
// keep-alive that succeeded has ended at the server too (which counts from
// the receipt, later): the next acquisition grants a new session at once
// (a grant and the transaction), without first trying the old one (a
// transaction and a keep-alive that fail, then the same). (Mutations
// reusing a session expired by the local clock survived every test.)
func TestSessionExpiredByTheLocalClockGrantedAgain(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	var n counter
	cli := newClient(t, nil, n.configure)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	const ttl = 10 * time.Second // a session of 11 s
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "a", HolderID: "a", TTL: ttl}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	old := sessionOf(t, cli, prefix+"a")
	// As if 12 s had passed without a keep-alive: the server has ended the
	// session (revoked here, as its expiry would).
	etcdbackend.AgeSessions(b, ttl+etcdbackend.SessionHeadroom(ttl)+time.Second)
	if _, err := cli.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	n.reset()
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "b", HolderID: "a", TTL: ttl}); err != nil {
		t.Fatalf("Acquire after the session expired: %v", err)
	}
	if got, want := n.byMethod(), map[string]int64{"LeaseGrant": 1, "Txn": 1}; !maps.Equal(got, want) {
		t.Errorf("requests of the acquisition after the session expired: got %v, want %v", got, want)
	}
	if got := sessionOf(t, cli, prefix+"b"); got == old {
		t.Errorf("the acquisition is on the expired session %x", old)
	}
}

// TestRenewBatchOfAnotherBackendsSession: RenewBatch renews a lease on a
// session lease that this Backend does not know (another Backend's) with
// Renew, owner-checked by its token, instead of taking it as lost because
// it holds no keys there. (A mutation checking such a lease against this
// Backend's own record of keys, which lost it, survived every test.)
func TestRenewBatchOfAnotherBackendsSession(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	owner := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	// b holds a key on a session of its own, of the same TTL.
	mine, err := b.Acquire(ctx, backend.AcquireRequest{Key: "mine", HolderID: "b", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	theirs, err := owner.Acquire(ctx, backend.AcquireRequest{Key: "theirs", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	for i, err := range b.RenewBatch(ctx, []backend.Lease{mine, theirs}) {
		if err != nil {
			t.Errorf("RenewBatch: lease %d: got %v, want nil", i, err)
		}
	}
	if _, err := raw.Delete(ctx, prefix+"theirs"); err != nil {
		t.Fatal(err)
	}
	errs := b.RenewBatch(ctx, []backend.Lease{mine, theirs})
	if errs[0] != nil {
		t.Errorf("RenewBatch after the other key's deletion: own lease: got %v, want nil", errs[0])
	}
	if !errors.Is(errs[1], backend.ErrLeaseLost) {
		t.Errorf("RenewBatch after its deletion: the other Backend's lease: got %v, want ErrLeaseLost", errs[1])
	}
}

// TestSessionCapRetiredKeptAlive: a full session lease whose keys are
// renewed is kept alive by those renewals, and its keep-alives count: it is
// not forgotten by the local clock while it lives, though its grant is
// older than its TTL. (A mutation that did not record the keep-alives of a
// full session lease, which was then forgotten a TTL after its grant and
// its keys renewed one by one, and one forgetting it at half its TTL,
// survived every test.)
func TestSessionCapRetiredKeptAlive(t *testing.T) {
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
	full := sessionOf(t, cli, prefix+"r/0")
	if sessionOf(t, cli, prefix+"r/2") == full {
		t.Fatalf("all keys on session lease %x: want the third on another", full)
	}
	// Its grant as if 8 s ago (of a TTL of 11 s), then a keep-alive now.
	etcdbackend.AgeRetiredSessions(b, 8*time.Second)
	for i, err := range b.RenewBatch(ctx, leases) {
		if err != nil {
			t.Fatalf("RenewBatch: lease %d: %v", i, err)
		}
	}
	// 8 s after that keep-alive, 16 s after its grant: still alive (and
	// past half its TTL).
	etcdbackend.AgeRetiredSessions(b, 8*time.Second)
	if errs := b.RenewBatch(ctx, leases[2:]); errs[0] != nil {
		t.Fatalf("RenewBatch of the current session's lease: %v", errs[0])
	}
	if !etcdbackend.KnowsLease(b, int64(full)) {
		t.Error("a full session lease kept alive 8 s ago (TTL 11 s) was forgotten")
	}
}

// brokenReplies makes, while it is set, the lease keep-alive streams of a
// client fail when a reply arrives, as a stream broken by the connection
// does after its request went out.
type brokenReplies struct{ on atomic.Bool }

// configure adds the breaking interceptor to cfg.
func (f *brokenReplies) configure(cfg *clientv3.Config) {
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainStreamInterceptor(
		func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil || path.Base(method) != "LeaseKeepAlive" {
				return s, err
			}
			return &brokenRecv{ClientStream: s, f: f}, nil
		}))
}

// brokenRecv fails each message received while brokenReplies is set.
type brokenRecv struct {
	grpc.ClientStream
	f *brokenReplies
}

func (s *brokenRecv) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil && s.f.on.Load() {
		return errInjected
	}
	return err
}

// TestBrokenKeepAliveStreamFailsItsWaiters: a keep-alive whose stream
// breaks while it awaits its reply fails at once with the stream's error,
// instead of waiting for a reply that will never come until its context
// ends (the request timeout): a renewal learns of the break while it can
// still be retried. (A mutation leaving the waiters of a broken stream
// waiting survived every test.)
func TestBrokenKeepAliveStreamFailsItsWaiters(t *testing.T) {
	ctx := testCtx(t)
	var broken brokenReplies
	b := newBackend(t, newClient(t, nil, broken.configure), &etcdbackend.Options{Prefix: newPrefix(), RequestTimeout: 5 * time.Second})
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	broken.on.Store(true)
	err = b.Renew(ctx, l)
	broken.on.Store(false)
	if !errors.Is(err, errInjected) {
		t.Errorf("Renew whose keep-alive stream broke before its reply: got %v, want the stream's error", err)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Errorf("Renew on a new stream: %v", err)
	}
}

// TestHeartbeatSessionCountsFromSendTime: a heartbeat session counts what
// its lease has left from the send time of its last keep-alive, not from
// the arrival of the reply: after a keep-alive whose reply came late, the
// next batch sends a keep-alive when the lease, counted from that send
// time, would have less than a quarter of its TTL left at the batch after
// it. (A mutation recording the reply's arrival survived every test.)
// Records of 8 s: a keep-alive answered 4 s late, then a batch at once,
// the next expected 4 s later (the gap just seen): counted from the send
// time, 8 − 4 − 4 = 0 s would be left then, less than 2 s; counted from
// the reply, 4 s, and no keep-alive would be sent.
func TestHeartbeatSessionCountsFromSendTime(t *testing.T) {
	ctx := testCtx(t)
	const ttl = 8 * time.Second
	late := &lateReplies{lag: 4 * time.Second}
	var n counter
	b := newBackend(t, newClient(t, nil, func(cfg *clientv3.Config) {
		n.configure(cfg)
		late.configure(cfg)
	}), &etcdbackend.Options{Prefix: newPrefix()})
	reqs := hbReqs(1, ttl)
	batch := func(what string) {
		t.Helper()
		for i, err := range b.HeartbeatBatch(ctx, reqs) {
			if err != nil {
				t.Fatalf("%s: heartbeat %d: %v", what, i, err)
			}
		}
	}
	batch("first batch")
	// The next batch sends a keep-alive (8 − 7 − 1 = 0 s would be left at
	// the one after it) and no look-up.
	if !etcdbackend.SetHeartbeatClocks(b, 8, 7*time.Second, 0, time.Second) {
		t.Fatal("no heartbeat session of 8 s")
	}
	late.kas.Store(true)
	n.reset()
	batch("batch with a keep-alive answered late")
	late.kas.Store(false)
	if got := n.byMethod()["LeaseKeepAlive"]; got != 1 {
		t.Fatalf("batch with the lease's keep-alive due: %d keep-alives, want 1", got)
	}
	n.reset()
	batch("batch after it")
	if got := n.byMethod()["LeaseKeepAlive"]; got != 1 {
		t.Errorf("batch after a keep-alive answered late: %d keep-alives, want 1 (%v)", got, n.byMethod())
	}
}

// TestHeartbeatsLeaveASessionNotLookedUp: heartbeat records ride on a
// session of plain acquisitions only while RenewBatch has looked its keys
// up within 0.6 of its TTL (they stay on it when the look-up is 5.5 s old
// at TTL 10 s, as with renewals every TTL/2 whose look-up is recorded just
// after the batch); once it has not (its keys are renewed otherwise,
// or not at all), the next batch moves them back to the heartbeat
// session's own lease, whose look-ups find a record deleted by hand. (A
// mutation keeping them on a session not looked up for up to the records'
// TTL survived every test.)
func TestHeartbeatsLeaveASessionNotLookedUp(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "e", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	host := sessionOf(t, cli, prefix+"e")
	reqs := hbReqs(1, 15*time.Second)
	batch := func() {
		t.Helper()
		etcdbackend.SetHeartbeatClocks(b, 15, 5*time.Second, 5*time.Second, 5*time.Second)
		for i, err := range b.HeartbeatBatch(ctx, reqs) {
			if err != nil {
				t.Fatalf("heartbeat %d: %v", i, err)
			}
		}
	}
	for i, err := range b.HeartbeatBatch(ctx, reqs) {
		if err != nil {
			t.Fatalf("first batch: heartbeat %d: %v", i, err)
		}
	}
	own := etcdbackend.HeartbeatSessionLease(b, 15)
	if err := b.RenewBatch(ctx, []backend.Lease{l})[0]; err != nil {
		t.Fatalf("RenewBatch: %v", err)
	}
	batch()
	if got := sessionOf(t, cli, prefix+"hb/0/heartbeat/a"); got != host {
		t.Fatalf("record on lease %x after a look-up of the held key's session, want that session %x", got, host)
	}
	// The session's keys last looked up 5.5 s ago: more than half its TTL
	// (10 s), less than 0.6 of it. A renewal every TTL/2 whose look-up is
	// recorded just after a batch leaves them so: the records stay.
	etcdbackend.AgeHostLookups(b, 5500*time.Millisecond)
	batch()
	if got := sessionOf(t, cli, prefix+"hb/0/heartbeat/a"); got != host {
		t.Fatalf("record on lease %x after the session went 5.5 s without a look-up, want that session %x still", got, host)
	}
	// 7 s (in all): more than 0.6 of its TTL, less than the records' TTL
	// (15 s).
	etcdbackend.AgeHostLookups(b, 1500*time.Millisecond)
	batch()
	if got := sessionOf(t, cli, prefix+"hb/0/heartbeat/a"); int64(got) != own {
		t.Errorf("record on lease %x after the session went 7 s without a look-up, want the heartbeat session's own %x", got, own)
	}
}

// TestHeartbeatBatchWriteFindsLeaseGone: a batch whose write finds its
// heartbeat session's lease gone (revoked, or expired unnoticed, before
// its keep-alive or look-up was due) grants a new lease and writes every
// record of the batch on it, in the same batch, instead of failing until
// a keep-alive or look-up is due. (A mutation that kept the lost lease
// after such a write survived every test.)
func TestHeartbeatBatchWriteFindsLeaseGone(t *testing.T) {
	ctx := testCtx(t)
	const ttl = 15 * time.Second
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	opts := &etcdbackend.Options{Prefix: prefix}
	b := newBackend(t, cli, opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	for i, err := range b.HeartbeatBatch(ctx, hbReqs(1, ttl)) {
		if err != nil {
			t.Fatalf("first batch: heartbeat %d: %v", i, err)
		}
	}
	old := etcdbackend.HeartbeatSessionLease(b, 15)
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatal(err)
	}
	// Neither the keep-alive nor the look-up is due; hb/1 is new, to be
	// written.
	etcdbackend.SetHeartbeatClocks(b, 15, time.Second, time.Second, time.Second)
	for i, err := range b.HeartbeatBatch(ctx, hbReqs(2, ttl)) {
		if err != nil {
			t.Errorf("batch after the lease was revoked: heartbeat %d: %v", i, err)
		}
	}
	if got := etcdbackend.HeartbeatSessionLease(b, 15); got == old || got == 0 {
		t.Errorf("heartbeat session lease after the batch: %x, want a new one (the old: %x)", got, old)
	}
	for _, key := range []string{"hb/0", "hb/1"} {
		if ids := hbMembers(t, other, key); len(ids) != 1 {
			t.Errorf("Members(%q) after the batch: got %v, want a", key, ids)
		}
	}
}

// TestRenewalDuringAnAcquisitionSparesItsKey: a RenewBatch whose look-up
// of the session's keys runs after an acquisition's transaction committed,
// but before the acquisition recorded its key as held, leaves that key
// alone (it is in flight, not an orphan): the acquisition returns a lease
// whose key is there and renews. The renewal runs from the acquisition's
// transaction's reply, so the order does not depend on timing. (A
// mutation that did not mark the acquisition in flight, whose key the
// renewal then deleted as an orphan, survived every test.)
func TestRenewalDuringAnAcquisitionSparesItsKey(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	var (
		during atomic.Pointer[func()] // run once, after the next transaction's reply
		b      *etcdbackend.Backend
	)
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				err := invoker(ctx, method, req, reply, cc, opts...)
				if path.Base(method) == "Txn" {
					if f := during.Swap(nil); f != nil {
						(*f)()
					}
				}
				return err
			}))
	})
	b = newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	held, err := b.Acquire(ctx, backend.AcquireRequest{Key: "held", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	renewed := false
	renew := func() {
		renewed = true
		if err := b.RenewBatch(ctx, []backend.Lease{held})[0]; err != nil {
			t.Errorf("RenewBatch during the acquisition: %v", err)
		}
	}
	during.Store(&renew)
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "new", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if !renewed {
		t.Fatal("no renewal ran during the acquisition")
	}
	if got := sessionOf(t, cli, prefix+"new"); int64(got) != etcdbackend.LeaseOfToken(held.Token) {
		t.Fatalf("the new key is on lease %x, want the held key's session", got)
	}
	for i, err := range b.RenewBatch(ctx, []backend.Lease{held, l}) {
		if err != nil {
			t.Errorf("RenewBatch after the acquisition: lease %d: %v", i, err)
		}
	}
}

// TestModesEntryLostIsOwnerChecked: Release of a Detached entry whose
// holder key is gone (deleted by hand, the key taken by another holder
// since) reports backend.ErrLeaseLost and leaves the new holder alone; and
// SetMetadata of an entry that lost an intent (deleted by hand) reports
// backend.ErrLeaseLost instead of writing the intent again: the entry no
// longer protects its tree. (Mutations dropping the owner check of a
// Detached entry's Release, and the intents from SetMetadata's check,
// survived every test.)
func TestModesEntryLostIsOwnerChecked(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	opts := &etcdbackend.Options{Prefix: prefix}
	b := newBackend(t, newClient(t, nil, nil), opts)
	other := newBackend(t, newClient(t, nil, nil), opts)

	req := modeRequest("d", "a", backend.Exclusive)
	req.Detached = true
	l, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatalf("AcquireMode: %v", err)
	}
	if resp, err := raw.Delete(ctx, prefix+"d\x00", clientv3.WithPrefix()); err != nil || resp.Deleted != 1 {
		t.Fatalf("deleting the holder entry by hand: %v, %v; want one deleted", resp, err)
	}
	newer, err := other.Acquire(ctx, backend.AcquireRequest{Key: "d", HolderID: "b", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire by another holder: %v", err)
	}
	if err := b.Release(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Release of the lost Detached entry: got %v, want ErrLeaseLost", err)
	}
	if rec, err := other.Get(ctx, "d"); err != nil || rec.Token != newer.Token {
		t.Errorf("Get after the stale Release: got %+v, %v; want the new holder's record", rec, err)
	}

	for _, detached := range []bool{false, true} {
		key := fmt.Sprintf("p%v/c", detached)
		req := modeRequest(key, "a", backend.Exclusive)
		req.Ancestors = []string{fmt.Sprintf("p%v", detached)}
		req.Detached = detached
		e, err := b.AcquireMode(ctx, req)
		if err != nil {
			t.Fatalf("AcquireMode: %v", err)
		}
		intents := prefix + req.Ancestors[0] + "\x00i"
		if resp, err := raw.Delete(ctx, intents, clientv3.WithPrefix()); err != nil || resp.Deleted != 1 {
			t.Fatalf("deleting the intent by hand: %v, %v; want one deleted", resp, err)
		}
		if err := b.SetMetadata(ctx, e, map[string]string{"stale": "yes"}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("SetMetadata of an entry (Detached: %v) without its intent: got %v, want ErrLeaseLost", detached, err)
		}
		if resp, err := raw.Get(ctx, intents, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
			t.Errorf("intents after SetMetadata of an entry (Detached: %v) without its intent: %v, %v; want none", detached, resp, err)
		}
	}
}
