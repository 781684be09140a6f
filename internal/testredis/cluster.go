package testredis

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterBound is how long StartCluster waits for the cluster to be ready
// and Cluster.Failover for a failover to complete.
const clusterBound = 30 * time.Second

// clusterManualFailoverWait is how long Cluster.Failover gives one CLUSTER
// FAILOVER before it sends another: the server aborts a manual failover
// that is not done within 5 s (CLUSTER_MF_TIMEOUT).
const clusterManualFailoverWait = 6 * time.Second

// ClusterConfig tunes the Redis Cluster StartCluster launches. The zero
// value is three masters without replicas.
type ClusterConfig struct {
	// Masters is the number of masters; the slots are split evenly among
	// them. default: 3
	Masters int
	// Replicas is the number of replicas of each master. default: 0
	Replicas int
	// Args are extra redis-server arguments of every node.
	Args []string
}

// Cluster is a Redis Cluster started by StartCluster: every node a
// redis-server in cluster mode on a free loopback port, with its own
// directory. Its methods are safe for concurrent use.
type Cluster struct {
	nodes []*Server // masters first, then the replicas of each in turn
	admin map[string]*redis.Client
}

// StartCluster starts a Redis Cluster of cfg.Masters masters, each with
// cfg.Replicas replicas, and waits until every node reports
// cluster_state:ok and every replica's link to its master is up. It stops
// every node at the end of the test. It skips the test when REDIS_ADDR
// names an external server (a cluster of several nodes cannot be built
// from it) and, like Start, when redis-server is missing (failing on CI).
func StartCluster(t testing.TB, cfg ClusterConfig) *Cluster {
	t.Helper()
	if cfg.Masters <= 0 {
		cfg.Masters = 3
	}
	total := cfg.Masters * (1 + cfg.Replicas)
	c := &Cluster{admin: make(map[string]*redis.Client)}
	args := append([]string{"--cluster-enabled", "yes"}, cfg.Args...)
	for range total {
		s := StartConfig(t, Config{Args: args})
		if s.External() {
			t.Skip("testredis: REDIS_ADDR is set: cannot build a Redis Cluster of several nodes from it")
		}
		c.nodes = append(c.nodes, s)
		a := redis.NewClient(&redis.Options{Addr: s.Addr()})
		t.Cleanup(func() { _ = a.Close() })
		c.admin[s.Addr()] = a
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterBound)
	defer cancel()
	if err := c.build(ctx, cfg); err != nil {
		t.Fatalf("testredis: start a cluster of %d masters and %d replicas each: %v", cfg.Masters, cfg.Replicas, err)
	}
	return c
}

// build assigns the slots, introduces the nodes to each other, makes the
// replicas replicate, and waits until the cluster is ready.
func (c *Cluster) build(ctx context.Context, cfg ClusterConfig) error {
	ids := make([]string, cfg.Masters)
	for i, s := range c.nodes {
		a := c.admin[s.Addr()]
		if i < cfg.Masters {
			lo, hi := i*16384/cfg.Masters, (i+1)*16384/cfg.Masters-1
			if err := a.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
				return fmt.Errorf("CLUSTER ADDSLOTSRANGE on %s: %w", s.Addr(), err)
			}
			id, err := a.Do(ctx, "CLUSTER", "MYID").Text()
			if err != nil {
				return fmt.Errorf("CLUSTER MYID on %s: %w", s.Addr(), err)
			}
			ids[i] = id
		}
		// Each node meets every node before it, so that none has to
		// learn of the others through gossip (a ping a second: seconds).
		for _, o := range c.nodes[:i] {
			host, port, _ := net.SplitHostPort(o.Addr())
			if err := a.ClusterMeet(ctx, host, port).Err(); err != nil {
				return fmt.Errorf("CLUSTER MEET from %s to %s: %w", s.Addr(), o.Addr(), err)
			}
		}
	}
	if err := poll(ctx, "every node knows every other", func() error {
		for _, s := range c.nodes {
			if err := c.infoHas(ctx, s.Addr(), "cluster_known_nodes:"+strconv.Itoa(len(c.nodes))); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return err
	}
	for i, s := range c.nodes[cfg.Masters:] {
		master := ids[i/cfg.Replicas]
		if err := poll(ctx, "CLUSTER REPLICATE", func() error {
			// Refused until the node has learnt through gossip that
			// master is a master.
			return c.admin[s.Addr()].Do(ctx, "CLUSTER", "REPLICATE", master).Err()
		}); err != nil {
			return fmt.Errorf("%s: %w", s.Addr(), err)
		}
	}
	return poll(ctx, "the cluster ready", func() error {
		for _, s := range c.nodes {
			if err := c.infoHas(ctx, s.Addr(), "cluster_state:ok"); err != nil {
				return err
			}
		}
		for _, s := range c.nodes[cfg.Masters:] {
			if err := c.replicaUp(ctx, s.Addr()); err != nil {
				return err
			}
		}
		// Every node knows every shard's replicas as online (Failover
		// finds them there).
		for _, s := range c.nodes {
			shards, err := c.admin[s.Addr()].ClusterShards(ctx).Result()
			if err != nil {
				return fmt.Errorf("CLUSTER SHARDS on %s: %w", s.Addr(), err)
			}
			for _, sh := range shards {
				online := 0
				for _, n := range sh.Nodes {
					if n.Health == "online" {
						online++
					}
				}
				if online != 1+cfg.Replicas {
					return fmt.Errorf("CLUSTER SHARDS on %s: a shard of %d nodes online, want %d: %+v",
						s.Addr(), online, 1+cfg.Replicas, sh)
				}
			}
		}
		return nil
	})
}

// infoHas returns nil when CLUSTER INFO of addr contains want.
func (c *Cluster) infoHas(ctx context.Context, addr, want string) error {
	info, err := c.admin[addr].ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("CLUSTER INFO on %s: %w", addr, err)
	}
	if !strings.Contains(info, want) {
		return fmt.Errorf("CLUSTER INFO on %s: no %q", addr, want)
	}
	return nil
}

// replicaUp returns nil when addr is a replica whose link to its master is
// up and whose first sync is done.
func (c *Cluster) replicaUp(ctx context.Context, addr string) error {
	info, err := c.admin[addr].Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("INFO replication on %s: %w", addr, err)
	}
	if !strings.Contains(info, "role:slave") || !strings.Contains(info, "master_link_status:up") ||
		strings.Contains(info, "master_sync_in_progress:1") {
		return fmt.Errorf("%s: not a replica with its link up: %q", addr, info)
	}
	return nil
}

// Addrs returns the address of every node.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Node returns the node at addr, or nil.
func (c *Cluster) Node(addr string) *Server {
	for _, s := range c.nodes {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// NewClusterClient returns a cluster client of every node, closed at the
// end of the test. opts may be nil; its Addrs are overwritten.
func (c *Cluster) NewClusterClient(t testing.TB, opts *redis.ClusterOptions) *redis.ClusterClient {
	t.Helper()
	var o redis.ClusterOptions
	if opts != nil {
		o = *opts
	}
	o.Addrs = c.Addrs()
	cc := redis.NewClusterClient(&o)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Slot returns the hash slot of key, as the cluster computes it (CLUSTER
// KEYSLOT).
func (c *Cluster) Slot(ctx context.Context, key string) (int, error) {
	n, err := c.admin[c.nodes[0].Addr()].ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return 0, fmt.Errorf("CLUSTER KEYSLOT %q: %w", key, err)
	}
	return int(n), nil
}

// Shard returns the address of the master serving slot and of its
// replicas, as the node at from sees them (CLUSTER SHARDS).
func (c *Cluster) Shard(ctx context.Context, from string, slot int) (master string, replicas []string, err error) {
	shards, err := c.admin[from].ClusterShards(ctx).Result()
	if err != nil {
		return "", nil, fmt.Errorf("CLUSTER SHARDS on %s: %w", from, err)
	}
	for _, sh := range shards {
		if !slices.ContainsFunc(sh.Slots, func(r redis.SlotRange) bool { return int(r.Start) <= slot && slot <= int(r.End) }) {
			continue
		}
		for _, n := range sh.Nodes {
			addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			switch {
			case n.Role == "master":
				master = addr
			case n.Health == "online":
				replicas = append(replicas, addr)
			}
		}
		if master == "" {
			return "", nil, fmt.Errorf("CLUSTER SHARDS on %s: the shard of slot %d has no master: %+v", from, slot, sh)
		}
		return master, replicas, nil
	}
	return "", nil, fmt.Errorf("CLUSTER SHARDS on %s: slot %d is not served", from, slot)
}

// Failover fails the shard of slot over to its first replica with CLUSTER
// FAILOVER, sent to the replica: a manual failover, in which the master
// stops its clients until the replica has every write it acknowledged, so
// that nothing is lost. It waits until it is done: the replica reports the
// master role, the old master reports itself its replica with the link up
// and the first sync done, and every node names the new master for slot.
// It returns the old master's and the new master's addresses. It sends
// CLUSTER FAILOVER again when one is not done within 6 s (the server
// aborts a manual failover after 5 s), and gives up after 30 s or when ctx
// ends.
func (c *Cluster) Failover(ctx context.Context, slot int) (old, promoted string, err error) {
	ctx, cancel := context.WithTimeout(ctx, clusterBound)
	defer cancel()
	old, replicas, err := c.Shard(ctx, c.nodes[0].Addr(), slot)
	if err != nil {
		return "", "", fmt.Errorf("testredis: failover: %w", err)
	}
	if len(replicas) == 0 {
		return "", "", fmt.Errorf("testredis: failover of slot %d: its master %s has no replica", slot, old)
	}
	promoted = replicas[0]
	sent := 0
	for {
		if err := c.admin[promoted].Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
			return "", "", fmt.Errorf("testredis: CLUSTER FAILOVER on %s: %w", promoted, err)
		}
		sent++
		wait, cancelWait := context.WithTimeout(ctx, clusterManualFailoverWait)
		err := poll(wait, "the failover", func() error {
			role, err := c.admin[promoted].Do(wait, "ROLE").Slice()
			if err != nil || len(role) == 0 || role[0] != "master" {
				return fmt.Errorf("%s: ROLE %v, %v; want master", promoted, role, err)
			}
			if err := c.replicaUp(wait, old); err != nil {
				return err
			}
			for _, s := range c.nodes {
				m, _, err := c.Shard(wait, s.Addr(), slot)
				if err != nil {
					return err
				}
				if m != promoted {
					return fmt.Errorf("%s names %s the master of slot %d, want %s", s.Addr(), m, slot, promoted)
				}
			}
			return nil
		})
		cancelWait()
		if err == nil {
			return old, promoted, nil
		}
		if ctx.Err() != nil {
			return "", "", fmt.Errorf("testredis: failover of slot %d from %s to %s (%d CLUSTER FAILOVER sent): %w\n%s log:\n%s",
				slot, old, promoted, sent, err, promoted, c.Node(promoted).Log())
		}
	}
}

// Takeover makes the first replica of slot's shard its master with CLUSTER
// FAILOVER TAKEOVER, sent to the replica: without the master's agreement
// or the other masters' votes, as when the master is down (Kill it first)
// and too few masters remain to vote. Writes the master acknowledged but
// had not replicated are lost. It waits until the replica reports the
// master role and every node that answers names it for slot, and returns
// the old master's and the new master's addresses. It gives up after 30 s
// or when ctx ends.
func (c *Cluster) Takeover(ctx context.Context, slot int) (old, promoted string, err error) {
	ctx, cancel := context.WithTimeout(ctx, clusterBound)
	defer cancel()
	var replicas []string
	for _, s := range c.nodes { // ask a node that answers
		if old, replicas, err = c.Shard(ctx, s.Addr(), slot); err == nil {
			break
		}
	}
	if err != nil {
		return "", "", fmt.Errorf("testredis: takeover: %w", err)
	}
	if len(replicas) == 0 {
		return "", "", fmt.Errorf("testredis: takeover of slot %d: its master %s has no replica", slot, old)
	}
	promoted = replicas[0]
	if err := c.admin[promoted].Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		return "", "", fmt.Errorf("testredis: CLUSTER FAILOVER TAKEOVER on %s: %w", promoted, err)
	}
	err = poll(ctx, "the takeover", func() error {
		role, err := c.admin[promoted].Do(ctx, "ROLE").Slice()
		if err != nil || len(role) == 0 || role[0] != "master" {
			return fmt.Errorf("%s: ROLE %v, %v; want master", promoted, role, err)
		}
		for _, s := range c.nodes {
			if s.Addr() == old || c.admin[s.Addr()].Ping(ctx).Err() != nil {
				continue
			}
			m, _, err := c.Shard(ctx, s.Addr(), slot)
			if err != nil {
				return err
			}
			if m != promoted {
				return fmt.Errorf("%s names %s the master of slot %d, want %s", s.Addr(), m, slot, promoted)
			}
		}
		return nil
	})
	if err != nil {
		return "", "", fmt.Errorf("testredis: takeover of slot %d from %s by %s: %w", slot, old, promoted, err)
	}
	return old, promoted, nil
}

// Restart kills the node at addr (SIGKILL, a crash) and starts it again on
// the same port and directory, with the same arguments: without
// persistence (the default) it comes back empty, but with the nodes.conf
// it wrote, so it keeps its node ID, its role and, as a master, its slots.
// A master's replicas resynchronise from it, empty, and lose their data
// too; a master down longer than cluster-node-timeout (15 s by default)
// would be failed over to a replica instead, which this restart is too
// quick for. It waits until every node reports cluster_state:ok and names
// addr the master of the slots it served, for at most 30 s: a restarted
// master answers CLUSTERDOWN for its first 2 s (CLUSTER_WRITABLE_DELAY).
func (c *Cluster) Restart(t testing.TB, addr string) {
	t.Helper()
	s := c.Node(addr)
	if s == nil {
		t.Fatalf("testredis: restart: no node at %s", addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterBound)
	defer cancel()
	var slots []int // the first slot of each range addr serves
	shards, err := c.admin[addr].ClusterShards(ctx).Result()
	if err != nil {
		t.Fatalf("testredis: restart: CLUSTER SHARDS on %s: %v", addr, err)
	}
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.Role == "master" && net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10)) == addr {
				for _, r := range sh.Slots {
					slots = append(slots, int(r.Start))
				}
			}
		}
	}
	s.Kill(t)
	s.Start(t)
	err = poll(ctx, "the restarted node back", func() error {
		for _, n := range c.nodes {
			if err := c.infoHas(ctx, n.Addr(), "cluster_state:ok"); err != nil {
				return err
			}
			for _, slot := range slots {
				m, _, err := c.Shard(ctx, n.Addr(), slot)
				if err != nil {
					return err
				}
				if m != addr {
					return fmt.Errorf("%s names %s the master of slot %d, want %s", n.Addr(), m, slot, addr)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("testredis: restart of %s: %v\nits log:\n%s", addr, err, s.Log())
	}
}

// ReplicaUp waits until the node at addr is a replica whose link to its
// master is up and whose first sync is done (a restarted old master that
// rejoined the cluster), for at most 30 s or until ctx ends.
func (c *Cluster) ReplicaUp(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, clusterBound)
	defer cancel()
	if err := poll(ctx, "a replica with its link up", func() error { return c.replicaUp(ctx, addr) }); err != nil {
		return fmt.Errorf("testredis: %w", err)
	}
	return nil
}

// MigrateSlot moves slot, with its keys, from the master that serves it to
// the master at to, as redis-cli --cluster reshard does: CLUSTER SETSLOT
// IMPORTING on the target and MIGRATING on the source, MIGRATE of its keys
// (with their TTLs) a hundred at a time, then CLUSTER SETSLOT NODE on the
// target, the source and every other master. Meanwhile a command on a key
// of the slot may get ASK or TRYAGAIN (some of its keys moved, not all),
// which clients follow or retry. It waits until every node names the
// target for slot, and returns the source's address. It gives up after
// 30 s or when ctx ends.
func (c *Cluster) MigrateSlot(ctx context.Context, slot int, to string) (from string, err error) {
	ctx, cancel := context.WithTimeout(ctx, clusterBound)
	defer cancel()
	from, err = c.MigrateKeys(ctx, slot, to)
	if err != nil {
		return "", err
	}
	if err := c.FinishMigration(ctx, slot, from, to); err != nil {
		return "", err
	}
	return from, nil
}

// MigrateKeys is the first half of MigrateSlot: it marks slot IMPORTING on
// to and MIGRATING on the master that serves it, and moves the slot's keys,
// but leaves the slot assigned to the source, so that a command on a key of
// the slot gets ASK from the source (the key has moved) until
// FinishMigration. It returns the source's address.
func (c *Cluster) MigrateKeys(ctx context.Context, slot int, to string) (from string, err error) {
	ctx, cancel := context.WithTimeout(ctx, clusterBound)
	defer cancel()
	from, _, err = c.Shard(ctx, to, slot)
	if err != nil {
		return "", fmt.Errorf("testredis: migrate slot %d: %w", slot, err)
	}
	if from == to {
		return "", fmt.Errorf("testredis: migrate slot %d: %s serves it already", slot, to)
	}
	ids := make(map[string]string)
	for _, addr := range []string{from, to} {
		id, err := c.admin[addr].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return "", fmt.Errorf("testredis: CLUSTER MYID on %s: %w", addr, err)
		}
		ids[addr] = id
	}
	src, dst := c.admin[from], c.admin[to]
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err(); err != nil {
		return "", fmt.Errorf("testredis: CLUSTER SETSLOT IMPORTING on %s: %w", to, err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to]).Err(); err != nil {
		return "", fmt.Errorf("testredis: CLUSTER SETSLOT MIGRATING on %s: %w", from, err)
	}
	host, port, _ := net.SplitHostPort(to)
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			return "", fmt.Errorf("testredis: CLUSTER GETKEYSINSLOT on %s: %w", from, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return "", fmt.Errorf("testredis: MIGRATE from %s to %s: %w", from, to, err)
		}
	}
	return from, nil
}

// FinishMigration is the second half of MigrateSlot: CLUSTER SETSLOT NODE
// on to, from and every other master, then it waits until every node names
// to for slot.
func (c *Cluster) FinishMigration(ctx context.Context, slot int, from, to string) error {
	ctx, cancel := context.WithTimeout(ctx, clusterBound)
	defer cancel()
	ids := make(map[string]string)
	for _, addr := range []string{from, to} {
		id, err := c.admin[addr].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("testredis: CLUSTER MYID on %s: %w", addr, err)
		}
		ids[addr] = id
	}
	// The target first, so that the slot is never without a node that
	// claims it.
	order := []string{to, from}
	for _, s := range c.nodes {
		a := s.Addr()
		if a == to || a == from {
			continue
		}
		if role, err := c.admin[a].Do(ctx, "ROLE").Slice(); err == nil && len(role) > 0 && role[0] == "master" {
			order = append(order, a)
		}
	}
	for _, addr := range order {
		if err := c.admin[addr].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to]).Err(); err != nil {
			return fmt.Errorf("testredis: CLUSTER SETSLOT NODE on %s: %w", addr, err)
		}
	}
	err := poll(ctx, "the migration", func() error {
		for _, s := range c.nodes {
			m, _, err := c.Shard(ctx, s.Addr(), slot)
			if err != nil {
				return err
			}
			if m != to {
				return fmt.Errorf("%s names %s the master of slot %d, want %s", s.Addr(), m, slot, to)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("testredis: migrate slot %d from %s to %s: %w", slot, from, to, err)
	}
	return nil
}

// poll calls cond until it returns nil, and returns its last error, with
// what, once ctx ends.
func poll(ctx context.Context, what string, cond func() error) error {
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %w)", what, ctx.Err(), err)
		case <-time.After(20 * time.Millisecond): // polling the servers' state
		}
	}
}
