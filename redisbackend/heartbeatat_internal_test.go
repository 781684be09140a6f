package redisbackend

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// TestHeartbeatAtDerived checks HeartbeatAt, which heartbeats write only
// when they create a record or change its TTL, against the server's clock
// around each heartbeat: by Heartbeat, by HeartbeatBatch, by a leader's
// renewal that refreshes its record, by a previous version's heartbeat
// (which wrote at every time), each read long enough after it that a value
// taken from the time of reading, or one left at the record's creation,
// would be out of range. Every way of reading it is checked: Members, Get,
// List and the HeldError of another holder's Acquire. Heartbeats of a
// record with its TTL unchanged write no field (no HSET, no TIME).
func TestHeartbeatAtDerived(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := newTestBackend(t, c)
	const key, id = "beating", "a"
	hk := b.keyBase(key) + ":heartbeat:" + id
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: id, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := func() time.Time {
		t.Helper()
		n, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		return n
	}
	// pass waits until the server's clock is 20 ms past its reading now.
	pass := func() {
		t.Helper()
		at := now().Add(20 * time.Millisecond)
		deadline := time.Now().Add(30 * time.Second)
		for !now().After(at) {
			if time.Now().After(deadline) {
				t.Fatalf("the server's clock did not pass %v", at)
			}
			time.Sleep(5 * time.Millisecond) // polling a real server's clock
		}
	}
	calls := func(cmd string) int { return CommandCalls(ctx, c, cmd) }
	check := func(t *testing.T, from, to time.Time) {
		t.Helper()
		pass()
		// The derived time is whole milliseconds of the server's cached command
		// time, which may trail its TIME by up to a millisecond: the bounds are
		// the millisecond before from's and the one after to.
		from, to = from.Truncate(time.Millisecond).Add(-time.Millisecond), to.Add(time.Millisecond)
		got := map[string]time.Time{}
		ms, err := b.Members(ctx, key)
		if err != nil || len(ms) != 1 {
			t.Fatalf("Members: got %v, %v; want one", ms, err)
		}
		got["Members"] = ms[0].HeartbeatAt
		rec, err := b.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got["Get"] = rec.HeartbeatAt
		recs, err := b.List(ctx, key)
		if err != nil || len(recs) != 1 {
			t.Fatalf("List: got %v, %v; want one record", recs, err)
		}
		got["List"] = recs[0].HeartbeatAt
		_, err = b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "other", TTL: time.Minute})
		var held *backend.HeldError
		if !errors.As(err, &held) {
			t.Fatalf("Acquire of a held key: got %v, want *HeldError", err)
		}
		got["HeldError"] = held.Holder.HeartbeatAt
		for how, at := range got {
			if at.Before(from) || at.After(to) {
				t.Errorf("%s: HeartbeatAt %s, want within [%s, %s], the server's clock around the last heartbeat",
					how, at.Format(time.StampMilli), from.Format(time.StampMilli), to.Format(time.StampMilli))
			}
		}
	}
	beats := []struct {
		name  string
		hsets int // HSET calls of the heartbeat
		beat  func() error
	}{
		{"Heartbeat creating the record", 1, func() error { return b.Heartbeat(ctx, key, id, 15*time.Second) }},
		{"Heartbeat", 0, func() error { return b.Heartbeat(ctx, key, id, 15*time.Second) }},
		{"Heartbeat with another TTL", 1, func() error { return b.Heartbeat(ctx, key, id, 20*time.Second) }},
		{"HeartbeatBatch", 0, func() error {
			b2 := newTestBackend(t, c) // remembers no record, so it writes
			return b2.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: key, ID: id, TTL: 20 * time.Second}})[0]
		}},
		{"a renewal refreshing the record", 0, func() error {
			written := b.beats.writtenAt(beatKey{key, id})
			if err := b.RenewBatch(ctx, []backend.Lease{l})[0]; err != nil {
				return err
			}
			if !b.beats.writtenAt(beatKey{key, id}).After(written) {
				return errors.New("the renewal did not refresh the record")
			}
			return nil
		}},
		{"a previous version's heartbeat", 1, func() error {
			return c.Eval(ctx, `redis.call('SADD', KEYS[2], ARGV[1])
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'at', string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)), 'ttl', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`, []string{hk, b.keyBase(key) + ":members"}, id, 20000).Err()
		}},
		{"Heartbeat after it", 0, func() error { return b.Heartbeat(ctx, key, id, 20*time.Second) }},
	}
	for _, bt := range beats {
		t.Run(bt.name, func(t *testing.T) {
			if strings.HasPrefix(bt.name, "a renewal") {
				// The Backend's batches ask for the record, and the pace
				// of renewals is unknown: the next renewal refreshes it.
				if err := b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: key, ID: id, TTL: 20 * time.Second}})[0]; err != nil {
					t.Fatal(err)
				}
				b.beats.forgetPace()
			}
			pass()
			before := c.HGetAll(ctx, hk).Val()
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			from := now()
			if err := bt.beat(); err != nil {
				t.Fatal(err)
			}
			to := now()
			if got := calls("hset"); got != bt.hsets {
				t.Errorf("HSET calls: got %d, want %d", got, bt.hsets)
			}
			if bt.hsets == 0 {
				if got := calls("time") - 2; got != 0 { // less the test's own two
					t.Errorf("TIME calls: got %d, want 0", got)
				}
				if after := c.HGetAll(ctx, hk).Val(); !maps.Equal(after, before) {
					t.Errorf("record after the heartbeat: got %v, want it unchanged, %v", after, before)
				}
			}
			check(t, from, to)
		})
	}
}

// forgetPace makes the pace of renewals unknown, so that the next renewal
// refreshes every record that batches keep asking for.
func (s *beats) forgetPace() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, bt := range s.m {
		bt.renewed = time.Time{}
		s.m[k] = bt
	}
}

// writtenAt returns when the record at key was last written, as far as s
// knows.
func (s *beats) writtenAt(key beatKey) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.m[key].written
}
