package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// The tests of this file run RestartGuard on a real Redis Cluster. The
// acquisition script runs on the master of the key's slot, so LASTSAVE
// and INFO are that node's: the guard is per node. A master restarted
// without persistence (testredis.Cluster.Restart: it keeps its slots,
// being back well within cluster-node-timeout) answers CLUSTERDOWN for
// its first 2 s (CLUSTER_WRITABLE_DELAY), so the TTLs here are long
// enough for a refusal to outlast that.

// clusterGuardTTL is the TTL of the Cluster RestartGuard tests.
const clusterGuardTTL = 6 * time.Second

// masterKeys returns the addresses of the cluster's masters (sorted) and,
// for each, n keys whose slot it serves: plain keys (name(i)) whose lease
// under prefix (see slotOf) maps there.
func masterKeys(t *testing.T, ctx context.Context, c *testredis.Cluster, n int, slotName func(string) string) ([]string, map[string][]string) {
	t.Helper()
	keys := make(map[string][]string)
	for i := 0; i < 10000; i++ {
		k := fmt.Sprintf("k%d", i)
		slot, err := c.Slot(ctx, slotName(k))
		if err != nil {
			t.Fatal(err)
		}
		m, _, err := c.Shard(ctx, c.Addrs()[0], slot)
		if err != nil {
			t.Fatal(err)
		}
		if len(keys[m]) < n {
			keys[m] = append(keys[m], k)
		}
		full := len(keys) == 3
		for _, ks := range keys {
			full = full && len(ks) == n
		}
		if full {
			break
		}
	}
	var masters []string
	for m := range keys {
		masters = append(masters, m)
	}
	slices.Sort(masters)
	if len(masters) != 3 {
		t.Fatalf("keys found on %d masters, want 3: %v", len(masters), keys)
	}
	return masters, keys
}

// refusalFrom checks that err is a refusal of the RestartGuard for key, to
// an acquisition of TTL ttl, that the node at addr computed: its time
// left is what that node's uptime leaves of the TTL (plus the second of
// rounding), with its uptime read just before (upBefore) and just after.
func refusalFrom(t *testing.T, err error, key string, ttl time.Duration, admin *redis.Client, upBefore int) time.Duration {
	t.Helper()
	w := mayBeHeldTTL(t, err, key, ttl)
	upAfter := uptime(t, admin)
	lo := ttl + time.Second - time.Duration(upAfter)*time.Second
	hi := ttl + time.Second - time.Duration(upBefore)*time.Second
	if w < lo || w > hi {
		t.Fatalf("acquire %q: refused for %v, want [%v, %v]: the TTL less the key's master's uptime (%d-%d s) plus a second",
			key, w, lo, hi, upBefore, upAfter)
	}
	return w
}

// A master of a Cluster without replicas restarts without persistence:
// the keys it served are refused for the TTL (MayBeHeld, and the time left
// by that master's uptime), to a new backend and to the old holder's plain
// acquisition alike, with Acquire, AcquireMode (Shared) and package lock's
// Shared TryAcquire; free keys on the other two masters, up for longer,
// are acquired at once: the guard is per node. The old holder's reclaims
// (Acquire and AcquireMode) go through on the restarted master; once it has
// been up for the TTL the key is handed out, under a term above the lost
// one.
func TestRestartGuardClusterPerNode(t *testing.T) {
	const ttl = clusterGuardTTL
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 3})
	ctx := context.Background()
	opts := &redisbackend.Options{Prefix: "rgc:", RestartGuard: true}
	masters, keys := masterKeys(t, ctx, c, 3, func(k string) string { return "rgc:{" + k + "}" })
	_, locks := masterKeys(t, ctx, c, 1, func(k string) string { return "rgc:{" + backend.LockKeyPrefix + k + "}" })
	restarted, others := masters[0], masters[1:]
	admin := c.Node(restarted).NewClient(t, nil)

	old := newBackend(t, clusterClient(t, c), opts)
	req := func(key, id string) backend.AcquireRequest {
		return backend.AcquireRequest{Key: key, HolderID: id, TTL: ttl}
	}
	shared := func(key, id string) backend.ModeRequest {
		return backend.ModeRequest{AcquireRequest: req(key, id), Mode: backend.Shared}
	}
	// Each master refuses during its own first TTL; these end it. On the
	// restarted master the old holder keeps its leases (a plain one and a
	// Shared one), which the restart loses.
	var lost backend.Lease
	for _, m := range masters {
		l := acquireOnceRefusalsEnd(t, old, req(keys[m][0], "old"), ttl+10*time.Second)
		if m == restarted {
			lost = l
			continue
		}
		if err := old.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	lostShared, err := old.AcquireMode(ctx, shared(keys[restarted][1], "old"))
	if err != nil {
		t.Fatalf("AcquireMode before the restart: %v", err)
	}

	c.Restart(t, restarted)
	fresh := newBackend(t, clusterClient(t, c), opts)
	up := uptime(t, admin)
	if up >= int(ttl/time.Second) {
		t.Fatalf("the restarted master answered only after %d s, want well within the TTL (%v)", up, ttl)
	}
	t.Logf("master %s restarted; up %d s when it answers", restarted, up)

	// The restarted master's keys: refused, whoever asks.
	err = acrossSwitch(t, "Acquire on the restarted master", func() error {
		_, err := fresh.Acquire(ctx, req(keys[restarted][0], "fresh"))
		return err
	})
	refusalFrom(t, err, keys[restarted][0], ttl, admin, up)
	up = uptime(t, admin)
	err = acrossSwitch(t, "the old holder's Acquire", func() error { // its connection to the master broke
		_, err := old.Acquire(ctx, req(keys[restarted][0], "old"))
		return err
	})
	refusalFrom(t, err, keys[restarted][0], ttl, admin, up)
	up = uptime(t, admin)
	_, err = fresh.AcquireMode(ctx, shared(keys[restarted][1], "fresh"))
	refusalFrom(t, err, keys[restarted][1], ttl, admin, up)
	up = uptime(t, admin)
	_, err = fresh.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: req(keys[restarted][2], "fresh"), Mode: backend.Exclusive})
	refusalFrom(t, err, keys[restarted][2], ttl, admin, up)
	lk, err := lock.New(fresh, "fresh", &lock.Options{TTL: ttl, Logger: electortest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lk.Close() })
	_, err = lk.TryAcquire(ctx, locks[restarted][0], &lock.AcquireOptions{Mode: lock.Shared})
	var lheld *lock.HeldError
	if !errors.As(err, &lheld) || !lheld.MayBeHeld {
		t.Fatalf("lock TryAcquire Shared on the restarted master: got %v, want a *lock.HeldError with MayBeHeld", err)
	}

	// The other masters' free keys: at once.
	for _, m := range others {
		if l, err := fresh.Acquire(ctx, req(keys[m][1], "fresh")); err != nil {
			t.Errorf("Acquire %q on master %s (not restarted): got %v, want it at once", keys[m][1], m, err)
		} else if err := fresh.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if l, err := fresh.AcquireMode(ctx, shared(keys[m][2], "fresh")); err != nil {
			t.Errorf("AcquireMode Shared %q on master %s (not restarted): got %v, want it at once", keys[m][2], m, err)
		} else if err := fresh.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if l, err := lk.TryAcquire(ctx, locks[m][0], &lock.AcquireOptions{Mode: lock.Shared}); err != nil {
			t.Errorf("lock TryAcquire Shared %q on master %s (not restarted): got %v, want it at once", locks[m][0], m, err)
		} else if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The old holder's reclaims go through on the restarted master.
	if up := uptime(t, admin); up >= int(ttl/time.Second) {
		t.Fatalf("the restarted master has been up %d s: too late to tell a reclaim from the refusal's end (TTL %v)", up, ttl)
	}
	rq := req(keys[restarted][0], "old")
	rq.Reclaim = true
	rl, err := old.Acquire(ctx, rq)
	if err != nil {
		t.Fatalf("the old holder's reclaim during the refusal: got %v, want it let through", err)
	}
	if rl.Term <= lost.Term {
		t.Errorf("reclaimed term %d, want above the lost lease's %d", rl.Term, lost.Term)
	}
	rs := shared(keys[restarted][1], "old")
	rs.Reclaim = true
	rsl, err := old.AcquireMode(ctx, rs)
	if err != nil {
		t.Fatalf("the old holder's Shared reclaim during the refusal: got %v, want it let through", err)
	}
	if rsl.Term <= lostShared.Term {
		t.Errorf("reclaimed Shared term %d, want above the lost one's %d", rsl.Term, lostShared.Term)
	}
	for _, l := range []backend.Lease{rl, rsl} {
		if err := old.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}

	// The refusal ends when the restarted master has been up for the TTL.
	next := acquireOnceRefusalsEnd(t, fresh, req(keys[restarted][0], "fresh"), ttl+10*time.Second)
	if up := uptime(t, admin); up < int(ttl/time.Second) {
		t.Errorf("acquired when the restarted master had been up %d s, want at least the TTL (%v)", up, ttl)
	}
	if next.Term <= rl.Term {
		t.Errorf("term after the refusal %d, want above %d", next.Term, rl.Term)
	}
}

// slowHook delays every command and pipeline of its client by delay while
// on is set: a slow link.
type slowHook struct {
	on    atomic.Bool
	delay time.Duration
}

func (h *slowHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *slowHook) wait(ctx context.Context) error {
	if !h.on.Load() {
		return nil
	}
	select {
	case <-time.After(h.delay): // the link's latency, not a synchronisation
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *slowHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

func (h *slowHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := h.wait(ctx); err != nil {
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// TestRestartGuardOldLeaderLeadsOn on a Cluster: three electors of one
// election whose key's master restarts without persistence (a Cluster of
// three masters without replicas). The leader's renewals fail while the
// master is down and answers CLUSTERDOWN, then find the lease gone before
// the renew deadline: its reclaim goes through and it leads again, under
// a new term, while the master has been up for less than the TTL; nobody
// else leads. The followers saw the restart (their watches broke), so
// they wait a TTL by themselves before they take a free key; a candidate
// started just after the restart did not, and only the guard stops it: the
// leader's link is made slow (300 ms a command) from the restart on, so
// that the late candidate reaches the free key first. Without the guard it
// leads.
func TestRestartGuardClusterOldLeaderLeadsOn(t *testing.T) {
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 3})
	ctx := context.Background()
	slot := slotOf(t, ctx, c, "sovereign:", "daemon")
	master, _, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil {
		t.Fatal(err)
	}
	admin := c.Node(master).NewClient(t, nil)
	oldLeaderLeadsOn(t, oldLeaderRun{
		ttl:           8 * time.Second, // the renew deadline (5.6 s) outlasts the master's return
		delay:         300 * time.Millisecond,
		renewInterval: time.Second,
		client:        func() redis.UniversalClient { return clusterClient(t, c) },
		restart:       func() { c.Restart(t, master) },
		uptime:        func() int { return uptime(t, admin) },
	})
}

// A master with a replica restarts without persistence, quickly (well
// within cluster-node-timeout, so no failover): it comes back a master,
// empty, and its replica, which had the lease, resynchronises from it and
// is emptied too. The guard refuses the key on the restarted master as
// it does without replicas.
func TestRestartGuardClusterRestartWithReplica(t *testing.T) {
	// Longer than clusterGuardTTL: the master's restart, the replica's
	// resynchronisation and the attempt took more than 6 s once in CI on
	// a loaded machine, after which the guard rightly let the key through.
	// Nothing here waits for the TTL, so a longer one costs no time.
	const ttl = 30 * time.Second
	c := startReplicatedCluster(t)
	ctx := context.Background()
	opts := &redisbackend.Options{Prefix: "rgr:", RestartGuard: true}
	slot := slotOf(t, ctx, c, "rgr:", "k")
	master, replicas, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil {
		t.Fatal(err)
	}
	admin := c.Node(master).NewClient(t, nil)
	replicaAdmin := c.Node(replicas[0]).NewClient(t, nil)
	old := newBackend(t, clusterClient(t, c), &redisbackend.Options{Prefix: "rgr:", WaitReplicas: 1, WaitTimeout: sentinelWaitTimeout})
	if _, err := old.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "old", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire before the restart: %v", err)
	}
	if n, err := replicaAdmin.DBSize(ctx).Result(); err != nil || n == 0 {
		t.Fatalf("the replica's DBSIZE before the restart: %d, %v; want the lease (and its term counter)", n, err)
	}

	c.Restart(t, master)
	if err := c.ReplicaUp(ctx, replicas[0]); err != nil {
		t.Fatal(err)
	}
	if n, err := replicaAdmin.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Fatalf("the replica's DBSIZE after it resynchronised from the restarted master: %d, %v; want 0", n, err)
	}
	up := uptime(t, admin)
	fresh := newBackend(t, clusterClient(t, c), opts)
	err = acrossSwitch(t, "Acquire on the restarted master", func() error {
		_, err := fresh.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "fresh", TTL: ttl})
		return err
	})
	refusalFrom(t, err, "k", ttl, admin, up)
}

// What RestartGuard does not cover: a failover to a replica that lacked
// the lease. The holder acquires (without WaitReplicas) while its master's
// replica is frozen behind 32 MB of other writes, so the acquisition never
// leaves the master's memory; the master crashes and the replica takes
// over. The promoted replica has been up all along, so a new backend with
// RestartGuard gets the key at once, while the old holder's lease still
// has most of its minute to run: two holders. (WaitReplicas would have
// refused the acquisition instead; a failover of a replica that had the
// lease keeps it held: TestClusterFailoverKeepsLease.)
func TestRestartGuardClusterFailoverNotCovered(t *testing.T) {
	const ttl = 3 * time.Second // the new acquirer's
	c := startReplicatedCluster(t)
	ctx := context.Background()
	opts := &redisbackend.Options{Prefix: "rgf:", RestartGuard: true}
	slot := slotOf(t, ctx, c, "rgf:", "k")
	master, replicas, err := c.Shard(ctx, c.Addrs()[0], slot)
	if err != nil {
		t.Fatal(err)
	}
	replica := replicas[0]
	replicaAdmin := c.Node(replica).NewClient(t, nil)
	old := newBackend(t, clusterClient(t, c), opts)
	// Past the master's own first TTL, and the replica's (started just
	// after it), before the replica is frozen.
	l := acquireOnceRefusalsEnd(t, old, backend.AcquireRequest{Key: "k", HolderID: "old", TTL: ttl}, ttl+10*time.Second)
	if err := old.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replica up for the TTL", func() bool { return uptime(t, replicaAdmin) > int(ttl/time.Second)+1 })

	c.Node(replica).Pause(t)
	direct := c.Node(master).NewClient(t, nil)
	junk := make([]byte, 1<<20)
	for i := range 32 { // more than the kernel's socket buffers hold
		if err := direct.Set(ctx, fmt.Sprintf("rgf:{k}junk%d", i), junk, 0).Err(); err != nil {
			t.Fatalf("SET on the master: %v", err)
		}
	}
	// The holder's TTL is longer than the master has been up: a backend
	// without the guard (with it, the acquisition would be refused).
	const oldTTL = time.Minute
	held, err := newBackend(t, clusterClient(t, c), &redisbackend.Options{Prefix: "rgf:"}).Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "old", TTL: oldTTL})
	acquired := time.Now()
	if err != nil {
		t.Fatalf("the old holder's Acquire: %v", err)
	}
	c.Node(master).Kill(t)
	c.Node(replica).Resume(t)
	if _, promoted, err := c.Takeover(ctx, slot); err != nil {
		t.Fatal(err)
	} else if promoted != replica {
		t.Fatalf("promoted %s, want %s", promoted, replica)
	}
	if n, err := replicaAdmin.Exists(ctx, "rgf:{k}").Result(); err != nil || n != 0 {
		t.Fatalf("the promoted replica has the lease (EXISTS %d, %v): the test failed to make it lack the write", n, err)
	}

	fresh := newBackend(t, clusterClient(t, c), opts)
	var got backend.Lease
	err = acrossSwitch(t, "Acquire on the promoted replica", func() error {
		var err error
		got, err = fresh.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "fresh", TTL: ttl})
		return err
	})
	up := uptime(t, replicaAdmin)
	if err != nil {
		t.Fatalf("Acquire on the promoted replica (up %d s): got %v, want the key at once: the guard sees no restart", up, err)
	}
	if since := time.Since(acquired); since >= oldTTL {
		t.Fatalf("the old holder's lease expired (%v) before the new acquisition: nothing shown", since)
	}
	t.Logf("%s (up %d s) handed out %q under term %d while the old holder's lease (term %d) has %v left",
		replica, up, "k", got.Term, held.Term, oldTTL-time.Since(acquired))
}
