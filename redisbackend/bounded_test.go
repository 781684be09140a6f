package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestTermCounterExpires: the term counter lives for TermRetention after
// each Acquire, whatever the lease's TTL, and the term after it expired is
// still greater than every earlier one (it comes from the server's clock).
func TestTermCounterExpires(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	const retention = 10 * time.Second
	b := newBackend(t, c, &redisbackend.Options{TermRetention: retention})
	ctx := ctxBound(t)
	var prev uint64
	for _, ttl := range []time.Duration{time.Second, 30 * time.Second} {
		t.Run(fmt.Sprintf("lease TTL %v", ttl), func(t *testing.T) {
			l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: ttl})
			if err != nil {
				t.Fatal(err)
			}
			if l.Term <= prev {
				t.Fatalf("term: got %d, want > %d (the earlier term, its counter expired)", l.Term, prev)
			}
			prev = l.Term
			if got := mr.TTL("sovereign:{k}:term"); got != retention {
				t.Errorf("TTL of the counter: got %v, want %v (TermRetention)", got, retention)
			}
			if err := b.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
			mr.FastForward(retention - time.Millisecond)
			if !mr.Exists("sovereign:{k}:term") {
				t.Fatalf("counter gone %v after Acquire, want it kept for %v", retention-time.Millisecond, retention)
			}
			mr.FastForward(time.Millisecond)
			if keys := mr.Keys(); len(keys) != 0 {
				t.Fatalf("keys %v after the counter's lifetime: want none", keys)
			}
		})
	}
}

// boundedKeys is the number of distinct keys TestKeyspaceBounded uses;
// SOVEREIGN_BOUNDED_KEYS overrides it (100000 for the measurement in the
// package's history).
func boundedKeys(t *testing.T) int {
	if v := os.Getenv("SOVEREIGN_BOUNDED_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("SOVEREIGN_BOUNDED_KEYS=%q: want a positive integer", v)
		}
		return n
	}
	return 10_000
}

// TestKeyspaceBounded: on a real server, many distinct keys are acquired,
// heartbeated and released; once the heartbeats and term counters have
// expired, DBSIZE is back to what it was before. One key in four is a
// page of a lock tree held through backend.Modes instead: two Shared
// holders with a limit and their intents on the tree's root, a writer
// registered as waiting, a fair reader queued behind it; one holder is
// released, the other and both waiters are left to expire on their own.
func TestKeyspaceBounded(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{Args: []string{"--hz", "100"}})
	c := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true, PoolSize: 32})
	admin := srv.NewClient(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Something of the user's, which must stay.
	if err := admin.Set(ctx, "user:data", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	baseline := admin.DBSize(ctx).Val()
	// The lease's TTL leaves room for a slow release under load; the
	// heartbeats and term counters expire after retention.
	const ttl, retention = 2 * time.Second, 200 * time.Millisecond
	b := newBackend(t, c, &redisbackend.Options{TermRetention: retention})
	n := boundedKeys(t)

	const workers = 32
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				key := fmt.Sprintf("lock/job-%d", i)
				if i%4 == 0 {
					if err := modesRound(ctx, b, fmt.Sprintf("lock/tree-%d", i), ttl); err != nil {
						errs <- fmt.Errorf("tree %d: %w", i, err)
						return
					}
					continue
				}
				l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "h", TTL: ttl})
				if err == nil {
					err = b.Heartbeat(ctx, key, "h", retention)
				}
				if err == nil {
					err = b.Release(ctx, l)
				}
				if err != nil {
					errs <- fmt.Errorf("key %s: %w", key, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	took := time.Since(start)
	peak := admin.DBSize(ctx).Val()
	deadline := time.Now().Add(2 * time.Minute) // generous: active expiry under load
	var size int64
	for {
		size = admin.DBSize(ctx).Val()
		if size == baseline {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("DBSIZE: got %d, want %d (the size before) 2m after %d keys were released", size, baseline, n)
		}
		time.Sleep(50 * time.Millisecond) // polling the server's active expiry
	}
	t.Logf("%d keys acquired, heartbeated and released in %v (%.0f keys/s); DBSIZE %d before, %d after the last release, %d %v later",
		n, took.Round(time.Millisecond), float64(n)/took.Seconds(), baseline, peak, size, time.Since(start.Add(took)).Round(time.Millisecond))
	if got := admin.Get(ctx, "user:data").Val(); got != "x" {
		t.Fatalf("user data: got %q, want it untouched", got)
	}
}

// modesRound leaves entries, intents and waiters of backend.Modes on the
// page root+"/page", all of which end by themselves within ttl: a Shared
// holder released, another left to expire, an Exclusive writer and a fair
// reader registered as waiters and never withdrawn. (Should a machine under
// load let the readers expire before the writer comes, the writer and the
// reader get in instead and their entries expire the same way.)
func modesRound(ctx context.Context, b *redisbackend.Backend, root string, ttl time.Duration) error {
	page := root + "/page"
	req := func(id string, m backend.Mode) backend.ModeRequest {
		r := backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: page, HolderID: id, TTL: ttl},
			Mode: m, Ancestors: []string{root}}
		if m == backend.Shared {
			r.Limit = 2
		}
		return r
	}
	r1, err := b.AcquireMode(ctx, req("r1", backend.Shared))
	if err != nil {
		return err
	}
	if _, err := b.AcquireMode(ctx, req("r2", backend.Shared)); err != nil {
		return err
	}
	w := req("w", backend.Exclusive)
	w.WaitID = "wait-w"
	if _, err := b.AcquireMode(ctx, w); err != nil && !errors.Is(err, backend.ErrHeld) {
		return fmt.Errorf("writer: %w", err)
	}
	f := req("f", backend.Shared)
	f.Fair, f.WaitID = true, "wait-f"
	if _, err := b.AcquireMode(ctx, f); err != nil && !errors.Is(err, backend.ErrHeld) {
		return fmt.Errorf("fair reader: %w", err)
	}
	if err := b.Release(ctx, r1); err != nil && !errors.Is(err, backend.ErrLeaseLost) {
		return err
	}
	return nil
}
