package etcdbackend_test

import (
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/electortest"
)

// hbReqs returns count heartbeat requests of instance "a" with TTL ttl, for
// keys hb/0 to hb/<count-1>.
func hbReqs(count int, ttl time.Duration) []backend.HeartbeatRequest {
	reqs := make([]backend.HeartbeatRequest, count)
	for i := range reqs {
		reqs[i] = backend.HeartbeatRequest{Key: fmt.Sprintf("hb/%d", i), ID: "a", TTL: ttl}
	}
	return reqs
}

// hbMembers returns the IDs of the live heartbeat records of key, read by b.
func hbMembers(t *testing.T, b *etcdbackend.Backend, key string) []string {
	t.Helper()
	ms, err := b.Members(testCtx(t), key)
	if err != nil {
		t.Fatalf("Members(%q): %v", key, err)
	}
	ids := make([]string, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

// TestHeartbeatBatchCosts: a batch of a heartbeat session sends the
// keep-alive of its lease only when, at the next batch expected, the lease
// would have less than a quarter of its TTL left, and the look-up of its
// keys only when the next batch would come more than the TTL minus half a
// gap after the last one; between look-ups it writes only what it has not
// written, so a record deleted by another is written again at the next
// look-up, and one removed through this Backend at the next batch. The
// clocks are set, not waited for: the TTLs and gaps are the elector's
// defaults at TTL 10 s (records of 15 s every 5 s) and 2 s (7 s every
// second).
func TestHeartbeatBatchCosts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ttl   time.Duration
		gap   time.Duration
		steps []struct {
			ka, look           time.Duration // ages of the last keep-alive and look-up
			wantKA, wantLookUp bool
		}
	}{
		{"TTL 10s", 15 * time.Second, 5 * time.Second, []struct {
			ka, look           time.Duration
			wantKA, wantLookUp bool
		}{
			{5 * time.Second, 5 * time.Second, false, false},
			{10 * time.Second, 5 * time.Second, true, false},
			{5 * time.Second, 10 * time.Second, false, true},
			{10 * time.Second, 10 * time.Second, true, true},
		}},
		{"TTL 2s", 7 * time.Second, time.Second, []struct {
			ka, look           time.Duration
			wantKA, wantLookUp bool
		}{
			{time.Second, time.Second, false, false},
			{4 * time.Second, 5 * time.Second, false, false},
			{5 * time.Second, 5 * time.Second, true, false},
			{4 * time.Second, 6 * time.Second, false, true},
			{5 * time.Second, 6 * time.Second, true, true},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			var n counter
			prefix := newPrefix()
			cli := newClient(t, nil, n.configure)
			opts := &etcdbackend.Options{Prefix: prefix}
			b := newBackend(t, cli, opts)
			other := newBackend(t, newClient(t, nil, nil), opts)
			secs := int64(tc.ttl / time.Second)
			reqs := hbReqs(300, tc.ttl)
			batch := func(what string, ka, look time.Duration, want map[string]int64) {
				t.Helper()
				if ka > 0 && !etcdbackend.SetHeartbeatClocks(b, secs, ka, look, tc.gap) {
					t.Fatalf("%s: no heartbeat session of %ds", what, secs)
				}
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
			present := func(what, key string, want bool) {
				t.Helper()
				ids := hbMembers(t, other, key)
				if got := len(ids) == 1 && ids[0] == "a"; got != want {
					t.Errorf("%s: Members(%q) = %v, want the record of a: %v", what, key, ids, want)
				}
			}
			idle := func(what string) { batch(what, tc.gap, tc.gap, map[string]int64{}) }
			lookUp := 10 * time.Second // due: the next batch would be 15 s after the last
			if tc.ttl < 10*time.Second {
				lookUp = 6 * time.Second // due: 7 s
			}

			batch("first batch (grant, 3 transactions of puts)", 0, 0, map[string]int64{"LeaseGrant": 1, "Txn": 3})
			present("after the first batch", "hb/299", true)
			for _, s := range tc.steps {
				want := map[string]int64{}
				if s.wantKA {
					want["LeaseKeepAlive"] = 1
				}
				if s.wantLookUp {
					want["LeaseTimeToLive"] = 1
				}
				batch(fmt.Sprintf("keep-alive %v ago, look-up %v ago, next batch in %v", s.ka, s.look, tc.gap), s.ka, s.look, want)
			}
			present("after the refreshes", "hb/0", true)

			// Deleted by hand, or by another Backend's RemoveMember: only
			// a look-up finds it missing.
			if _, err := cli.Delete(ctx, prefix+"hb/5/heartbeat/a"); err != nil {
				t.Fatal(err)
			}
			if err := other.RemoveMember(ctx, "hb/6", "a"); err != nil {
				t.Fatal(err)
			}
			present("RemoveMember of another record", "hb/7", true)
			idle("two records gone, no look-up due (nothing sent)")
			present("before the look-up", "hb/5", false)
			batch("two records gone, look-up due (look-up, one transaction)", tc.gap, lookUp,
				map[string]int64{"LeaseTimeToLive": 1, "Txn": 1})
			present("after the look-up", "hb/5", true)
			present("after the look-up", "hb/6", true)
			idle("after the rewrite (nothing sent)")

			// Removed through this Backend: the next batch writes it again.
			if err := b.RemoveMember(ctx, "hb/8", "a"); err != nil {
				t.Fatal(err)
			}
			present("after RemoveMember", "hb/8", false)
			batch("RemoveMember through this Backend (one transaction)", tc.gap, tc.gap, map[string]int64{"Txn": 1})
			present("after the batch", "hb/8", true)

			// The lease revoked by hand (as lost by a store that restarted
			// without its data): the next keep-alive finds it gone, and
			// every record is written again on a new lease.
			id := etcdbackend.HeartbeatSessionLease(b, secs)
			if _, err := cli.Revoke(ctx, clientv3.LeaseID(id)); err != nil {
				t.Fatal(err)
			}
			idle("lease revoked, nothing due (nothing sent)")
			present("lease revoked", "hb/0", false)
			ka := 10 * time.Second
			if tc.ttl < 10*time.Second {
				ka = 5 * time.Second
			}
			batch("lease revoked, keep-alive due (keep-alive, grant, 3 transactions)", ka, tc.gap,
				map[string]int64{"LeaseKeepAlive": 1, "LeaseGrant": 1, "Txn": 3})
			if got := etcdbackend.HeartbeatSessionLease(b, secs); got == id || got == 0 {
				t.Errorf("heartbeat session lease after the revocation: got %x, want a new one (old %x)", got, id)
			}
			present("on the new lease", "hb/0", true)
			present("on the new lease", "hb/299", true)
		})
	}
}

// TestHeartbeatBatchBounds: at TTL 2 s with a batch every 200 ms, in real
// time, a record deleted by hand is back after the first batch that started
// a TTL after the deletion; a record the Backend stops refreshing is gone
// after the first batch that started a TTL after its last refresh, although
// the session lives on; and once the Backend is closed (a stopped
// instance), the session lease is not kept alive any more: its records end
// with it.
func TestHeartbeatBatchBounds(t *testing.T) {
	const ttl = 2 * time.Second
	ctx := testCtx(t)
	prefix := newPrefix()
	raw := newClient(t, nil, nil)
	opts := &etcdbackend.Options{Prefix: prefix}
	b := newBackend(t, newClient(t, nil, nil), opts)
	other := newBackend(t, raw, opts)
	reqs := hbReqs(3, ttl)
	run := func(reqs []backend.HeartbeatRequest) time.Time {
		t.Helper()
		start := time.Now()
		for i, err := range b.HeartbeatBatch(ctx, reqs) {
			if err != nil {
				t.Fatalf("heartbeat %d: %v", i, err)
			}
		}
		return start
	}
	const pace = 200 * time.Millisecond // a heartbeat loop's interval
	for range 5 {
		run(reqs)
		<-time.After(pace)
	}

	if _, err := raw.Delete(ctx, prefix+"hb/1/heartbeat/a"); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	for {
		if run(reqs).Sub(deleted) >= ttl {
			break
		}
		<-time.After(pace)
	}
	if ids := hbMembers(t, other, "hb/1"); len(ids) != 1 {
		t.Fatalf("a batch started a TTL (%v) after the record was deleted by hand: Members = %v, want a", ttl, ids)
	}

	// hb/0 is no longer refreshed.
	rest := reqs[1:]
	last := time.Now()
	for {
		if run(rest).Sub(last) >= ttl {
			break
		}
		if time.Since(last) > 20*ttl {
			t.Fatal("no batch started a TTL after the last refresh of hb/0")
		}
		<-time.After(pace)
	}
	if ids := hbMembers(t, other, "hb/0"); len(ids) != 0 {
		t.Fatalf("a batch started a TTL (%v) after the last refresh of hb/0: Members = %v, want none", ttl, ids)
	}
	if ids := hbMembers(t, other, "hb/2"); len(ids) != 1 {
		t.Fatalf("Members(hb/2) while refreshed: got %v, want a", ids)
	}

	// The instance stops: its session lease, not kept alive any more,
	// ends within its TTL of its last keep-alive, with its records.
	id := etcdbackend.HeartbeatSessionLease(b, 2)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	resp, err := raw.TimeToLive(ctx, clientv3.LeaseID(id))
	if err != nil {
		t.Fatal(err)
	}
	if resp.TTL > int64(ttl/time.Second) {
		t.Errorf("heartbeat session lease after Close: %d s left, want at most %v", resp.TTL, ttl)
	}
	for len(hbMembers(t, other, "hb/2")) != 0 {
		// etcd expires leases within about half a second of their
		// TTL; the bound is generous for a loaded machine.
		if time.Since(closed) > ttl+10*time.Second {
			t.Fatalf("the records of a closed Backend are still there %v after Close (TTL %v)", time.Since(closed), ttl)
		}
		<-time.After(100 * time.Millisecond)
	}
}

// TestHeartbeatBatchUnreachable: a batch with nothing due succeeds without
// a request while the client is connected, but while its connection is
// down it sends the keep-alive, and fails, instead of succeeding on what
// the Backend last knew.
func TestHeartbeatBatchUnreachable(t *testing.T) {
	const ttl = 15 * time.Second
	ctx := testCtx(t)
	var n counter
	p := startProxy(t, shared.Endpoint(0))
	cli := newClient(t, nil, func(cfg *clientv3.Config) {
		cfg.Endpoints = []string{p.endpoint()}
		n.configure(cfg)
	})
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix(), RequestTimeout: 500 * time.Millisecond})
	reqs := hbReqs(1, ttl)
	batch := func() error {
		if !etcdbackend.SetHeartbeatClocks(b, 15, 5*time.Second, 5*time.Second, 5*time.Second) {
			t.Fatal("no heartbeat session")
		}
		n.reset()
		return b.HeartbeatBatch(ctx, reqs)[0]
	}
	if err := b.HeartbeatBatch(ctx, reqs)[0]; err != nil {
		t.Fatalf("first batch: %v", err)
	}
	if err := batch(); err != nil || n.total() != 0 {
		t.Fatalf("batch with nothing due, connected: got %v after %d requests %v, want nil after none", err, n.total(), n.byMethod())
	}
	p.setCut(true)
	electortest.Eventually(t, "the client sees its connection down", func() bool {
		return cli.ActiveConnection().GetState() != connectivity.Ready
	})
	err := batch()
	if err == nil {
		t.Fatal("batch with nothing due, connection down: got nil, want an error")
	}
	if got := n.byMethod()["LeaseKeepAlive"]; got != 1 {
		t.Errorf("batch with nothing due, connection down: %d keep-alives, want 1", got)
	}
	p.setCut(false)
}
