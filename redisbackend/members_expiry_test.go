package redisbackend_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestMembersSetExpiry: the members set of a key outlives every heartbeat
// record it lists, and not by more than it must: a heartbeat (alone or in
// a batch) extends it to its record's TTL when it has less left and never
// shortens it; RemoveMember sets it to the longest record left.
func TestMembersSetExpiry(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "mx:"})
	for _, tt := range []struct {
		name string
		beat func(t *testing.T, key, id string, ttl time.Duration)
	}{
		{"Heartbeat", func(t *testing.T, key, id string, ttl time.Duration) {
			if err := b.Heartbeat(ctx, key, id, ttl); err != nil {
				t.Fatalf("Heartbeat %s: %v", id, err)
			}
		}},
		{"HeartbeatBatch", func(t *testing.T, key, id string, ttl time.Duration) {
			if errs := b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: key, ID: id, TTL: ttl}}); errs[0] != nil {
				t.Fatalf("HeartbeatBatch %s: %v", id, errs[0])
			}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "k-" + tt.name
			set := "mx:{" + key + "}:members"
			tt.beat(t, key, "short", 10*time.Second)
			wantPTTL(ctx, t, c, set, 9*time.Second, 10*time.Second, "the first record's TTL")
			tt.beat(t, key, "long", time.Minute)
			wantPTTL(ctx, t, c, set, 59*time.Second, time.Minute, "extended to the longer record's TTL")
			tt.beat(t, key, "shorter", 5*time.Second)
			wantPTTL(ctx, t, c, set, 59*time.Second, time.Minute, "not shortened by a shorter record")
		})
	}

	// RemoveMember reads the set in an order of its own: the longest
	// record left is put first in one case and second in the other, so
	// that the last one read is not the answer by chance in both.
	for i, ttls := range [][2]time.Duration{{time.Minute, 20 * time.Second}, {20 * time.Second, time.Minute}} {
		t.Run(fmt.Sprintf("RemoveMember/%d", i), func(t *testing.T) {
			key := fmt.Sprintf("k-remove-%d", i)
			set := "mx:{" + key + "}:members"
			for _, id := range []string{"a", "b", "gone"} {
				if err := b.Heartbeat(ctx, key, id, 2*time.Minute); err != nil {
					t.Fatalf("Heartbeat %s: %v", id, err)
				}
			}
			// A heartbeat with another TTL rewrites the record and sets its
			// expiry; the set keeps its 2m.
			for j, id := range []string{"a", "b"} {
				if err := b.Heartbeat(ctx, key, id, ttls[j]); err != nil {
					t.Fatalf("Heartbeat %s: %v", id, err)
				}
			}
			if err := b.RemoveMember(ctx, key, "gone"); err != nil {
				t.Fatalf("RemoveMember: %v", err)
			}
			wantPTTL(ctx, t, c, set, 59*time.Second, time.Minute,
				"the longest record left, not the removed one's 2m nor another's")
		})
	}
}

// TestMemberAge: a member's Age and a record's HeartbeatAge are the time
// since the heartbeat, derived from the record's expiry (TTL minus PTTL).
// The test makes the record 5s old by setting its PTTL to 5s short of its
// TTL, so that no real time has to pass.
func TestMemberAge(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "ma:"})
	const age = 5 * time.Second
	inRange := func(d time.Duration) bool { return d >= age && d < age+time.Second }
	// beat writes a's heartbeat record of key, whose lease hash is base.
	beat := func(key, base string) {
		t.Helper()
		if err := b.Heartbeat(ctx, key, "a", time.Minute); err != nil {
			t.Fatalf("Heartbeat: %v", err)
		}
		if ok, err := c.PExpire(ctx, base+":heartbeat:a", time.Minute-age).Result(); err != nil || !ok {
			t.Fatalf("PEXPIRE %s:heartbeat:a: got %v, %v; want true, nil", base, ok, err)
		}
	}

	beat("plain", "ma:{plain}")
	ms, err := b.Members(ctx, "plain")
	if err != nil || len(ms) != 1 {
		t.Fatalf("Members: got %v, %v; want one member", ms, err)
	}
	if !inRange(ms[0].Age) || ms[0].TTL > time.Minute-age {
		t.Errorf("member: got Age %v, TTL %v; want Age in [%v, %v), TTL at most %v", ms[0].Age, ms[0].TTL, age, age+time.Second, time.Minute-age)
	}
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "plain", HolderID: "a", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	rec, err := b.Get(ctx, "plain")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if !inRange(rec.HeartbeatAge) {
		t.Errorf("Get: got HeartbeatAge %v, want in [%v, %v)", rec.HeartbeatAge, age, age+time.Second)
	}
	_, err = b.Acquire(ctx, backend.AcquireRequest{Key: "plain", HolderID: "other", TTL: time.Minute})
	var held *backend.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Acquire of a held key: got %v, want a *HeldError", err)
	}
	if !inRange(held.Holder.HeartbeatAge) {
		t.Errorf("HeldError.Holder: got HeartbeatAge %v, want in [%v, %v)", held.Holder.HeartbeatAge, age, age+time.Second)
	}

	beat("lock/entry", "ma:{lock/entry}{}")
	if _, err := b.AcquireMode(ctx, modeReq("lock/entry", "a", time.Minute, backend.Shared)); err != nil {
		t.Fatalf("AcquireMode: %v", err)
	}
	recs, err := b.Holders(ctx, "lock/entry")
	if err != nil || len(recs) != 1 {
		t.Fatalf("Holders: got %v, %v; want one record", recs, err)
	}
	if !inRange(recs[0].HeartbeatAge) {
		t.Errorf("Holders: got HeartbeatAge %v, want in [%v, %v)", recs[0].HeartbeatAge, age, age+time.Second)
	}
}
