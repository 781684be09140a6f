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
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// startCluster starts a Redis Cluster of n primaries, each serving an
// equal range of slots (testredis.StartCluster), and returns a client of
// each node.
func startCluster(t *testing.T, n int) []*redis.Client {
	t.Helper()
	c := testredis.StartCluster(t, testredis.ClusterConfig{Masters: n})
	var nodes []*redis.Client
	for _, addr := range c.Addrs() {
		nodes = append(nodes, c.Node(addr).NewClient(t, nil))
	}
	return nodes
}

// TestModesCluster: on a Redis Cluster of three primaries, lock trees of
// many roots spread over the shards, each tree on the node of its root's
// slot: a page lock and its intents are taken in one script, an Exclusive
// lock above sees the page below, the release of the page reaches a
// watcher of the root through sharded pub/sub, and List finds every holder
// on every primary.
func TestModesCluster(t *testing.T) {
	nodes := startCluster(t, 3)
	ctx := ctxBound(t)
	var addrs []string
	for _, c := range nodes {
		addrs = append(addrs, c.Options().Addr)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	b := newBackend(t, cc, &redisbackend.Options{Prefix: "mc:"})

	used := map[string]bool{} // nodes holding a tree
	var want []string
	for i := range 12 {
		root := fmt.Sprintf("lock/tenant-%d", i)
		page := root + "/set/page"
		l, err := b.AcquireMode(ctx, backend.ModeRequest{
			AcquireRequest: backend.AcquireRequest{Key: page, HolderID: "w", TTL: time.Minute},
			Ancestors:      []string{root, root + "/set"},
		})
		if err != nil {
			t.Fatalf("AcquireMode %q: %v", page, err)
		}
		want = append(want, page)
		// Every name of the tree is in its root's slot, on the node serving it.
		names := []string{"mc:{" + root + "}{}", "mc:{" + root + "}{/set}", "mc:{" + root + "}{/set/page}"}
		slot := nodes[0].ClusterKeySlot(ctx, names[0]).Val()
		for _, name := range names[1:] {
			if got := nodes[0].ClusterKeySlot(ctx, name).Val(); got != slot {
				t.Fatalf("slot of %s: got %d, want %d (its root's)", name, got, slot)
			}
		}
		node, err := cc.MasterForKey(ctx, names[0])
		if err != nil {
			t.Fatal(err)
		}
		if n := node.Exists(ctx, names...).Val(); n != 3 {
			t.Fatalf("tree %q: %d of its lease hashes on node %s, want 3", root, n, node.Options().Addr)
		}
		on := []string{node.Options().Addr}
		used[on[0]] = true

		if i > 0 {
			continue
		}
		// The first tree: conflicts and events across the levels.
		_, err = b.AcquireMode(ctx, backend.ModeRequest{
			AcquireRequest: backend.AcquireRequest{Key: root, HolderID: "x", TTL: time.Minute}})
		var held *backend.HeldError
		if !errors.As(err, &held) || held.Holder.Key != page || held.Holder.Token != l.Token {
			t.Fatalf("Exclusive lock on the root above a page: got %v, want ErrHeld naming %q", err, page)
		}
		wctx, cancel := context.WithCancel(ctx)
		ch, err := b.Watch(wctx, root)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if got := next(t, ch); got.Type != backend.EventReleased || got.Key != root {
			t.Fatalf("watch of the root: got %+v, want EventReleased of %q", got, root)
		}
		cancel()
		x, err := b.AcquireMode(ctx, backend.ModeRequest{
			AcquireRequest: backend.AcquireRequest{Key: root, HolderID: "x", TTL: time.Minute}})
		if err != nil {
			t.Fatalf("Exclusive lock on the root once the page is released: %v", err)
		}
		if err := b.Release(ctx, x); err != nil {
			t.Fatal(err)
		}
		if _, err = b.AcquireMode(ctx, backend.ModeRequest{
			AcquireRequest: backend.AcquireRequest{Key: page, HolderID: "w", TTL: time.Minute},
			Ancestors:      []string{root, root + "/set"},
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(used) < 2 {
		t.Errorf("12 trees on %d node(s), want them spread over several", len(used))
	}
	recs, err := b.List(ctx, "lock/tenant-")
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	slices.Sort(want)
	if got := listedKeys(recs); !slices.Equal(got, want) {
		t.Fatalf("List: got %q, want %q", got, want)
	}
}

// TestConformanceCluster3 runs the conformance suite on a Redis Cluster of
// three primaries (without the restart cases: the cluster is not
// restarted), so that every script, hierarchies included, is checked
// against real slot routing and sharded pub/sub across shards.
func TestConformanceCluster3(t *testing.T) {
	nodes := startCluster(t, 3)
	var addrs []string
	for _, c := range nodes {
		addrs = append(addrs, c.Options().Addr)
	}
	var n atomic.Int64
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		ctx := context.Background()
		prefix := fmt.Sprintf("c3:%d:", n.Add(1))
		return backendtest.Env{
			Open: func() backend.Backend {
				cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = cc.Close() })
				b, err := redisbackend.New(cc, &redisbackend.Options{Prefix: prefix, TermRetention: conformanceRetention})
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return b
			},
			Size: func() int { // the keys under this Env's prefix, on every node
				total := 0
				for _, c := range nodes {
					keys, err := c.Keys(ctx, prefix+"*").Result() // test code on a test server
					if err != nil {
						t.Fatalf("KEYS: %v", err)
					}
					total += len(keys)
				}
				return total
			},
			Retention: conformanceRetention,
		}
	})
}
