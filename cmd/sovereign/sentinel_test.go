package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestRedisSentinelURL runs status through a redis+sentinel:// URL against
// a real Sentinel: it reads the lease from the primary the Sentinel names,
// and after a real failover, from the new one.
func TestRedisSentinelURL(t *testing.T) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{MasterName: "mymaster"})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := s.NewFailoverClient(t, &redis.FailoverOptions{ContextTimeoutEnabled: true})
	// WaitReplicas: the replica has the lease before the failover.
	b, err := redisbackend.New(c, &redisbackend.Options{WaitReplicas: 1, WaitTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "job", HolderID: "x", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	env := []string{"SOVEREIGN_BACKEND=redis+sentinel://" + s.SentinelAddrs()[0] + "?master_name=" + s.MasterName()}
	status := func(when string) {
		t.Helper()
		code, out, stderr := run(t, env, "status", "job")
		if code != 0 {
			t.Fatalf("status %s: got exit %d, want 0; stderr:\n%s", when, code, stderr)
		}
		if !strings.Contains(out, "holder     x") || !strings.Contains(out, strconv.FormatUint(l.Term, 10)) {
			t.Fatalf("status %s printed:\n%s\nwant holder x and term %d", when, out, l.Term)
		}
	}
	status("before the failover")
	if _, err := s.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	status("after the failover")
}
