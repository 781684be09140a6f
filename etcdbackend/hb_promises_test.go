package etcdbackend_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// expiringLease wraps a client's Lease so that a test can make one lease
// end between a read of the keys attached to it and the look-up of its TTL,
// as a lease that expires at that moment does.
type expiringLease struct {
	clientv3.Lease

	mu  sync.Mutex       // guards end
	end clientv3.LeaseID // revoked just before its next look-up
}

func (l *expiringLease) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	l.mu.Lock()
	end := l.end == id
	if end {
		l.end = 0
	}
	l.mu.Unlock()
	if end {
		if _, err := l.Lease.Revoke(ctx, id); err != nil {
			return nil, err
		}
	}
	return l.Lease.TimeToLive(ctx, id, opts...)
}

// TestMembersSkipsRecordsExpiredSinceTheRead: Members returns live
// records only: one whose lease ends after the records were read, before
// its TTL is looked up, is left out rather than reported with no TTL.
func TestMembersSkipsRecordsExpiredSinceTheRead(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	cli := newClient(t, nil, nil)
	leases := &expiringLease{Lease: cli.Lease}
	cli.Lease = leases
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	for _, id := range []string{"a", "b"} {
		if err := b.Heartbeat(ctx, "k", id, time.Minute); err != nil {
			t.Fatalf("Heartbeat(%q): %v", id, err)
		}
	}
	resp, err := raw.Get(ctx, prefix+"k/heartbeat/a")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("raw Get of a's record: got %v, %v; want one record", resp, err)
	}
	leases.mu.Lock()
	leases.end = clientv3.LeaseID(resp.Kvs[0].Lease)
	leases.mu.Unlock()
	ms, err := b.Members(ctx, "k")
	if err != nil {
		t.Fatalf("Members: %v", err)
	}
	leases.mu.Lock()
	looked := leases.end == 0
	leases.mu.Unlock()
	if !looked {
		t.Fatal("Members did not look up the lease of a's record")
	}
	if len(ms) != 1 || ms[0].ID != "b" {
		t.Errorf("Members with a's lease ended after the read: got %+v, want b alone", ms)
	}
}

// heartbeatBatch runs b.HeartbeatBatch(reqs) and fails the test on an error.
func heartbeatBatch(t *testing.T, b *etcdbackend.Backend, what string, reqs []backend.HeartbeatRequest) {
	t.Helper()
	for i, err := range b.HeartbeatBatch(testCtx(t), reqs) {
		if err != nil {
			t.Fatalf("%s: heartbeat %d: %v", what, i, err)
		}
	}
}

// TestHeartbeatBatchDeletesOnlyItsOwnStaleRecords: a record that this
// Backend has not been asked to refresh for a TTL is deleted by its next
// batch, but only while it is still on the heartbeat session's lease: a
// record written since by another Backend's Heartbeat, on a lease of its
// own, is that instance's and stays, even when the batch has not looked
// the session's keys up (and so still believes the record its own).
func TestHeartbeatBatchDeletesOnlyItsOwnStaleRecords(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	opts := &etcdbackend.Options{Prefix: prefix}
	b := newBackend(t, cli, opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	reqs := hbReqs(3, 15*time.Second)
	heartbeatBatch(t, b, "first batch", reqs)
	own := clientv3.LeaseID(etcdbackend.HeartbeatSessionLease(b, 15))
	if err := other.Heartbeat(ctx, "hb/1", "a", 15*time.Second); err != nil {
		t.Fatalf("Heartbeat of another Backend: %v", err)
	}
	theirs := sessionOf(t, cli, prefix+"hb/1/heartbeat/a")
	if theirs == own {
		t.Fatalf("record of another Backend's Heartbeat on the heartbeat session's lease %x, want its own", own)
	}
	// From now on b is asked about hb/0 alone, and for longer than the
	// TTL; no keep-alive or look-up is due.
	etcdbackend.AgeHeartbeats(b, 15, time.Minute)
	etcdbackend.SetHeartbeatClocks(b, 15, time.Second, time.Second, time.Second)
	heartbeatBatch(t, b, "batch of hb/0 alone", reqs[:1])
	if ids := hbMembers(t, other, "hb/2"); len(ids) != 0 {
		t.Errorf("Members(hb/2), stale on the heartbeat session: got %v, want none (deleted)", ids)
	}
	if got := sessionOf(t, cli, prefix+"hb/1/heartbeat/a"); got != theirs {
		t.Errorf("record hb/1 on lease %x, want the other Backend's %x", got, theirs)
	}
	if ids := hbMembers(t, other, "hb/0"); len(ids) != 1 {
		t.Errorf("Members(hb/0), refreshed: got %v, want a", ids)
	}
}

// TestHeartbeatsDoNotRideOnALongerSession: heartbeat records ride on a
// session of plain acquisitions only when its TTL is no longer than
// theirs (TestHeartbeatsRideOnHeldSession): on a longer one, the record of
// an instance that stopped would outlive its TTL. While the Backend holds
// a key whose session is longer, the records stay on the heartbeat
// session's own lease.
func TestHeartbeatsDoNotRideOnALongerSession(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "e", HolderID: "a", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	reqs := hbReqs(1, 15*time.Second)
	heartbeatBatch(t, b, "first batch", reqs)
	own := clientv3.LeaseID(etcdbackend.HeartbeatSessionLease(b, 15))
	if err := b.RenewBatch(ctx, []backend.Lease{l})[0]; err != nil {
		t.Fatalf("RenewBatch: %v", err) // looks the session's keys up
	}
	etcdbackend.SetHeartbeatClocks(b, 15, 5*time.Second, 5*time.Second, 5*time.Second)
	heartbeatBatch(t, b, "batch while a key of a longer session is held", reqs)
	if got := sessionOf(t, cli, prefix+"hb/0/heartbeat/a"); got != own {
		t.Errorf("heartbeat record (TTL 15s) on lease %x, want the heartbeat session's %x, not the held key's session %x (TTL 30s)",
			got, own, sessionOf(t, cli, prefix+"e"))
	}
}

// TestHeartbeatBatchAdoptsUnknownRecords: a record on the heartbeat
// session's own lease that this Backend does not refresh (left by a
// transaction whose outcome was unknown, say) is found by the next
// look-up of the session's keys and deleted once it has not been refreshed
// for a TTL, instead of living on with the session.
func TestHeartbeatBatchAdoptsUnknownRecords(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	reqs := hbReqs(1, 15*time.Second)
	heartbeatBatch(t, b, "first batch", reqs)
	own := clientv3.LeaseID(etcdbackend.HeartbeatSessionLease(b, 15))
	if _, err := cli.Put(ctx, prefix+"lost/heartbeat/x", `{"id":"x","session":true}`, clientv3.WithLease(own)); err != nil {
		t.Fatal(err)
	}
	// A look-up is due.
	etcdbackend.SetHeartbeatClocks(b, 15, time.Second, 30*time.Second, time.Second)
	heartbeatBatch(t, b, "batch with a look-up", reqs)
	if ids := hbMembers(t, b, "lost"); len(ids) != 1 {
		t.Fatalf("Members(lost) right after the look-up: got %v, want x (not refreshed for a TTL yet)", ids)
	}
	// A TTL later, with no look-up due.
	etcdbackend.AgeHeartbeats(b, 15, time.Minute)
	etcdbackend.SetHeartbeatClocks(b, 15, time.Second, time.Second, time.Second)
	heartbeatBatch(t, b, "batch a TTL later", reqs)
	if ids := hbMembers(t, b, "lost"); len(ids) != 0 {
		t.Errorf("Members(lost) a TTL after the look-up found it: got %v, want none (deleted)", ids)
	}
	if ids := hbMembers(t, b, "hb/0"); len(ids) != 1 {
		t.Errorf("Members(hb/0), refreshed: got %v, want a", ids)
	}
}
