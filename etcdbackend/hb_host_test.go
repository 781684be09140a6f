package etcdbackend_test

import (
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestHeartbeatsRideOnHeldSession: while the Backend holds a key on a
// session of a TTL no longer than its heartbeats', its heartbeat records
// ride on that session: a batch then sends nothing of its own (the
// renewals keep the records alive and look them up; RenewBatch does not
// delete them as orphans, and its look-up makes the next batch rewrite a
// record deleted by hand); once the key is released, the next batch moves
// the records to the heartbeat session's own lease.
func TestHeartbeatsRideOnHeldSession(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	prefix := newPrefix()
	cli := newClient(t, nil, n.configure)
	opts := &etcdbackend.Options{Prefix: prefix}
	b := newBackend(t, cli, opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "e", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	host := sessionOf(t, cli, prefix+"e")
	reqs := hbReqs(2, 15*time.Second)
	batch := func(what string, want map[string]int64) {
		t.Helper()
		n.reset()
		for i, err := range b.HeartbeatBatch(ctx, reqs) {
			if err != nil {
				t.Fatalf("%s: heartbeat %d: %v", what, i, err)
			}
		}
		got := n.byMethod()
		var total int64
		for m, w := range want {
			total += w
			if got[m] != w {
				t.Errorf("%s: %s requests: got %d, want %d (all: %v)", what, m, got[m], w, got)
			}
		}
		if n.total() != total {
			t.Errorf("%s: got %d requests %v, want %d %v", what, n.total(), got, total, want)
		}
	}
	renew := func() {
		t.Helper()
		if err := b.RenewBatch(ctx, []backend.Lease{l})[0]; err != nil {
			t.Fatalf("RenewBatch: %v", err)
		}
	}
	batch("first batch (grant, one transaction)", map[string]int64{"LeaseGrant": 1, "Txn": 1})
	own := etcdbackend.HeartbeatSessionLease(b, 15)
	renew() // looks the session's keys up: the records can ride on it
	etcdbackend.SetHeartbeatClocks(b, 15, 5*time.Second, 5*time.Second, 5*time.Second)
	batch("key held and renewed in a batch: the records move to its session (one transaction)", map[string]int64{"Txn": 1})
	if got := sessionOf(t, cli, prefix+"hb/0/heartbeat/a"); got != host {
		t.Fatalf("heartbeat record on lease %x, want the held key's session %x", got, host)
	}
	renew()
	if ids := hbMembers(t, other, "hb/1"); len(ids) != 1 {
		t.Fatalf("Members(hb/1) after RenewBatch: got %v, want a (not deleted as an orphan)", ids)
	}
	for _, age := range []time.Duration{5 * time.Second, 10 * time.Second} {
		etcdbackend.SetHeartbeatClocks(b, 15, age, age, 5*time.Second)
		batch("a batch while the key is held, whatever the ages (nothing)", map[string]int64{})
	}

	if _, err := cli.Delete(ctx, prefix+"hb/1/heartbeat/a"); err != nil {
		t.Fatal(err)
	}
	batch("record deleted, not looked up yet (nothing)", map[string]int64{})
	renew()
	batch("record deleted, found by the renewal's look-up (one transaction)", map[string]int64{"Txn": 1})
	if ids := hbMembers(t, other, "hb/1"); len(ids) != 1 {
		t.Fatalf("Members(hb/1) after the rewrite: got %v, want a", ids)
	}

	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	etcdbackend.SetHeartbeatClocks(b, 15, 5*time.Second, 5*time.Second, 5*time.Second)
	batch("key released: the records move back to the heartbeat session's lease (one transaction)", map[string]int64{"Txn": 1})
	for _, k := range []string{"hb/0/heartbeat/a", "hb/1/heartbeat/a"} {
		if got := sessionOf(t, cli, prefix+k); int64(got) != own {
			t.Errorf("record %s on lease %x after the release, want the heartbeat session's %x", k, got, own)
		}
	}
}
