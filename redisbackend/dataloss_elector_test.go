package redisbackend_test

import (
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestElectorRestartsWithoutPersistence is the daemon a user ran: three
// replicas, default ratios (TTL 1 s here), redis-server without persistence
// (--save "" --appendonly no), restarted four times. Every restart loses the
// leader's lease. Each must cause exactly one new leadership (no cascade), a
// leader again within TTL + 1 s of the server being up, no two leaders at
// once (before the followers waited a TTL after losing contact with the
// store, they overlapped the old leader by 8-72 ms), and strictly
// increasing terms (the Redis terms follow the server clock across the
// loss).
func TestElectorRestartsWithoutPersistence(t *testing.T) {
	srv := testredis.Start(t) // no persistence
	rec := &electortest.Recorder{}
	var es []*sovereign.Elector
	for _, id := range []string{"r1", "r2", "r3"} {
		// The client configuration the README shows.
		rdb := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
		b, err := redisbackend.New(rdb, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		e, err := sovereign.New(b, "daemon", id, &sovereign.Options{TTL: electorTTL, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		rec.Campaign(t, e)
		es = append(es, e)
	}
	// waitLeader waits for one leader with a term above after, and returns
	// how long that took and the term.
	waitLeader := func(what string, after uint64, within time.Duration) (time.Duration, uint64) {
		t.Helper()
		start := time.Now()
		for time.Since(start) < within+5*time.Second { // the assertion is below; this only bounds the wait
			if ls := electortest.Leaders(es...); len(ls) == 1 && ls[0].Term() > after {
				return time.Since(start), ls[0].Term()
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("%s: no new leader within %v", what, within+5*time.Second)
		return 0, 0
	}
	_, term := waitLeader("first election", 0, 5*time.Second)
	const restarts = 4
	var backs []time.Duration
	for range restarts {
		time.Sleep(1500 * time.Millisecond) // let the leader settle and renew
		srv.Restart(t)                      // SIGTERM, start again: every key is gone
		back, next := waitLeader("after a restart", term, electorTTL+time.Second)
		term = next
		backs = append(backs, back)
		if back > electorTTL+time.Second {
			t.Errorf("leader back %v after the server was up, want within TTL + 1 s (%v)", back, electorTTL+time.Second)
		}
	}
	time.Sleep(time.Second)
	end := time.Now()
	for _, e := range es {
		_ = e.Close()
	}
	// Terms begun before the shutdown (closing the leader hands over).
	ivs := slices.DeleteFunc(rec.Intervals(), func(iv electortest.Interval) bool { return iv.Start.After(end) })
	slices.SortFunc(ivs, func(a, b electortest.Interval) int { return a.Start.Compare(b.Start) })
	if got, want := len(ivs), 1+restarts; got != want {
		t.Errorf("leadership terms: got %d, want %d (one first term and one per restart, no cascade)", got, want)
	}
	var maxOverlap time.Duration
	for i, a := range ivs {
		if i > 0 && a.Term <= ivs[i-1].Term {
			t.Errorf("term %d of %s began after term %d: want a higher term", a.Term, a.ID, ivs[i-1].Term)
		}
		at := 0
		for _, b := range ivs {
			if !b.Start.After(a.Start) && (b.End.IsZero() || b.End.After(a.Start)) {
				at++ // b leads when a starts (a counts itself)
			}
		}
		if at > 2 {
			t.Errorf("%d leaders at once when term %d of %s began, want at most 2", at, a.Term, a.ID)
		}
		for _, b := range ivs[i+1:] {
			if a.End.IsZero() || b.Start.Before(a.End) {
				overlap := a.End.Sub(b.Start)
				t.Errorf("term %d of %s overlapped term %d of %s by %v, want no overlap: a follower that lost contact with the store takes a free key only a TTL later, and the old leader learns of its loss sooner",
					b.Term, b.ID, a.Term, a.ID, overlap)
				maxOverlap = max(maxOverlap, overlap)
			}
		}
	}
	t.Logf("leader back after each restart: %v; longest data-loss overlap: %v; terms: %v", backs, maxOverlap, ivs)
}
