package redisbackend_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// The expiry of a modes hash (and of a waiters hash) is the latest expiry
// of its entries (modes_scripts.go): every script that writes one keeps it
// there, so a short-lived entry written next to a long-lived one never cuts
// the long one's life short, and the hash goes no later than its last entry.
// These tests run on a real server, whose expiry is what counts.

const (
	longTTL  = 30 * time.Second
	shortTTL = 500 * time.Millisecond
)

// wantPTTL fails unless name's PTTL is in (lo, hi].
func wantPTTL(ctx context.Context, t *testing.T, c *redis.Client, name string, lo, hi time.Duration, why string) {
	t.Helper()
	got, err := c.PTTL(ctx, name).Result()
	if err != nil {
		t.Fatalf("PTTL %s: %v", name, err)
	}
	if got <= lo || got > hi {
		t.Errorf("PTTL %s: got %v, want in (%v, %v] (%s)", name, got, lo, hi, why)
	}
}

// wantLongPTTL fails unless name's PTTL is still about longTTL.
func wantLongPTTL(ctx context.Context, t *testing.T, c *redis.Client, name, why string) {
	t.Helper()
	wantPTTL(ctx, t, c, name, longTTL-time.Second, longTTL, why)
}

func modeReq(key, id string, ttl time.Duration, mode backend.Mode, ancestors ...string) backend.ModeRequest {
	return backend.ModeRequest{
		AcquireRequest: backend.AcquireRequest{Key: key, HolderID: id, TTL: ttl},
		Mode:           mode, Ancestors: ancestors,
	}
}

func mustAcquireMode(ctx context.Context, t *testing.T, b *redisbackend.Backend, req backend.ModeRequest) backend.Lease {
	t.Helper()
	l, err := b.AcquireMode(ctx, req)
	if err != nil {
		t.Fatalf("AcquireMode %s by %s: %v", req.Key, req.HolderID, err)
	}
	return l
}

// wantOnlyHolder fails unless l is key's one live holder and still renews.
func wantOnlyHolder(ctx context.Context, t *testing.T, b *redisbackend.Backend, key string, l backend.Lease) {
	t.Helper()
	recs, err := b.Holders(ctx, key)
	if err != nil {
		t.Fatalf("Holders %s: %v", key, err)
	}
	if len(recs) != 1 || recs[0].Token != l.Token {
		t.Errorf("Holders %s: got %+v, want the long holder %s alone", key, recs, l.Token)
	}
	if err := b.Renew(ctx, l); err != nil {
		t.Errorf("Renew of the long holder of %s: got %v, want nil", key, err)
	}
}

// TestModesExpiryIntentBelow: a Shared holder with a long TTL on a parent
// keeps its key when a lock with a short TTL is taken (and renewed) below
// it: the intent the child writes into the parent's hash, and its renewal,
// move the hash's expiry only later, so the holder is still there, held and
// renewable, once the child is gone.
func TestModesExpiryIntentBelow(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "xi:"})
	const (
		parent = "xi:{lock/p}{}"
		child  = "xi:{lock/p}{/c}"
	)
	long := mustAcquireMode(ctx, t, b, modeReq("lock/p", "long", longTTL, backend.Shared))
	short := mustAcquireMode(ctx, t, b, modeReq("lock/p/c", "short", shortTTL, backend.Shared, "lock/p"))
	wantLongPTTL(ctx, t, c, parent, "the long holder's, after an intent with a short TTL")
	if err := b.Renew(ctx, short); err != nil {
		t.Fatalf("Renew of the child: %v", err)
	}
	wantLongPTTL(ctx, t, c, parent, "the long holder's, after the renewal of an intent with a short TTL")
	eventually(t, "the child's hash expires", func() bool { return c.Exists(ctx, child).Val() == 0 })
	wantOnlyHolder(ctx, t, b, "lock/p", long)
}

// TestModesExpiryHolderBeside: the same for a Shared holder with a short
// TTL taken (and renewed) on the long holder's own key.
func TestModesExpiryHolderBeside(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "xh:"})
	const name = "xh:{lock/k}{}"
	long := mustAcquireMode(ctx, t, b, modeReq("lock/k", "long", longTTL, backend.Shared))
	short := mustAcquireMode(ctx, t, b, modeReq("lock/k", "short", shortTTL, backend.Shared))
	wantLongPTTL(ctx, t, c, name, "the long holder's, after a holder with a short TTL")
	if err := b.Renew(ctx, short); err != nil {
		t.Fatalf("Renew of the short holder: %v", err)
	}
	wantLongPTTL(ctx, t, c, name, "the long holder's, after the renewal of a holder with a short TTL")
	eventually(t, "the short holder expires", func() bool {
		recs, err := b.Holders(ctx, "lock/k")
		return err == nil && len(recs) < 2
	})
	wantOnlyHolder(ctx, t, b, "lock/k", long)
}

// TestModesExpiryRelease: releasing an entry sets the hash's expiry to the
// latest of the entries left: not another one's (the longest is put first
// in the hash's order, so that the last one read is not the answer by
// chance), and no longer than that (the released entry's expiry no longer
// counts).
func TestModesExpiryRelease(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "xr:"})
	const name = "xr:{lock/k}{}"
	x := mustAcquireMode(ctx, t, b, modeReq("lock/k", "x", 20*time.Second, backend.Shared))
	y := mustAcquireMode(ctx, t, b, modeReq("lock/k", "y", 20*time.Second, backend.Shared))
	gone := mustAcquireMode(ctx, t, b, modeReq("lock/k", "gone", 20*time.Second, backend.Shared))
	fields, err := c.HKeys(ctx, name).Result()
	if err != nil {
		t.Fatalf("HKEYS: %v", err)
	}
	first, second := x, y
	if slices.Index(fields, "h:"+y.Token) < slices.Index(fields, "h:"+x.Token) {
		first, second = y, x
	}
	// A renewal sets an entry's expiry to now + the lease's TTL.
	first.TTL, second.TTL = longTTL, 10*time.Second
	for _, l := range []backend.Lease{first, second} {
		if err := b.Renew(ctx, l); err != nil {
			t.Fatalf("Renew: %v", err)
		}
	}
	if err := b.Release(ctx, gone); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantLongPTTL(ctx, t, c, name, "the latest of the entries left")
	if err := b.Release(ctx, first); err != nil {
		t.Fatalf("Release: %v", err)
	}
	wantPTTL(ctx, t, c, name, 9*time.Second, 10*time.Second, "the one entry left's, once the longest is released")
}

// TestModesExpiryWaiters: the waiters hash expires with its latest waiter:
// a waiter with a short TTL registered after one with a long TTL does not
// shorten it, nor does withdrawing another waiter; withdrawing the longest
// shortens it to the latest left.
func TestModesExpiryWaiters(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "xw:"})
	const name = "xw:{lock/k}{}:waiters"
	mustAcquireMode(ctx, t, b, modeReq("lock/k", "holder", longTTL, backend.Exclusive))
	wait := func(id string, ttl time.Duration) {
		t.Helper()
		req := modeReq("lock/k", id, ttl, backend.Exclusive)
		req.WaitID = "wait-" + id
		if _, err := b.AcquireMode(ctx, req); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("AcquireMode by %s: got %v, want ErrHeld", id, err)
		}
	}
	wait("long", longTTL)
	wait("short", shortTTL)
	wantLongPTTL(ctx, t, c, name, "the long waiter's, after a waiter with a short TTL")
	wait("mid", 10*time.Second)
	wait("other", 20*time.Second)
	wantLongPTTL(ctx, t, c, name, "the long waiter's, after a third and fourth waiter")
	if err := b.CancelWait(ctx, "lock/k", "wait-other"); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	wantLongPTTL(ctx, t, c, name, "the long waiter's, after another waiter withdrew")
	if err := b.CancelWait(ctx, "lock/k", "wait-long"); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	wantPTTL(ctx, t, c, name, 9*time.Second, 10*time.Second, "the latest waiter left's, once the longest withdrew")
}
