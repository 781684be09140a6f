package chaos_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/internal/chaos"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

var flagClusterNoWait = flag.Bool("chaos.cluster-nowait", false,
	"also run TestChaosClusterNoWait: the Cluster run without WaitReplicas, to show the overlaps a failover can cause (reported, not failed)")

// clusterNodeTimeout is the Cluster runs' cluster-node-timeout: above the
// longest pause of a master (TTL + 1.5 s), so that none is failed over
// automatically.
const clusterNodeTimeout = 5 * time.Second

// clusterVoteWait is how long after a planned failover another one may be
// sent: a master does not vote again for the failover of a master it voted
// about within twice the node timeout, and the shard's two nodes take turns
// as its master (a failover sent sooner gets no votes, and the master
// stops its clients for 5 s each time it is tried).
const clusterVoteWait = 2*clusterNodeTimeout + time.Second

// waitTimeout is redisbackend's WaitTimeout of the Cluster runs'
// candidates: below their request timeout, so that a write no replica
// confirms fails with ErrNotReplicated rather than at the call's deadline.
const waitTimeout = 200 * time.Millisecond

// Keys of the election and of the lock of the chaos runs, as redisbackend
// names them (its default prefix): the faults of a Cluster run hit the
// master that serves their slot.
const (
	electionKeyName = "sovereign:{chaos}"
	lockKeyName     = "sovereign:{lock/chaos}{/job}"
)

// TestChaosCluster runs the checker in the election mode against a real
// Redis Cluster of three masters with one replica each, the candidates
// with WaitReplicas 1, each reaching every node through a proxy of its own.
// The faults hit the master that serves the election's slot: a planned
// failover (CLUSTER FAILOVER), a crash with its replica promoted by
// TAKEOVER (after the replica lagged behind: frozen for 0.5 to 3 s first),
// and a pause beyond the TTL. No overlap is excused: with WaitReplicas a
// failover loses no acknowledged lease; the leader leads through a planned
// failover, and nobody acquires or renews while the master has no replica. Random faults (of the candidates
// and of the Cluster) follow only when -chaos.duration is given.
func TestChaosCluster(t *testing.T) {
	nodes, kinds, k := clusterFaults(t, electionKeyName)
	r := runSpec(t, spec{mode: "elect", backend: "cluster", nodes: nodes, dur: clusterDuration(), kinds: kinds, waitReplicas: 1, inspect: k.noReplicaCheck,
		first: []planned{{kind: k.failover}, {kind: k.takeoverLag}, {kind: k.pause, long: true}}})
	checkClusterRun(t, r)
	// The lease survives a planned failover: the leader leads through it
	// under the same term.
	if r != nil && r.FailoverN[k.failover.name] > 0 {
		t.Errorf("chaos cluster: the leader lost its leadership across %d of %d planned failovers, want none",
			r.FailoverN[k.failover.name], r.Faults[k.failover.name])
	}
}

// TestChaosClusterLock is TestChaosCluster in the lock mode: the faults
// hit the master that serves the lock's slot, a planned failover, a crash
// with TAKEOVER and the old master restarted without its data, and a pause
// beyond the TTL; random ones follow with -chaos.lock-duration.
func TestChaosClusterLock(t *testing.T) {
	nodes, kinds, k := clusterFaults(t, lockKeyName)
	r := runSpec(t, spec{mode: "lock", backend: "cluster", nodes: nodes, dur: *flagLockDuration, kinds: kinds, waitReplicas: 1, inspect: k.noReplicaCheck,
		first: []planned{{kind: k.failover}, {kind: k.takeoverNoData}, {kind: k.pause, long: true}}})
	checkClusterRun(t, r)
}

// TestChaosClusterNoWait (opt-in: -chaos.cluster-nowait) runs the Cluster
// faults, in the election and the lock mode, with candidates without
// WaitReplicas. A takeover may then lose what the master acknowledged and
// the replica had not received (a replica frozen for a moment before the
// crash lags behind by that moment; meanwhile, in the lock mode, the lock
// changes hands), and a master restarted without its data serves an empty
// slot until it learns that it is a replica: the checker reports what
// follows (overlaps, terms granted twice, writes fenced). Violations are
// reported, not failed. -chaos.duration and -chaos.lock-duration add
// random faults after the planned ones.
func TestChaosClusterNoWait(t *testing.T) {
	if !*flagClusterNoWait {
		t.Skip("opt-in: -chaos.cluster-nowait")
	}
	for _, mode := range []string{"elect", "lock"} {
		t.Run(mode, func(t *testing.T) {
			key, dur := electionKeyName, clusterDuration()
			if mode == "lock" {
				key, dur = lockKeyName, *flagLockDuration
			}
			nodes, kinds, k := clusterFaults(t, key)
			r := runSpec(t, spec{mode: mode, backend: "cluster", nodes: nodes, dur: dur, kinds: kinds, wantViolations: true,
				first: []planned{{kind: k.takeoverLag}, {kind: k.takeoverNoData}, {kind: k.takeoverLag}, {kind: k.failover}, {kind: k.takeoverLag}}})
			if r != nil {
				t.Logf("chaos cluster without WaitReplicas (%s): %d overlaps, %d violations in all", mode, r.Overlaps, len(r.Violations))
				for _, v := range r.Violations {
					t.Logf("  %s", v)
				}
			}
		})
	}
}

// checkClusterRun checks what a Cluster run with WaitReplicas adds to the
// analysis: no overlap at all (none is excused: no fault is marked as
// losing data), and every planned Cluster fault was injected.
func checkClusterRun(t *testing.T, r *chaos.Report) {
	t.Helper()
	if r == nil {
		return
	}
	if r.Overlaps > 0 || r.DataLossOverlaps > 0 {
		t.Errorf("chaos cluster with WaitReplicas 1: %d overlaps (%d inside data-loss windows), want none", r.Overlaps, r.DataLossOverlaps)
	}
	n := 0
	for kind, c := range r.Faults {
		if strings.HasPrefix(kind, "cluster-") {
			n += c
		}
	}
	if n < 3 {
		t.Errorf("chaos cluster: %d faults of the Cluster injected, want at least the 3 planned ones", n)
	}
}

// takeoverBy makes the replica at promoted the master of slot with CLUSTER
// FAILOVER TAKEOVER (its master old is down) and waits until it reports
// the master role and every node that answers names it for slot.
func takeoverBy(ctx context.Context, c *testredis.Cluster, admin map[string]*redis.Client, slot int, old, promoted string) error {
	if err := admin[promoted].Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		return fmt.Errorf("CLUSTER FAILOVER TAKEOVER on %s: %w", promoted, err)
	}
	var last error
	for ctx.Err() == nil {
		last = nil
		role, err := admin[promoted].Do(ctx, "ROLE").Slice()
		if err != nil || len(role) == 0 || role[0] != "master" {
			last = fmt.Errorf("%s: ROLE %v, %v; want master", promoted, role, err)
		}
		for _, addr := range c.Addrs() {
			if last != nil {
				break
			}
			if addr == old || admin[addr].Ping(ctx).Err() != nil {
				continue
			}
			if m, _, err := c.Shard(ctx, addr, slot); err != nil || m != promoted {
				last = fmt.Errorf("%s names %s the master of slot %d (%v), want %s", addr, m, slot, err, promoted)
			}
		}
		if last == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond) // polling the cluster's view of the shard
	}
	return fmt.Errorf("takeover of slot %d by %s: %w (last: %w)", slot, promoted, ctx.Err(), last)
}

// clusterDuration is how long random faults follow the planned ones in
// the election mode's Cluster runs: -chaos.duration (or
// SOVEREIGN_CHAOS_DURATION) when given, else none, to keep the short form
// short.
func clusterDuration() time.Duration {
	explicit := os.Getenv("SOVEREIGN_CHAOS_DURATION") != ""
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "chaos.duration" })
	if !explicit {
		return 0
	}
	return duration()
}

// clusterKinds are the faults of a Redis Cluster run, by name.
type clusterKinds struct {
	failover, takeover, takeoverNoData, takeoverLag, pause faultKind
	// noReplica are the windows in which the key's master had no replica
	// at all: from the promotion of a takeover to the restart of the old
	// master's process (which then becomes its replica).
	noReplica *[][2]int64
}

// noReplicaCheck checks the README's "no leader rather than two": with
// WaitReplicas, no acquisition or renewal may succeed while the key's
// master has no replica (sent after the promotion, returned before the old
// master's process was started again).
func (k clusterKinds) noReplicaCheck(t *testing.T, run chaos.Run) {
	n := 0
	for _, p := range run.Procs {
		for _, l := range p.Lines {
			if (l.Ev != chaos.EvAcquire && l.Ev != chaos.EvRenew) || l.Err != "" {
				continue
			}
			for _, w := range *k.noReplica {
				if l.Sent >= w[0] && l.Done <= w[1] {
					n++
					t.Errorf("%s: %s of term %d succeeded (sent %d, returned %d) while the master had no replica (%d to %d): want ErrNotReplicated",
						p.ID, l.Ev, l.Term, l.Sent, l.Done, w[0], w[1])
				}
			}
		}
	}
	t.Logf("chaos cluster: %d windows without a replica, %d acquisitions or renewals succeeded in them", len(*k.noReplica), n)
}

// clusterFaults starts a Redis Cluster of three masters with one replica
// each, every node with an append-only file (fsync always), and returns
// its nodes' addresses, every kind of fault of a Cluster run (the
// candidates' own, and the Cluster's on the master that serves the slot
// of key at the time), and the Cluster's kinds by name.
func clusterFaults(t *testing.T, key string) ([]string, []faultKind, clusterKinds) {
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: 3, Replicas: 1,
		// No delay before a full sync (5 s by default): a restarted
		// master is a replica again sooner. A replication ping a second
		// (10 s by default): a replica shows as online in CLUSTER SHARDS
		// (which Failover and Takeover read) once its offset has moved.
		// A node timeout of 5 s (15 s by default), still above the
		// longest pause of a master, so that a shard can be failed over
		// again sooner (see clusterVoteWait).
		Args: []string{"--appendonly", "yes", "--appendfsync", "always",
			"--repl-diskless-sync-delay", "0", "--repl-ping-replica-period", "1",
			"--cluster-node-timeout", fmt.Sprint(clusterNodeTimeout.Milliseconds())}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	slot, err := c.Slot(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	aofDir := make(map[string]string)
	admin := make(map[string]*redis.Client)
	for _, addr := range c.Addrs() {
		admin[addr] = c.Node(addr).NewClient(t, nil)
		aofDir[addr] = filepath.Join(configGet(t, admin[addr], "dir"), configGet(t, admin[addr], "appenddirname"))
	}
	// marker is a key of slot outside the backend's names: written on the
	// master while its replica lags, it must be gone after the takeover.
	marker := key[strings.IndexByte(key, '{'):strings.IndexByte(key, '}')+1] + "chaos-marker"
	// shard returns the master of slot and its replicas online, as the
	// first node that answers sees them, once it names a replica online
	// (a restarted old master shows as one a moment after it is one).
	shard := func(t *testing.T, ctx context.Context) (string, []string) {
		var err error
		for ctx.Err() == nil {
			for _, addr := range c.Addrs() {
				var m string
				var rs []string
				if m, rs, err = c.Shard(ctx, addr, slot); err == nil && len(rs) > 0 {
					return m, rs
				}
			}
			time.Sleep(20 * time.Millisecond) // polling the cluster's view of the shard
		}
		t.Fatalf("the shard of slot %d: no replica online: %v", slot, err)
		return "", nil
	}
	bounded := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Minute)
	}
	k := clusterKinds{noReplica: new([][2]int64)}
	// A planned failover: the master stops its clients until the replica
	// has every write it acknowledged, and they swap roles. The store is
	// back when every node names the new master.
	var voted time.Time // the last planned failover
	k.failover = faultKind{name: "cluster-failover", server: func(t *testing.T, _ time.Duration) (int64, int64) {
		ctx, cancel := bounded()
		defer cancel()
		pause(time.Until(voted.Add(clusterVoteWait)))
		if _, _, err := c.Failover(ctx, slot); err != nil {
			t.Error(err)
		}
		voted = time.Now()
		return 0, chaos.Now()
	}}
	// The master paused (SIGSTOP) for the fault's duration: mostly beyond
	// the TTL, far below cluster-node-timeout (15 s), so no failover.
	k.pause = faultKind{name: "cluster-pause", shortOdds: 5, server: func(t *testing.T, d time.Duration) (int64, int64) {
		ctx, cancel := bounded()
		defer cancel()
		m, _ := shard(t, ctx)
		c.Node(m).Pause(t)
		pause(d)
		c.Node(m).Resume(t)
		return 0, chaos.Now()
	}}
	// takeover kills the master (kill -9), promotes its replica with
	// CLUSTER FAILOVER TAKEOVER, keeps the old master down for the fault's
	// duration, restarts it (with its append-only file, or without it when
	// lose is set: empty, with only its cluster configuration) and waits
	// until it is the new master's replica with its link up. With lag, the
	// replica is frozen (SIGSTOP) and the master drops its link to it
	// (CLIENT KILL TYPE replica) 0.5 to 3 s before the crash, and the
	// replica is thawed just after it: it lacks what the master
	// acknowledged meanwhile (a marker key written then is checked to be
	// gone). Freezing alone would lose nothing: what the master sent is
	// in the link's socket buffers, and a thawed replica reads it all.
	// Restarted is when the promotion is done, Healed when the old master
	// is a replica again (from then on WAIT can be satisfied).
	takeover := func(lose, lag bool) serverFault {
		return func(t *testing.T, d time.Duration) (int64, int64) {
			ctx, cancel := bounded()
			defer cancel()
			m, rs := shard(t, ctx)
			if lag {
				if err := admin[m].Del(ctx, marker).Err(); err != nil {
					t.Errorf("DEL %s on %s: %v", marker, m, err)
				}
				c.Node(rs[0]).Pause(t)
				if err := admin[m].ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
					t.Errorf("CLIENT KILL TYPE replica on %s: %v", m, err)
				}
				if err := admin[m].Set(ctx, marker, "1", 0).Err(); err != nil {
					t.Errorf("SET %s on %s: %v", marker, m, err)
				}
				pause(500*time.Millisecond + rand.N(2500*time.Millisecond))
			}
			c.Node(m).Kill(t)
			if lag {
				c.Node(rs[0]).Resume(t)
			}
			// The replica named before: once its master is gone, and
			// its own link dropped, the nodes may no longer list it as
			// online, where Cluster.Takeover looks for one.
			promoted := rs[0]
			err := takeoverBy(ctx, c, admin, slot, m, promoted)
			if err != nil {
				t.Error(err)
			}
			at := chaos.Now()
			if lag && err == nil {
				if n, err := admin[promoted].Exists(ctx, marker).Result(); err != nil || n != 0 {
					t.Errorf("after a takeover by a lagging replica: got %d marker keys on %s (err %v), want 0 (the write after the link dropped lost)", n, promoted, err)
				}
			}
			pause(d)
			if lose {
				if err := os.RemoveAll(aofDir[m]); err != nil {
					t.Errorf("wipe the append-only files of %s: %v", m, err)
				}
			}
			*k.noReplica = append(*k.noReplica, [2]int64{at, chaos.Now()})
			c.Node(m).Start(t)
			if err := c.ReplicaUp(ctx, m); err != nil {
				t.Error(err)
			}
			return at, chaos.Now()
		}
	}
	k.takeover = faultKind{name: "cluster-takeover", server: takeover(false, false), shortOdds: 5}
	k.takeoverNoData = faultKind{name: "cluster-takeover-nodata", server: takeover(true, false), shortOdds: 5}
	k.takeoverLag = faultKind{name: "cluster-takeover-lag", server: takeover(false, true), shortOdds: 5}
	return c.Addrs(), []faultKind{kill, stop, cut, drop, latency, k.failover, k.takeover, k.takeoverNoData, k.takeoverLag, k.pause}, k
}
