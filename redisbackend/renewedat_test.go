package redisbackend_test

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// serverTime returns the server's clock (TIME).
func serverTime(t *testing.T, ctx context.Context, c *redis.Client) time.Time {
	t.Helper()
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatalf("TIME: %v", err)
	}
	return now
}

// waitServerPast waits until the server's clock is past at, so that what
// happens next happens at a later millisecond than anything before.
func waitServerPast(t *testing.T, ctx context.Context, c *redis.Client, at time.Time) {
	t.Helper()
	eventually(t, "the server's clock past "+at.Format(time.StampMilli), func() bool {
		return serverTime(t, ctx, c).After(at)
	})
}

// recordsOf returns the records of key that every way of reading one
// gives: Get, List, and the HeldError of another holder's Acquire.
func recordsOf(t *testing.T, ctx context.Context, b backend.Backend, key string) map[string]backend.Record {
	t.Helper()
	out := map[string]backend.Record{}
	rec, err := b.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	out["Get"] = rec
	recs, err := b.List(ctx, key)
	if err != nil || len(recs) != 1 {
		t.Fatalf("List(%q): got %d records, %v; want 1", key, len(recs), err)
	}
	out["List"] = recs[0]
	_, err = b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "other", TTL: time.Minute})
	var held *backend.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Acquire of a held key: got %v, want *HeldError", err)
	}
	out["HeldError"] = held.Holder
	return out
}

// checkRenewedAt checks that every record of key says it was last renewed
// within [from, to] (the server's clock around the renewal; a millisecond
// either way for the truncation to milliseconds).
func checkRenewedAt(t *testing.T, ctx context.Context, b backend.Backend, key string, from, to time.Time) {
	t.Helper()
	// The derived time is whole milliseconds of the server's cached command
	// time, which may trail its TIME by up to a millisecond: the bounds are
	// the millisecond before from's and the one after to.
	from, to = from.Truncate(time.Millisecond).Add(-time.Millisecond), to.Add(time.Millisecond)
	for how, rec := range recordsOf(t, ctx, b, key) {
		if rec.RenewedAt.Before(from) || rec.RenewedAt.After(to) {
			t.Errorf("%s: RenewedAt %s, want within [%s, %s], the server's clock around the last renewal",
				how, rec.RenewedAt.Format(time.StampMilli), from.Format(time.StampMilli), to.Format(time.StampMilli))
		}
		if rec.RenewedAt.Before(rec.AcquiredAt) {
			t.Errorf("%s: RenewedAt %v before AcquiredAt %v", how, rec.RenewedAt, rec.AcquiredAt)
		}
	}
}

// TestRenewedAtDerived checks RenewedAt, which renewals no longer write,
// against the server's clock around the acquisition and each renewal (by
// Renew and by RenewBatch, with the TTL unchanged and changed), read long
// enough after each that a value taken from the time of reading, or one
// left at the acquisition, would be out of range.
func TestRenewedAtDerived(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, nil)
	const key = "renewed"

	from := serverTime(t, ctx, c)
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	to := serverTime(t, ctx, c)
	waitServerPast(t, ctx, c, to.Add(20*time.Millisecond))
	checkRenewedAt(t, ctx, b, key, from, to)

	renewals := []struct {
		name  string
		ttl   time.Duration
		renew func(backend.Lease) error
	}{
		{"Renew", 30 * time.Second, func(l backend.Lease) error { return b.Renew(ctx, l) }},
		{"Renew with a longer TTL", 45 * time.Second, func(l backend.Lease) error { return b.Renew(ctx, l) }},
		{"Renew with that TTL again", 45 * time.Second, func(l backend.Lease) error { return b.Renew(ctx, l) }},
		{"RenewBatch", 45 * time.Second, func(l backend.Lease) error { return b.RenewBatch(ctx, []backend.Lease{l})[0] }},
		{"RenewBatch with a shorter TTL", 20 * time.Second, func(l backend.Lease) error { return b.RenewBatch(ctx, []backend.Lease{l})[0] }},
	}
	for _, r := range renewals {
		t.Run(r.name, func(t *testing.T) {
			waitServerPast(t, ctx, c, serverTime(t, ctx, c).Add(20*time.Millisecond))
			l.TTL = r.ttl
			from := serverTime(t, ctx, c)
			if err := r.renew(l); err != nil {
				t.Fatal(err)
			}
			to := serverTime(t, ctx, c)
			waitServerPast(t, ctx, c, to.Add(20*time.Millisecond))
			checkRenewedAt(t, ctx, b, key, from, to)
			rec, err := b.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if rec.TTL > r.ttl || rec.TTL < r.ttl-10*time.Second {
				t.Errorf("TTL after the renewal: got %v, want a little under %v", rec.TTL, r.ttl)
			}
		})
	}
}

// TestRenewWritesOnlyTheExpiry checks that a renewal leaves the lease
// hash's fields alone (ttl changes only when the renewal changes the TTL)
// and sends no HSET or TIME, by Renew and RenewBatch.
func TestRenewWritesOnlyTheExpiry(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, nil)
	const key = "quiet"
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: 30 * time.Second,
		Metadata: map[string]string{"addr": "10.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	const hash = "sovereign:{" + key + "}"
	calls := func(cmd string) int { return redisbackend.CommandCalls(ctx, c, cmd) }
	renewals := []struct {
		name  string
		ttl   time.Duration
		hsets int // HSET calls of the renewal
		renew func(backend.Lease) error
	}{
		{"Renew", 30 * time.Second, 0, func(l backend.Lease) error { return b.Renew(ctx, l) }},
		{"RenewBatch", 30 * time.Second, 0, func(l backend.Lease) error { return b.RenewBatch(ctx, []backend.Lease{l})[0] }},
		{"Renew with another TTL", 40 * time.Second, 1, func(l backend.Lease) error { return b.Renew(ctx, l) }},
		{"Renew with that TTL again", 40 * time.Second, 0, func(l backend.Lease) error { return b.Renew(ctx, l) }},
		{"RenewBatch with another TTL", 20 * time.Second, 1, func(l backend.Lease) error { return b.RenewBatch(ctx, []backend.Lease{l})[0] }},
		{"RenewBatch with that TTL again", 20 * time.Second, 0, func(l backend.Lease) error { return b.RenewBatch(ctx, []backend.Lease{l})[0] }},
	}
	for _, r := range renewals {
		t.Run(r.name, func(t *testing.T) {
			before := c.HGetAll(ctx, hash).Val()
			l.TTL = r.ttl
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if err := r.renew(l); err != nil {
				t.Fatal(err)
			}
			if got := calls("hset"); got != r.hsets {
				t.Errorf("HSET calls: got %d, want %d", got, r.hsets)
			}
			if got := calls("time"); got != 0 {
				t.Errorf("TIME calls: got %d, want 0", got)
			}
			if got := calls("pexpire"); got != 1 {
				t.Errorf("PEXPIRE calls: got %d, want 1", got)
			}
			after := c.HGetAll(ctx, hash).Val()
			want := maps.Clone(before)
			want["ttl"] = strconv.FormatInt(r.ttl.Milliseconds(), 10)
			if !maps.Equal(after, want) {
				t.Errorf("lease hash after the renewal: got %v, want %v (before: %v)", after, want, before)
			}
			if pttl := c.PTTL(ctx, hash).Val(); pttl > r.ttl || pttl < r.ttl-10*time.Second {
				t.Errorf("PTTL after the renewal: got %v, want a little under %v", pttl, r.ttl)
			}
		})
	}
}

// Scripts of the previous version, which wrote renewed_at at every
// acquisition and renewal, to make records of the old format as a process
// of that version would during a rolling upgrade.
var (
	// oldAcquire is its acquisition of a free key without metadata: KEYS
	// lease, term; ARGV holder, token, ttl ms.
	oldAcquire = redis.NewScript(`
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local term = string.format('%d', sec * 1000000 + usec)
local now = string.format('%d', sec * 1000 + math.floor(usec / 1000))
redis.call('SET', KEYS[2], term, 'PX', 60000)
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', ARGV[2], 'term', term,
  'acquired_at', now, 'renewed_at', now, 'ttl', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return term
`)
	// oldRenew is its renewScript.
	oldRenew = redis.NewScript(`
local f = redis.pcall('HMGET', KEYS[1], 'holder', 'token', 'term')
if f[1] ~= ARGV[1] or f[2] ~= ARGV[2] or not tonumber(f[3] or '') then return {'LOST'} end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'renewed_at',
  string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)), 'ttl', ARGV[3])
return {'OK'}
`)
)

// TestOldFormatRecord reads leases held by the previous version (a
// renewed_at field written at every renewal): their RenewedAt is the time
// of their last renewal, as it was, and the previous version's renewals
// keep it so. It also checks that the field is the one read: a record
// whose renewed_at says otherwise than its expiry reads as the field says.
func TestOldFormatRecord(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, nil)
	const key = "old"
	const hash = "sovereign:{" + key + "}"
	keys := []string{hash, hash + ":term"}

	from := serverTime(t, ctx, c)
	if err := oldAcquire.Run(ctx, c, keys, "old-holder", "old-token", 30000).Err(); err != nil {
		t.Fatal(err)
	}
	to := serverTime(t, ctx, c)
	waitServerPast(t, ctx, c, to.Add(20*time.Millisecond))
	checkRenewedAt(t, ctx, b, key, from, to)

	for _, ttl := range []int{30000, 45000} {
		waitServerPast(t, ctx, c, serverTime(t, ctx, c).Add(20*time.Millisecond))
		from := serverTime(t, ctx, c)
		if got := oldRenew.Run(ctx, c, []string{hash}, "old-holder", "old-token", ttl).Val(); !slicesEqualAny(got, "OK") {
			t.Fatalf("old renewal: got %v, want [OK]", got)
		}
		to := serverTime(t, ctx, c)
		waitServerPast(t, ctx, c, to.Add(20*time.Millisecond))
		checkRenewedAt(t, ctx, b, key, from, to)
	}

	// The field wins over the expiry in a record that has it.
	rec, err := b.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	at := rec.AcquiredAt.Add(5 * time.Millisecond)
	if err := c.HSet(ctx, hash, "renewed_at", at.UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	for how, rec := range recordsOf(t, ctx, b, key) {
		if !rec.RenewedAt.Equal(at) {
			t.Errorf("%s: RenewedAt %v, want %v (the renewed_at field)", how, rec.RenewedAt, at)
		}
	}
}

// slicesEqualAny reports whether v, a script's reply, is the array of the
// strings want.
func slicesEqualAny(v any, want ...string) bool {
	arr, ok := v.([]any)
	if !ok || len(arr) != len(want) {
		return false
	}
	for i, w := range want {
		if s, ok := arr[i].(string); !ok || s != w {
			return false
		}
	}
	return true
}
