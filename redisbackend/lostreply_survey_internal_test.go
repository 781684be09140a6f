package redisbackend

import (
	"fmt"
	"testing"
	"time"
)

// TestLostTokensSweep: a sweep drops the expired tokens of keys never
// acquired again at least every lostKeep, so that they do not stay until
// the bound is reached; and, once the bound is reached, as soon as they
// have expired (at most once a second), so that a table full of expired
// tokens does not stop a new one from being remembered until lostKeep
// after the last sweep. A token lasts lostKeep, no less.
func TestLostTokensSweep(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	t.Run("every lostKeep", func(t *testing.T) {
		var lt lostTokens
		lt.remember("old", "a", "t", t0)
		if !lost(&lt, "old", "a", "t", t0.Add(lostKeep-time.Nanosecond)) {
			t.Errorf("a token forgotten before lostKeep")
		}
		lt.remember("new", "a", "t", t0.Add(lostKeep))
		if lt.n.Load() != 1 || len(lt.byKey) != 1 {
			t.Errorf("lostKeep after a sweep: %d tokens of %d keys, want 1 of 1 (the expired token of a key not acquired again dropped)",
				lt.n.Load(), len(lt.byKey))
		}
	})
	t.Run("when full", func(t *testing.T) {
		var lt lostTokens
		lt.remember("first", "a", "t", t0) // the first sweep
		for i := 1; i < lostMax; i++ {
			lt.remember(fmt.Sprint("key", i), "a", "t", t0.Add(time.Minute))
		}
		swept := t0.Add(lostKeep) // "first" has expired: swept, x remembered
		lt.remember("x", "a", "t", swept)
		if lt.n.Load() != lostMax || !lost(&lt, "x", "a", "t", swept) {
			t.Fatalf("%d tokens, x remembered %v; want %d and true", lt.n.Load(), lost(&lt, "x", "a", "t", swept), lostMax)
		}
		// A minute after that sweep, every token but x has expired.
		at := swept.Add(time.Minute)
		lt.remember("new", "a", "t", at)
		if !lost(&lt, "new", "a", "t", at) {
			t.Errorf("a new token not remembered while the table was full of expired tokens")
		}
		if lt.n.Load() != 2 || len(lt.byKey) != 2 {
			t.Errorf("after the sweep: %d tokens of %d keys, want 2 of 2", lt.n.Load(), len(lt.byKey))
		}
	})
}

// TestLostTokensCount: a key at lostPerKey drops its oldest token for a
// new one, also when the table is full (the dropped token makes room); the
// count of remembered tokens (the bound's) stays the number stored; forget
// drops the token it is given, and only that one.
func TestLostTokensCount(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var lt lostTokens
	for i := range lostPerKey {
		lt.remember("k", "a", fmt.Sprint("tok", i), t0)
	}
	for i := lostPerKey; i < lostMax; i++ {
		lt.remember(fmt.Sprint("key", i), "a", "t", t0)
	}
	lt.remember("k", "a", "late", t0)
	if lost(&lt, "k", "a", "tok0", t0) || !lost(&lt, "k", "a", "late", t0) {
		t.Errorf("a key at lostPerKey in a full table: the oldest kept, or the new token dropped")
	}
	stored := 0
	for _, ts := range lt.byKey {
		stored += len(ts)
	}
	if n := lt.n.Load(); n != lostMax || stored != lostMax {
		t.Errorf("count: got %d with %d stored, want %d", n, stored, lostMax)
	}
	lt.forget("k", "tok2")
	if lost(&lt, "k", "a", "tok2", t0) || !lost(&lt, "k", "a", "tok1", t0) || !lost(&lt, "k", "a", "tok3", t0) {
		t.Errorf("forget of tok2: tok2 still there, or tok1 or tok3 gone")
	}
	if n := lt.n.Load(); n != lostMax-1 {
		t.Errorf("count after forget: got %d, want %d", n, lostMax-1)
	}
}

// LostTokens is how many tokens of acquisitions whose reply was lost b
// remembers. Exported for the external tests.
func LostTokens(b *Backend) int64 { return b.lostAcq.n.Load() }
