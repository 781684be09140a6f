package testredis_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/internal/testredis"
)

// roleOf returns the first element of ROLE on the node at addr.
func roleOf(ctx context.Context, t *testing.T, s *testredis.Sentinel, addr string) string {
	t.Helper()
	n := s.Node(addr)
	if n == nil {
		t.Fatalf("no node at %s", addr)
	}
	v, err := n.NewClient(t, nil).Do(ctx, "ROLE").Slice()
	if err != nil || len(v) == 0 {
		t.Fatalf("ROLE on %s: got %v, %v", addr, v, err)
	}
	return v[0].(string)
}

// TestSentinelFailover: the Sentinel names the first node, a failover
// client writes through it, Failover promotes the replica and makes the
// old primary its replica, the client follows with the data, and a second
// Failover goes back; Stop ends every process.
func TestSentinelFailover(t *testing.T) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{MasterName: "m1"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodes := s.Nodes()
	if len(nodes) != 2 {
		t.Fatalf("nodes: got %d, want 2 (a primary and one replica)", len(nodes))
	}
	if p, err := s.Primary(ctx); err != nil || p != nodes[0].Addr() {
		t.Fatalf("Primary: got %q, %v; want %q", p, err, nodes[0].Addr())
	}
	if s.MasterName() != "m1" {
		t.Errorf("MasterName: got %q, want m1", s.MasterName())
	}
	c := s.NewFailoverClient(t, nil)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the Sentinel: %v", err)
	}
	// WaitSynced: the replica has the write before the failover.
	if err := s.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := nodes[1].NewClient(t, nil).Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Fatalf("GET k on the replica after WaitSynced: got %q, %v; want v", got, err)
	}

	for i, want := range []string{nodes[1].Addr(), nodes[0].Addr()} {
		start := time.Now()
		got, err := s.Failover(ctx)
		if err != nil {
			t.Fatalf("Failover %d: %v", i+1, err)
		}
		t.Logf("failover %d: %v", i+1, time.Since(start))
		if got != want {
			t.Fatalf("Failover %d: new primary %s, want %s", i+1, got, want)
		}
		if p, err := s.Primary(ctx); err != nil || p != want {
			t.Errorf("Primary after failover %d: got %q, %v; want %q", i+1, p, err, want)
		}
		old := nodes[i%2].Addr()
		if r := roleOf(ctx, t, s, want); r != "master" {
			t.Errorf("ROLE of the new primary %s: got %s, want master", want, r)
		}
		if r := roleOf(ctx, t, s, old); r != "slave" {
			t.Errorf("ROLE of the old primary %s: got %s, want slave", old, r)
		}
		// The client follows: the write is there, and new writes go to the
		// new primary (a write reaching the old one would fail: READONLY).
		key := []string{"after1", "after2"}[i]
		var werr error
		for range 50 { // the switch may fail a call or two (connections killed)
			if werr = c.Set(ctx, key, "v", 0).Err(); werr == nil {
				break
			}
			time.Sleep(50 * time.Millisecond) // retrying a call that raced the switch
		}
		if werr != nil {
			t.Fatalf("SET after failover %d: %v", i+1, werr)
		}
		if got, err := s.Node(want).NewClient(t, nil).Get(ctx, key).Result(); err != nil || got != "v" {
			t.Errorf("GET %s on the new primary: got %q, %v; want v", key, got, err)
		}
		if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
			t.Errorf("GET k after failover %d: got %q, %v; want v", i+1, got, err)
		}
	}

	s.Stop()
	for _, n := range append(nodes, s.SentinelServer()) {
		if pid := n.PID(); pid != 0 {
			t.Errorf("process of %s after Stop: pid %d, want none", n.Addr(), pid)
		}
	}
}

// TestSentinelHoldReplication: after HoldReplication a write the primary
// acknowledged never reaches the replica, so a Failover loses it, while a
// write from before the hold survives.
func TestSentinelHoldReplication(t *testing.T) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{HoldableReplication: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := s.NewFailoverClient(t, nil)
	if err := c.Set(ctx, "before", "v", 0).Err(); err != nil {
		t.Fatalf("SET before: %v", err)
	}
	if n, err := c.Wait(ctx, 1, 10*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 before the hold: got %d, %v; want 1 replica", n, err)
	}
	s.HoldReplication(t)
	if err := c.Set(ctx, "after", "v", 0).Err(); err != nil {
		t.Fatalf("SET after the hold: %v", err)
	}
	if n, err := c.Wait(ctx, 1, 200*time.Millisecond).Result(); err != nil || n != 0 {
		t.Fatalf("WAIT 1 after the hold: got %d, %v; want 0 replicas", n, err)
	}
	if _, err := s.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	var got string
	var err error
	for range 50 { // the switch may fail a call or two (connections killed)
		if got, err = c.Get(ctx, "before").Result(); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond) // retrying a call that raced the switch
	}
	if err != nil || got != "v" {
		t.Errorf("GET before after the failover: got %q, %v; want v", got, err)
	}
	if got, err := c.Get(ctx, "after").Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("GET after after the failover: got %q, %v; want redis.Nil (the write was never replicated)", got, err)
	}
}
