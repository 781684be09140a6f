package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// The tests of this file run the backend over a redis.ClusterClient of a
// real Redis Cluster of two masters with one replica each
// (testredis.StartCluster), and fail a shard over for real (CLUSTER
// FAILOVER on its replica), as the Sentinel tests do with SENTINEL
// FAILOVER: the lease survives with WaitReplicas, the client follows the
// slot to the promoted replica, watches learn of the move (the old master
// drops its sharded subscriptions), and an election never has two
// leaders across it.

// startReplicatedCluster starts two masters with one replica each.
func startReplicatedCluster(t *testing.T) *testredis.Cluster {
	t.Helper()
	return testredis.StartCluster(t, testredis.ClusterConfig{Masters: 2, Replicas: 1})
}

// clusterClient returns a client of every node of c, with the options the
// README shows, closed at the end of the test.
func clusterClient(t testing.TB, c *testredis.Cluster) *redis.ClusterClient {
	t.Helper()
	return c.NewClusterClient(t, &redis.ClusterOptions{ContextTimeoutEnabled: true})
}

// slotOf returns the hash slot of the lease of key under prefix.
func slotOf(t testing.TB, ctx context.Context, c *testredis.Cluster, prefix, key string) int {
	t.Helper()
	slot, err := c.Slot(ctx, prefix+"{"+key+"}")
	if err != nil {
		t.Fatal(err)
	}
	return slot
}

// TestClusterFailoverKeepsLease: with WaitReplicas 1, a lease acquired
// before a failover of its shard is still held on the promoted replica
// (keepsLeaseAcrossFailover): the holder's client must follow the slot
// although its calls with WaitReplicas bypass the Cluster client's
// redirections.
func TestClusterFailoverKeepsLease(t *testing.T) {
	c := startReplicatedCluster(t)
	opts := &redisbackend.Options{Prefix: "cf:", WaitReplicas: 1, WaitTimeout: sentinelWaitTimeout}
	a := newBackend(t, clusterClient(t, c), opts)
	b := newBackend(t, clusterClient(t, c), opts)
	keepsLeaseAcrossFailover(t, a, b, "cf:", func(ctx context.Context) string {
		old, promoted, err := c.Failover(ctx, slotOf(t, ctx, c, "cf:", "k"))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("failover: %s -> %s", old, promoted)
		return promoted
	}, func(addr string) *redis.Client { return c.Node(addr).NewClient(t, nil) })
}

// TestClusterWatchAcrossFailover: a watch open across a failover of its
// key's shard is closed, because the old master drops its sharded
// subscriptions of the slot when it becomes a replica (SUNSUBSCRIBE sent
// by the server), or gets EventReset; a watch opened afterwards, on the
// promoted replica, sees a release. A watch of a key on the other shard
// keeps working throughout: it sees a release after the failover, on the
// same channel.
func TestClusterWatchAcrossFailover(t *testing.T) {
	c := startReplicatedCluster(t)
	ctx := ctxBound(t)
	w := newBackend(t, clusterClient(t, c), &redisbackend.Options{Prefix: "cw:"})
	b := newBackend(t, clusterClient(t, c), &redisbackend.Options{Prefix: "cw:"})
	slot := slotOf(t, ctx, c, "cw:", "k")
	// A key on the other shard.
	other := ""
	for i := 0; other == ""; i++ {
		k := fmt.Sprintf("o%d", i)
		if s := slotOf(t, ctx, c, "cw:", k); (s < 8192) != (slot < 8192) {
			other = k
		}
	}
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	otherEvents, err := w.Watch(ctx, other)
	if err != nil {
		t.Fatalf("Watch %q: %v", other, err)
	}
	if _, _, err := c.Failover(ctx, slot); err != nil {
		t.Fatal(err)
	}
	ctx = ctxBound(t) // a failover may take most of a bound on a loaded machine
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for done := false; !done; {
		select {
		case e, ok := <-events:
			done = !ok || e.Type == backend.EventReset
			switch {
			case !ok:
				t.Log("watch open across the failover: closed")
			case done:
				t.Log("watch open across the failover: EventReset")
			default:
				t.Logf("watch open across the failover: %v before the reset", e.Type)
			}
		case <-timer.C:
			t.Fatalf("watch open across the failover: neither closed nor EventReset within %v", bound)
		}
	}

	var again <-chan backend.Event
	if err := acrossSwitch(t, "Watch after the failover", func() error {
		var err error
		again, err = w.Watch(ctx, "k")
		return err
	}); err != nil {
		t.Fatalf("Watch after the failover: %v", err)
	}
	for _, key := range []string{"k", other} {
		var l backend.Lease
		if err := acrossSwitch(t, "Acquire after the failover", func() error {
			var err error
			l, err = b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "b", TTL: time.Minute})
			return err
		}); err != nil {
			t.Fatalf("Acquire %q after the failover: %v", key, err)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Fatalf("Release %q after the failover: %v", key, err)
		}
	}
	for _, x := range []struct {
		what string
		ch   <-chan backend.Event
	}{{"watch opened after the failover", again}, {"watch of the other shard's key", otherEvents}} {
		timer.Reset(bound)
		for released := false; !released; {
			select {
			case e, ok := <-x.ch:
				if !ok {
					t.Fatalf("%s: channel closed, want the release", x.what)
				}
				released = e.Type == backend.EventReleased
			case <-timer.C:
				t.Fatalf("%s: no EventReleased within %v", x.what, bound)
			}
		}
	}
}

// clusterElectorTTL is the TTL of the elector test over a Cluster:
// RenewDeadline 7 s, RequestTimeout 2 s, ResignSitOut 2 s.
const clusterElectorTTL = 10 * time.Second

// TestClusterElectorFailover: three candidates over ClusterClients with
// WaitReplicas 1 and a failover of the election's shard while one leads.
// At no moment do two lead (terms recorded by the leader functions), and
// after the failover the election has a leader again whose lease is on the
// promoted replica.
func TestClusterElectorFailover(t *testing.T) {
	c := startReplicatedCluster(t)
	ctx := ctxBound(t)
	const name = "cluster-daemon"
	opts := &redisbackend.Options{WaitReplicas: 1, WaitTimeout: 300 * time.Millisecond}
	reader := newBackend(t, clusterClient(t, c), nil)
	es, rec := startClusterElectors(t, c, name, opts, "c1", "c2", "c3")
	// waitLeaderOn waits until one candidate leads, the store holds its
	// lease under its term, and so does the node at master.
	waitLeaderOn := func(what, master string) *sovereign.Elector {
		t.Helper()
		direct := c.Node(master).NewClient(t, nil)
		var leader *sovereign.Elector
		electortest.Eventually(t, what, func() bool {
			ls := electortest.Leaders(es...)
			if len(ls) != 1 {
				return false
			}
			leader = ls[0]
			rec, err := reader.Get(ctx, name)
			if err != nil || rec.HolderID != leader.ID() || rec.Term != leader.Term() {
				return false
			}
			term, err := direct.HGet(ctx, "sovereign:{"+name+"}", "term").Uint64()
			return err == nil && term == leader.Term()
		})
		return leader
	}

	slot := slotOf(t, ctx, c, "sovereign:", name)
	master, _, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil {
		t.Fatal(err)
	}
	before := waitLeaderOn("a leader before the failover", master)
	t.Logf("leader before the failover: %s, term %d", before.ID(), before.Term())
	old, promoted, err := c.Failover(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	ctx = ctxBound(t) // a failover may take most of a bound on a loaded machine
	after := waitLeaderOn("a leader whose lease is on the promoted replica", promoted)
	t.Logf("failover %s -> %s; leader after it: %s, term %d, %v after it completed",
		old, promoted, after.ID(), after.Term(), time.Since(done))

	// The followers' watches, which the old master dropped, must now be on
	// the promoted replica.
	handOverToAnother(t, ctx, es, after, "the failover")
	closeAndCheckElectors(t, es, rec)
}

// startClusterElectors starts a candidate of election name for each of ids,
// each over a ClusterClient of c of its own with opts, at
// clusterElectorTTL, recorded by the returned Recorder.
func startClusterElectors(t *testing.T, c *testredis.Cluster, name string, opts *redisbackend.Options, ids ...string) ([]*sovereign.Elector, *electortest.Recorder) {
	t.Helper()
	rec := &electortest.Recorder{}
	var es []*sovereign.Elector
	for _, id := range ids {
		e, err := sovereign.New(newBackend(t, clusterClient(t, c), opts), name, id, &sovereign.Options{
			TTL: clusterElectorTTL, NoStartupJitter: true, Logger: electortest.Logger(),
		})
		if err != nil {
			t.Fatalf("sovereign.New: %v", err)
		}
		rec.Campaign(t, e)
		es = append(es, e)
	}
	return es, rec
}

// handOverToAnother makes leader, one of es, resign after event, and checks
// that another candidate leads next: a graceful hand-over carried by the
// followers' watches. The one that resigned sits out for 2 s
// (ResignSitOut), and the others, with their watches live, look again only
// when the lease would expire (6.7 s after its last renewal): so the next
// leader is another candidate only if a watch carried the release.
func handOverToAnother(t *testing.T, ctx context.Context, es []*sovereign.Elector, leader *sovereign.Elector, event string) {
	t.Helper()
	term := leader.Term()
	resigned := time.Now()
	if err := leader.Resign(ctx); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	var next *sovereign.Elector
	electortest.Eventually(t, "a new leader after the resignation", func() bool {
		ls := electortest.Leaders(es...)
		if len(ls) != 1 || ls[0].Term() <= term {
			return false
		}
		next = ls[0]
		return true
	})
	t.Logf("hand-over after %s: %s resigned, %s leads (term %d) %v later", event, leader.ID(), next.ID(), next.Term(), time.Since(resigned))
	if next.ID() == leader.ID() {
		t.Errorf("after the resignation %s led again, want another candidate, woken by its watch", leader.ID())
	}
}

// closeAndCheckElectors stops every candidate, checks that no two terms
// overlapped, and returns the terms.
func closeAndCheckElectors(t *testing.T, es []*sovereign.Elector, rec *electortest.Recorder) []electortest.Interval {
	t.Helper()
	for _, e := range es {
		_ = e.Close()
	}
	ivs := rec.Intervals()
	t.Logf("terms: %v", ivs)
	electortest.CheckNoOverlap(t, ivs)
	return ivs
}

// TestClusterWatchAfterUnseenFailover: a backend that had no subscription
// on a shard when it failed over (its pub/sub connection to the old master
// idle, its slot map out of date) gets no SUNSUBSCRIBE to learn of the
// move from; a watch it opens afterwards must still end on the promoted
// replica and see a release. It is refused, or opened on the old master
// (now a replica, which accepts the subscription and delivers nothing)
// and then closed once its silence is noticed; either way the caller
// watches again, as the test does, and the release is seen within the
// bound. (Without the role checks the watch stayed open and silent.)
func TestClusterWatchAfterUnseenFailover(t *testing.T) {
	c := startReplicatedCluster(t)
	ctx := ctxBound(t)
	opts := &redisbackend.Options{Prefix: "cu:", HealthCheckInterval: time.Second}
	w := newBackend(t, clusterClient(t, c), opts)
	b := newBackend(t, clusterClient(t, c), opts)
	slot := slotOf(t, ctx, c, "cu:", "k")
	master, _, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil {
		t.Fatal(err)
	}
	// A subscription on the shard, ended: the backend keeps its idle
	// connection to the master and its slot map.
	wctx, cancel := context.WithCancel(ctx)
	if _, err := w.Watch(wctx, "k"); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	cancel()
	direct := c.Node(master).NewClient(t, nil)
	eventually(t, "the watch unsubscribed", func() bool {
		m, err := direct.Do(ctx, "PUBSUB", "SHARDNUMSUB", "cu:{k}:events").Slice()
		return err == nil && len(m) == 2 && m[1] == int64(0)
	})

	if _, _, err := c.Failover(ctx, slot); err != nil {
		t.Fatal(err)
	}
	ctx = ctxBound(t) // a failover may take most of a bound on a loaded machine
	deadline := time.Now().Add(bound)
	for attempt := 1; ; attempt++ {
		if time.Now().After(deadline) {
			t.Fatalf("no release seen by a watch opened after the failover within %v (%d watches)", bound, attempt-1)
		}
		events := watchThenRelease(t, ctx, w, b, "k")
		for closed := false; !closed; {
			select {
			case e, ok := <-events:
				if ok && e.Type == backend.EventReleased {
					t.Logf("release seen by watch %d after the failover", attempt)
					return
				}
				closed = !ok
			case <-ctx.Done():
				t.Fatalf("watch %d after the failover: neither the release nor closed within %v", attempt, bound)
			}
		}
		t.Logf("watch %d after the failover closed; watching again", attempt)
	}
}

// TestClusterWatchAsksRoleAfterUnseenFailover: as in
// TestClusterWatchAfterUnseenFailover, a backend learns of a failover from
// no SUNSUBSCRIBE (it had no pub/sub connection) and its slot map names the
// old master, now a replica; but with the default health check, whose
// silence (27 s) outlasts the test's bound, only the role check before
// subscribing (checkMaster) keeps the watch from going to the replica,
// where it would stay silent. The first Watch after the failover is
// refused or goes to the promoted replica, and the release is seen.
func TestClusterWatchAsksRoleAfterUnseenFailover(t *testing.T) {
	c := startReplicatedCluster(t)
	ctx := ctxBound(t)
	opts := &redisbackend.Options{Prefix: "cr:"}
	// The slot map, loaded before the failover, is not reloaded for its
	// age during the test.
	wc := c.NewClusterClient(t, &redis.ClusterOptions{ContextTimeoutEnabled: true, ClusterStateReloadInterval: time.Hour})
	w := newBackend(t, wc, opts)
	b := newBackend(t, clusterClient(t, c), opts)
	if _, err := w.Get(ctx, "k"); !errors.Is(err, backend.ErrNotHeld) { // loads the map
		t.Fatalf("Get before the failover: got %v, want ErrNotHeld", err)
	}
	slot := slotOf(t, ctx, c, "cr:", "k")
	old, promoted, err := c.Failover(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("failover: %s -> %s", old, promoted)
	ctx = ctxBound(t)
	events := watchThenRelease(t, ctx, w, b, "k")
	for {
		select {
		case e, ok := <-events:
			if !ok {
				t.Fatal("watch opened after the failover: closed, want the release")
			}
			if e.Type == backend.EventReleased {
				return
			}
		case <-ctx.Done():
			t.Fatalf("watch opened after the failover: no release within %v (subscribed on the old master, now a replica?)", bound)
		}
	}
}

// TestClusterWaitOnKeysMaster: with WaitReplicas on a Cluster, WAIT goes
// on the connection that ran the script, to the key's master, so it counts
// the replicas that have this write. The replica of the key's shard is
// frozen (SIGSTOP), so no write there can be confirmed: every Acquire fails
// with ErrNotReplicated. A WAIT sent to another node (a connection without
// writes) would return at once with that node's replicas, confirming
// writes no replica has; with two masters, 14 acquisitions would all miss
// that with a chance of 1 in 16,384 if WAIT went to a random node.
func TestClusterWaitOnKeysMaster(t *testing.T) {
	c := startReplicatedCluster(t)
	ctx := ctxBound(t)
	b := newBackend(t, clusterClient(t, c), &redisbackend.Options{Prefix: "cwm:", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	slot := slotOf(t, ctx, c, "cwm:", "lock/t")
	_, replicas, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil || len(replicas) != 1 {
		t.Fatalf("replicas of slot %d: got %v, %v; want one", slot, replicas, err)
	}
	// A first call while every node answers loads the client's slot map
	// and go-redis's cache of the server's commands (COMMAND), each from a
	// random node. Left to the calls after the freeze, a load that started
	// on the frozen replica waited 5 s for it (go-redis's bound on a new
	// connection's handshake), and a failed COMMAND lookup was tried again
	// on the next call: three such waits used up ctx before the 14
	// acquisitions were done, and the next one failed with "context
	// deadline exceeded" (TestClusterCallKeepsItsDeadline).
	if _, err := b.Get(ctx, "lock/t"); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Get before the freeze: got %v, want ErrNotHeld", err)
	}
	frozen := c.Node(replicas[0])
	frozen.Pause(t)
	defer frozen.Resume(t)
	for i := range 14 {
		key := fmt.Sprintf("lock/t/%d", i) // all in the slot of {lock/t}
		if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute}); !errors.Is(err, redisbackend.ErrNotReplicated) {
			t.Fatalf("Acquire %q with the shard's replica frozen: got %v, want ErrNotReplicated", key, err)
		}
	}
}

// TestClusterCallKeepsItsDeadline: a call on a Cluster client returns by
// its context's deadline although the client is stuck on a node the call
// does not need. go-redis fills its cache of the server's commands
// (COMMAND) on the first command it routes, from a random node, under a
// context of its own (5 s, whatever the caller's; go-redis#2145), and
// tries again on the next command until it succeeds: a node that accepts
// connections but does not answer (frozen here; hung, swapping, behind a
// dropped route) held an Acquire of 300 ms for 5 s each time the lookup
// started there (in TestClusterWaitOnKeysMaster, three such waits used up
// its bound). Of two masters, the one without the key is frozen, so each
// of the fresh clients starts its lookup there with a chance of 1 in 2:
// some do, unless all of them miss it (1 in 65,536).
func TestClusterCallKeepsItsDeadline(t *testing.T) {
	const (
		clients  = 16
		deadline = 300 * time.Millisecond
	)
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 2})
	ctx := ctxBound(t)
	master, _, err := c.Shard(ctx, c.Addrs()[0], slotOf(t, ctx, c, "cd:", "k"))
	if err != nil {
		t.Fatal(err)
	}
	other := c.Addrs()[0]
	if other == master {
		other = c.Addrs()[1]
	}
	backends := make([]*redisbackend.Backend, clients)
	for i := range backends {
		cc := clusterClient(t, c)
		// The slot map, loaded while every node answers (no COMMAND).
		if err := cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil }); err != nil {
			t.Fatal(err)
		}
		backends[i] = newBackend(t, cc, &redisbackend.Options{Prefix: "cd:"})
	}
	frozen := c.Node(other)
	frozen.Pause(t)
	defer frozen.Resume(t) // before the cleanups: lets go-redis's lookups end
	var wg sync.WaitGroup
	took := make([]time.Duration, clients)
	errs := make([]error, clients)
	for i, b := range backends {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			start := time.Now()
			_, errs[i] = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: fmt.Sprint(i), TTL: time.Minute})
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	ended := 0
	for _, err := range errs {
		if errors.Is(err, context.DeadlineExceeded) {
			ended++
		}
	}
	t.Logf("%d of %d calls ran into the frozen node (context deadline exceeded)", ended, clients)
	for i := range clients {
		t.Logf("client %d: Acquire with %s frozen (the key on %s): %v after %v", i, other, master, errs[i], took[i])
		// go-redis's own bound is 5 s; 2 s leaves a loaded machine room.
		if took[i] > 2*time.Second {
			t.Errorf("client %d: Acquire with a deadline of %v, a node it does not need frozen: returned after %v (%v), want by its deadline",
				i, deadline, took[i], errs[i])
		}
	}
}

// TestClusterCrashKeepsLease: with WaitReplicas 1, a lease the master
// acknowledged is on its replica, so it survives the master's crash (a
// SIGKILL, then CLUSTER FAILOVER TAKEOVER on the replica: with one master
// of two left, no vote can promote it): the promoted replica holds it under
// the same term, and a competitor is told so. Until the old master is back
// (as the new master's replica) no write can be confirmed, so the holder's
// Renew fails (no leader rather than two); then it succeeds on the new
// master, and after the release the next term is greater.
func TestClusterCrashKeepsLease(t *testing.T) {
	c := startReplicatedCluster(t)
	ctx := ctxBound(t)
	opts := &redisbackend.Options{Prefix: "ck:", WaitReplicas: 1, WaitTimeout: sentinelWaitTimeout}
	a := newBackend(t, clusterClient(t, c), opts)
	b := newBackend(t, clusterClient(t, c), opts)
	reader := newBackend(t, clusterClient(t, c), &redisbackend.Options{Prefix: "ck:"})
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire before the crash: %v", err)
	}
	slot := slotOf(t, ctx, c, "ck:", "k")
	master, _, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil {
		t.Fatal(err)
	}
	c.Node(master).Kill(t)
	old, promoted, err := c.Takeover(ctx, slot)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("crash of %s, takeover by %s", old, promoted)
	ctx = ctxBound(t)

	var rec backend.Record
	if err := acrossSwitch(t, "Get after the takeover", func() error {
		var err error
		rec, err = reader.Get(ctx, "k")
		return err
	}); err != nil {
		t.Fatalf("Get after the takeover: %v", err)
	}
	if rec.HolderID != "a" || rec.Term != l.Term {
		t.Fatalf("record after the takeover: holder %q term %d, want a, %d", rec.HolderID, rec.Term, l.Term)
	}
	err = acrossSwitch(t, "competitor's Acquire", func() error {
		_, err := reader.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: time.Minute})
		return err
	})
	var held *backend.HeldError
	if !errors.As(err, &held) || held.Holder.HolderID != "a" || held.Holder.Term != l.Term {
		t.Fatalf("competitor's Acquire after the takeover: got %v, want a *backend.HeldError naming a, term %d", err, l.Term)
	}
	// The holder's client still names the dead node until its first call
	// fails to reach it; then it reloads its slot map.
	start := time.Now()
	for attempt := 1; ; attempt++ {
		err := a.Renew(ctx, l)
		if errors.Is(err, redisbackend.ErrNotReplicated) {
			t.Logf("Renew reached the new master at attempt %d, %v after the takeover", attempt, time.Since(start))
			break
		}
		if err == nil || !transient(err) || ctx.Err() != nil {
			t.Fatalf("Renew while the new master has no replica (attempt %d): got %v, want an error wrapping ErrNotReplicated", attempt, err)
		}
		time.Sleep(20 * time.Millisecond) // retrying a call that raced the switch
	}

	c.Node(old).Start(t)
	if err := c.ReplicaUp(ctx, old); err != nil {
		t.Fatal(err)
	}
	if err := acrossSwitch(t, "Renew", func() error { return a.Renew(ctx, l) }); err != nil {
		t.Fatalf("Renew once the old master is back as a replica: got %v, want nil", err)
	}
	if err := acrossSwitch(t, "Release", func() error { return a.Release(ctx, l) }); err != nil {
		t.Fatalf("Release: %v", err)
	}
	var lb backend.Lease
	if err := acrossSwitch(t, "Acquire after Release", func() error {
		var err error
		lb, err = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: time.Minute})
		return err
	}); err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	if lb.Term <= l.Term {
		t.Errorf("term after the crash: got %d, want > %d", lb.Term, l.Term)
	}
}

// TestClusterReshardKeepsElection: the slot of an election moves to
// another master (MIGRATE of its keys, as redis-cli --cluster reshard
// does) while one of three candidates leads. The leader keeps leading
// under the same term, its renewals following the keys; the lease is then
// on the new master; the followers' watches, dropped by the old master,
// are made again on the new one, so that a hand-over right after the move
// is carried by them (the candidate that resigns sits out 2 s, and the
// others would otherwise look again only when the lease would expire).
// Never two leaders.
func TestClusterReshardKeepsElection(t *testing.T) {
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 2})
	ctx := ctxBound(t)
	const name = "reshard-daemon"
	reader := newBackend(t, clusterClient(t, c), nil)
	es, rec := startClusterElectors(t, c, name, nil, "r1", "r2", "r3")
	var leader *sovereign.Elector
	electortest.Eventually(t, "a leader", func() bool {
		ls := electortest.Leaders(es...)
		if len(ls) != 1 {
			return false
		}
		leader = ls[0]
		return true
	})
	term := leader.Term()
	slot := slotOf(t, ctx, c, "sovereign:", name)
	from, _, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil {
		t.Fatal(err)
	}
	to := c.Addrs()[0]
	if to == from {
		to = c.Addrs()[1]
	}
	if _, err := c.MigrateSlot(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	moved := time.Now()
	ctx = ctxBound(t)
	direct := c.Node(to).NewClient(t, nil)
	electortest.Eventually(t, "the lease on the new master, renewed by the same leader", func() bool {
		r, err := reader.Get(ctx, name)
		if err != nil || r.HolderID != leader.ID() || r.Term != term {
			return false
		}
		got, err := direct.HGet(ctx, "sovereign:{"+name+"}", "term").Uint64()
		return err == nil && got == term && direct.PTTL(ctx, "sovereign:{"+name+"}").Val() > clusterElectorTTL/2
	})
	if !leader.IsLeader() || leader.Term() != term {
		t.Fatalf("after the move: %s leads %v under term %d, want it still leading under %d", leader.ID(), leader.IsLeader(), leader.Term(), term)
	}
	t.Logf("slot %d moved from %s to %s; %s still leads under term %d, %v later", slot, from, to, leader.ID(), term, time.Since(moved))

	handOverToAnother(t, ctx, es, leader, "the move")
	closeAndCheckElectors(t, es, rec)
}

// TestClusterWatchWithoutRole: an ACL user that may not run ROLE still
// watches on a Cluster. Watch asks a node's role before subscribing there
// (see TestClusterWatchAfterUnseenFailover); a refusal is an answer, not a
// failure: the check is skipped and the subscription goes where the slot
// map says.
func TestClusterWatchWithoutRole(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	if srv.External() {
		t.Skip("REDIS_ADDR is set: the test creates an ACL user on the server")
	}
	ctx := ctxBound(t)
	admin := srv.NewClient(t, nil)
	if err := admin.Do(ctx, "ACL", "SETUSER", "norole", "on", ">pw", "~*", "&*", "+@all", "-role").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	c := srv.NewClusterClient(t, &redis.ClusterOptions{Username: "norole", Password: "pw", ContextTimeoutEnabled: true})
	if err := c.Do(ctx, "ROLE").Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("ROLE as the ACL user: got %v, want NOPERM", err)
	}
	b := newBackend(t, c, &redisbackend.Options{Prefix: "nr:"})
	events, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch as a user without ROLE: %v", err)
	}
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	for {
		if e := next(t, events); e.Type == backend.EventReleased {
			return
		}
	}
}

// TestClusterMigrationWindowWithWaitReplicas pins what the README says of a
// resharding under WaitReplicas: between the move of a slot's keys and the
// slot's reassignment (redis-cli --cluster reshard moves the keys of a slot
// in batches, then reassigns it), a call with WaitReplicas on a key already
// moved gets ASK from the old master, which that path (EVALSHA and WAIT on
// the master's own connection) does not follow: the call fails, and
// succeeds again, on the same lease, once the slot is reassigned. A backend
// without WaitReplicas goes through the Cluster client, which follows ASK.
func TestClusterMigrationWindowWithWaitReplicas(t *testing.T) {
	c := startReplicatedCluster(t)
	ctx := ctxBound(t)
	b := newBackend(t, clusterClient(t, c), &redisbackend.Options{Prefix: "mw:", WaitReplicas: 1, WaitTimeout: sentinelWaitTimeout})
	plain := newBackend(t, clusterClient(t, c), &redisbackend.Options{Prefix: "mw:"})
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	slot := slotOf(t, ctx, c, "mw:", "k")
	from, _, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil {
		t.Fatal(err)
	}
	to := ""
	for _, a := range c.Addrs() {
		if a == from {
			continue
		}
		if role, err := c.Node(a).NewClient(t, nil).Do(ctx, "ROLE").Slice(); err == nil && role[0] == "master" {
			to = a
			break
		}
	}
	if to == "" {
		t.Fatalf("no other master than %s", from)
	}
	if _, err := c.MigrateKeys(ctx, slot, to); err != nil {
		t.Fatal(err)
	}
	if err := b.Renew(ctx, l); err == nil || !strings.Contains(err.Error(), "ASK") {
		t.Errorf("Renew with WaitReplicas while the slot's keys are moved, not yet its slot: got %v, want the ASK error", err)
	}
	if err := plain.Renew(ctx, l); err != nil {
		t.Errorf("Renew without WaitReplicas in the same window: %v, want the Cluster client to follow ASK", err)
	}
	if err := c.FinishMigration(ctx, slot, from, to); err != nil {
		t.Fatal(err)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Errorf("Renew with WaitReplicas once the slot is reassigned: %v", err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Errorf("Release: %v", err)
	}
}

// watchThenRelease watches key on w after a failover, then acquires and
// releases key on b, each call retried across the switch (acrossSwitch).
// It returns the watch's channel, on which the release should arrive.
func watchThenRelease(t *testing.T, ctx context.Context, w, b *redisbackend.Backend, key string) <-chan backend.Event {
	t.Helper()
	var events <-chan backend.Event
	if err := acrossSwitch(t, "Watch after the failover", func() error {
		var err error
		events, err = w.Watch(ctx, key)
		return err
	}); err != nil {
		t.Fatalf("Watch after the failover: %v", err)
	}
	var l backend.Lease
	if err := acrossSwitch(t, "Acquire after the failover", func() error {
		var err error
		l, err = b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "b", TTL: time.Minute})
		return err
	}); err != nil {
		t.Fatalf("Acquire after the failover: %v", err)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatalf("Release after the failover: %v", err)
	}
	return events
}
