package redisbackend

import (
	"fmt"
	"testing"
	"time"
)

// TestLostTokensBounded: the tokens of acquisitions whose reply was lost
// are remembered for lostKeep, at most lostPerKey a key (the oldest go
// first) and lostMax in all; the expired tokens of keys never acquired
// again are dropped too, so that the bound does not stop new tokens from
// being remembered for good.
func TestLostTokensBounded(t *testing.T) {
	var lt lostTokens
	t0 := time.Unix(1_800_000_000, 0)
	for i := range lostPerKey + 1 {
		lt.remember("k", "a", fmt.Sprint("tok", i), t0)
	}
	if lost(&lt, "k", "a", "tok0", t0) || !lost(&lt, "k", "a", fmt.Sprint("tok", lostPerKey), t0) {
		t.Errorf("per key: oldest kept or newest dropped")
	}
	if lost(&lt, "k", "b", "tok1", t0) {
		t.Errorf("a token remembered for holder a is taken for holder b's")
	}
	if lost(&lt, "k", "a", "tok1", t0.Add(lostKeep)) {
		t.Errorf("a token still remembered after lostKeep")
	}
	// Fill to the bound with keys never acquired again.
	for i := lt.n.Load(); i < lostMax; i++ {
		lt.remember(fmt.Sprint("key", i), "a", "t", t0.Add(time.Second))
	}
	if lt.n.Load() != lostMax {
		t.Fatalf("%d tokens, want %d", lt.n.Load(), lostMax)
	}
	lt.remember("new", "a", "t", t0.Add(2*time.Second))
	if lost(&lt, "new", "a", "t", t0.Add(2*time.Second)) {
		t.Errorf("a token remembered beyond lostMax")
	}
	// Once they have expired, a new token is remembered, and the old
	// ones are gone.
	later := t0.Add(time.Second + lostKeep)
	lt.remember("new", "a", "t", later)
	if !lost(&lt, "new", "a", "t", later) {
		t.Errorf("a new token not remembered after the others expired")
	}
	if lt.n.Load() != 1 || len(lt.byKey) != 1 {
		t.Errorf("after the sweep: %d tokens of %d keys, want 1 of 1", lt.n.Load(), len(lt.byKey))
	}
	lt.forget("new", "t")
	if lt.n.Load() != 0 || len(lt.byKey) != 0 {
		t.Errorf("after forget: %d tokens of %d keys, want none", lt.n.Load(), len(lt.byKey))
	}
}

// lost reports whether t remembers token of holder for key.
func lost(t *lostTokens, key, holder, token string, now time.Time) bool {
	_, ok := t.find(key, holder, token, now)
	return ok
}
