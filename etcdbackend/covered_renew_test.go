package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestCoveredRenewal: while the Backend's watch is established, a renewal
// of a session whose keys the watch has seen no change of sends the
// keep-alive alone; a key deleted by hand (and taken by a same-ID twin), a
// key put on the session by someone else (an orphan), or no watch at all
// make the next renewal look the keys up again, and it finds what a
// look-up at every renewal found.
func TestCoveredRenewal(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	prefix := newPrefix()
	cli := newClient(t, nil, n.configure)
	raw := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})

	watchCtx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	watch := func(key string) <-chan backend.Event {
		t.Helper()
		ch, err := b.Watch(watchCtx, key)
		if err != nil {
			t.Fatalf("Watch(%q): %v", key, err)
		}
		return ch
	}
	// Another key's subscription starts the Backend's watch.
	elsewhere := watch("elsewhere")
	deleted, orphan := watch("k1"), watch("orphan")
	k2, orphan2 := watch("k2"), watch("orphan2")
	var leases []backend.Lease
	for _, k := range []string{"k1", "k2"} {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: k, HolderID: "a", TTL: 10 * time.Second})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", k, err)
		}
		leases = append(leases, l)
	}
	// Take k1's own put from its subscription, so that the next event on
	// it is the deletion below.
	next(t, deleted)

	renew := func(what string, ls []backend.Lease, want map[string]int64, lost ...int) {
		t.Helper()
		n.reset()
		errs := b.RenewBatch(ctx, ls)
		if got := n.byMethod(); !maps.Equal(got, want) {
			t.Errorf("%s: requests %v, want %v", what, got, want)
		}
		for i, err := range errs {
			isLost := false
			for _, j := range lost {
				isLost = isLost || i == j
			}
			switch {
			case isLost && !errors.Is(err, backend.ErrLeaseLost):
				t.Errorf("%s: lease %d: got %v, want ErrLeaseLost", what, i, err)
			case !isLost && err != nil:
				t.Errorf("%s: lease %d: got %v, want nil", what, i, err)
			}
		}
	}
	full := map[string]int64{"LeaseKeepAlive": 1, "LeaseTimeToLive": 1}
	keepAlive := map[string]int64{"LeaseKeepAlive": 1}

	// No look-up has been recorded yet: one look-up, then none.
	renew("first renewal", leases, full)
	renew("covered renewal", leases, keepAlive)
	renew("covered renewal again", leases, keepAlive)

	// A key deleted by hand, then taken by a same-ID twin (another Backend
	// acquiring as holder "a"): once the watch has delivered both, the
	// next renewal looks up and loses that key alone.
	if _, err := raw.Delete(ctx, prefix+"k1"); err != nil {
		t.Fatal(err)
	}
	next(t, deleted)
	twin := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	if _, err := twin.Acquire(ctx, backend.AcquireRequest{Key: "k1", HolderID: "a", TTL: 10 * time.Second}); err != nil {
		t.Fatalf("the twin's Acquire(k1): %v", err)
	}
	next(t, deleted)
	renew("after a deletion by hand and the twin's acquisition", leases, full, 0)
	renew("after the loss", leases[1:], keepAlive)

	// A key put on the session lease by someone else: the next renewal
	// looks up and deletes it (the orphan sweep).
	id := sessionOf(t, cli, prefix+"k2")
	if _, err := raw.Put(ctx, prefix+"orphan", "x", clientv3.WithLease(id)); err != nil {
		t.Fatal(err)
	}
	next(t, orphan)
	renew("after an orphan", leases[1:], map[string]int64{"LeaseKeepAlive": 1, "LeaseTimeToLive": 1, "Txn": 1})
	if resp, err := raw.Get(ctx, prefix+"orphan"); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the orphan after the renewal: %v, %v; want it deleted", resp, err)
	}
	renew("after the sweep", leases[1:], keepAlive)

	// A key put on the session while this Backend holds none on it
	// changes nothing it holds, and is not counted: the first renewal
	// after it holds one again looks up, and sweeps it.
	if err := b.Release(ctx, leases[1]); err != nil {
		t.Fatalf("Release(k2): %v", err)
	}
	until(t, k2, backend.EventReleased)
	if _, err := raw.Put(ctx, prefix+"orphan2", "x", clientv3.WithLease(id)); err != nil {
		t.Fatal(err)
	}
	next(t, orphan2)
	l3, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k3", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire(k3): %v", err)
	}
	if got := sessionOf(t, cli, prefix+"k3"); got != id {
		t.Fatalf("k3 is on lease %x, want the session %x", got, id)
	}
	renew("holding again", []backend.Lease{l3}, map[string]int64{"LeaseKeepAlive": 1, "LeaseTimeToLive": 1, "Txn": 1})
	if resp, err := raw.Get(ctx, prefix+"orphan2"); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the orphan put while nothing was held, after the renewal: %v, %v; want it deleted", resp, err)
	}
	leases = append(leases, l3)

	// No watch: every renewal looks up.
	stopWatching()
	for _, ch := range []<-chan backend.Event{elsewhere, deleted, orphan, k2, orphan2} {
		closed(t, ch)
	}
	renew("without a watch", leases[2:], full)
	renew("without a watch, again", leases[2:], full)
}

// closed waits for ch to be closed, taking the events before.
func closed(t *testing.T, ch <-chan backend.Event) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("watch channel not closed within 10 s")
		}
	}
}

// until waits for an event of type typ on ch, taking the events before.
func until(t *testing.T, ch <-chan backend.Event, typ backend.EventType) {
	t.Helper()
	for next(t, ch).Type != typ {
	}
}

// next waits for an event on ch.
func next(t *testing.T, ch <-chan backend.Event) backend.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10 s")
	}
	return backend.Event{}
}

// TestIdleLeaderSendsKeepAlivesOnly: an idle leader over etcd, with its
// watch up, renews with one request (the session's keep-alive; its
// heartbeat rides on the session), as an etcd concurrency.Session does; yet
// a deletion of its key by hand still ends its lead.
func TestIdleLeaderSendsKeepAlivesOnly(t *testing.T) {
	// TTL 3 s: RenewInterval 1 s, heartbeats every 1.5 s; the records ride
	// on the session while it was renewed within 1.5 s.
	c := newCandidates(t, nil, 1, &sovereign.Options{TTL: 3 * time.Second}, nil)
	l := c.leader(nil)
	keepAlives := func(n int64) {
		t.Helper()
		waitUntil(t, fmt.Sprintf("%d keep-alives", n), func() bool { return l.n.byMethod()["LeaseKeepAlive"] >= n })
	}
	// Past the leader's start-up: its heartbeat record moves onto the
	// session, and the renewal after that looks up.
	l.n.reset()
	keepAlives(4)
	l.n.reset()
	keepAlives(4)
	if got := l.n.byMethod(); len(got) != 1 {
		t.Errorf("idle leader, over %d renewals: requests %v, want keep-alives only", got["LeaseKeepAlive"], got)
	}

	deleteLeaderKey(t, c, l)
}

// deleteLeaderKey deletes the key of c's election by hand, and waits for
// its leader l to lose its lead with ReasonLeaseLost, failing after 10 s.
func deleteLeaderKey(t *testing.T, c *candidates, l *candidate) {
	t.Helper()
	lost := make(chan sovereign.LeadershipLost, 1)
	defer l.e.Subscribe(func(ev sovereign.Event) {
		if ev, ok := ev.(sovereign.LeadershipLost); ok {
			select {
			case lost <- ev:
			default:
			}
		}
	})()
	raw := newClient(t, nil, nil)
	if _, err := raw.Delete(testCtx(t), c.prefix+c.name); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-lost:
		if ev.Reason != sovereign.ReasonLeaseLost {
			t.Errorf("lead ended with %v (%v), want %v", ev.Reason, ev.Err, sovereign.ReasonLeaseLost)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the leader whose key was deleted still leads 10 s later")
	}
}

// waitUntil polls cond every 10 ms until it holds, failing after 30 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 30 s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling, bounded above
	}
}

// TestLeaderSeesItsKeyDeleted: a leader whose key is deleted by hand learns
// it from its watch and renews at once, finding the loss within a round
// trip, not at its next renewal (20 s away here): the window in which a
// follower can lead beside it is the watch's delivery, not RenewInterval.
func TestLeaderSeesItsKeyDeleted(t *testing.T) {
	c := newCandidates(t, nil, 1, &sovereign.Options{TTL: 60 * time.Second}, nil) // RenewInterval 20 s
	l := c.leader(nil)
	// Past the renewal its own acquisition's event brings.
	waitUntil(t, "a renewal", func() bool { return l.n.byMethod()["LeaseKeepAlive"] >= 1 })
	deleteLeaderKey(t, c, l)
}

// renewUntilCovered renews leases until a renewal sends the session's
// keep-alive alone (a covered renewal), failing after three renewals: the
// first looks the keys up, and a spurious reset of a new client's first
// watch (see TestWatchGoroutinesIndependentOfSubscriptions) may make a
// second one look up too.
func renewUntilCovered(t *testing.T, b *etcdbackend.Backend, n *counter, leases []backend.Lease) {
	t.Helper()
	for range 3 {
		n.reset()
		for i, err := range b.RenewBatch(testCtx(t), leases) {
			if err != nil {
				t.Fatalf("RenewBatch, lease %d: %v", i, err)
			}
		}
		if got := n.byMethod(); maps.Equal(got, map[string]int64{"LeaseKeepAlive": 1}) {
			return
		}
	}
	t.Fatalf("no renewal sent the keep-alive alone out of 3 with the watch up: last sent %v", n.byMethod())
}

// TestRenewalLooksUpWhileTheWatchIsDown: a renewal does without its
// look-up only while the Backend's watch is established. Once etcd has
// ended the watch and the next one is not yet confirmed, the watch delivers
// nothing, so every renewal looks up: a key deleted by hand after the
// first of them must be found lost by the second, not reported held on the
// strength of the session's keep-alive.
func TestRenewalLooksUpWhileTheWatchIsDown(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	prefix := newPrefix()
	cli := newClient(t, nil, n.configure)
	bw := newBreakableWatcher(cli.Watcher)
	cli.Watcher = bw
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	if _, err := b.Watch(ctx, "elsewhere"); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	renewUntilCovered(t, b, &n, []backend.Lease{l})

	// etcd ends the watch; the Backend's next one hangs unconfirmed.
	bw.stall()
	made := bw.made.get()
	bw.cut()
	bw.made.wait(t, "watches made", made+1)
	n.reset()
	if err := b.RenewBatch(ctx, []backend.Lease{l})[0]; err != nil {
		t.Fatalf("RenewBatch with the watch down: %v", err)
	}
	if got := n.byMethod()["LeaseTimeToLive"]; got != 1 {
		t.Errorf("renewal with the watch down: requests %v, want a look-up (LeaseTimeToLive) with the keep-alive", n.byMethod())
	}
	raw := newClient(t, nil, nil)
	if _, err := raw.Delete(ctx, prefix+"k"); err != nil {
		t.Fatal(err)
	}
	n.reset()
	if err := b.RenewBatch(ctx, []backend.Lease{l})[0]; !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("second renewal, of a key deleted while the watch was down: got %v (requests %v), want ErrLeaseLost", err, n.byMethod())
	}
	bw.unstall()
}

// TestRenewalLooksUpAfterAReset: when the client's connection comes back
// after a break, the etcd client resumes the Backend's watch without a
// word, and the watch sends every subscription a reset: the store may have
// restarted, or have been restored from a backup and lost a key with no
// event the watch could deliver. The next renewal then looks the keys up
// again, although the watch stayed established, as the reset asks.
func TestRenewalLooksUpAfterAReset(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	cli := newClient(t, nil, n.configure)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	events, err := b.Watch(ctx, "elsewhere")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: 10 * time.Second})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	renewUntilCovered(t, b, &n, []backend.Lease{l})
	// A spurious reset, if any, came before the covered renewal: take it.
	for len(events) > 0 {
		<-events
	}

	etcdbackend.SignalReconnection(b) // what the connection monitor does
	if e := next(t, events); e.Type != backend.EventReset {
		t.Fatalf("after the reconnection: got %v, want %v", e.Type, backend.EventReset)
	}
	n.reset()
	if err := b.RenewBatch(ctx, []backend.Lease{l})[0]; err != nil {
		t.Fatalf("RenewBatch: %v", err)
	}
	if got := n.byMethod()["LeaseTimeToLive"]; got != 1 {
		t.Errorf("renewal after a reset: requests %v, want a look-up (LeaseTimeToLive) with the keep-alive", n.byMethod())
	}
}
