package redisbackend

import (
	"context"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// Acquisitions whose reply was lost.
//
// An acquisition whose call fails without a reply (it timed out, its
// context ended, its connection broke) may still run on the server: a
// server that stalls (SIGSTOP, a frozen VM, a saturated network) runs the
// scripts its connections sent once it resumes, although their callers
// have given up. Such a script can take a free key for a holder ID under a
// token that no caller has, and the key then stays held by nobody until
// its TTL ends: an elector's own next attempt, or any other candidate's,
// is told that the key is held (by that holder ID), and an election has no
// leader for one more TTL after the store came back.
//
// So the Backend remembers the tokens of its acquisitions that failed
// without a reply, by key, for lostKeep. When an acquisition of that key
// for that holder ID finds it held under one of them, it deletes that
// lease (owner-checked by holder and token, with the release event that
// wakes watchers) and tries once more, in the same call. It is safe: no
// caller ever got that lease, so no one can act under it; the new
// acquisition takes a greater term. A deletion sent on another connection
// is not ordered after the lost script, which may run later still: then
// the retry finds the key held again, and the next attempt deletes that.
// Other Backends, which do not know the token, see the key held until its
// TTL ends, as before.
type lostTokens struct {
	mu    sync.Mutex
	byKey map[string][]lostToken
	n     int
	swept time.Time // the last sweep of every key's expired tokens
}

type lostToken struct {
	holder, token string
	until         time.Time
}

const (
	// lostKeep is how long a token of an acquisition without a reply is
	// remembered: its script may run as late as the server resumes, and
	// remembering costs nothing on the way to success (the token is only
	// looked up in a HELD reply naming the caller's own holder ID).
	lostKeep = 10 * time.Minute
	// lostMax bounds the tokens remembered by a Backend: when it is
	// reached, the expired tokens of every key are dropped, and new ones
	// are not remembered while it still is.
	lostMax = 1 << 16
	// lostPerKey bounds the tokens remembered for one key.
	lostPerKey = 64
)

// remember records the token of an acquisition of key for holder whose
// reply was lost.
func (t *lostTokens) remember(key, holder, token string, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey == nil {
		t.byKey = make(map[string][]lostToken)
	}
	if d := now.Sub(t.swept); d >= lostKeep || t.n >= lostMax && d >= time.Second {
		// Tokens of keys not acquired again expire here (when full, at
		// most once a second: a sweep visits every key).
		for k := range t.byKey {
			t.prune(k, now)
		}
		t.swept = now
	}
	ts := t.prune(key, now)
	if len(ts) >= lostPerKey {
		ts = append(ts[:0], ts[1:]...)
		t.n--
	}
	if t.n >= lostMax {
		return
	}
	t.byKey[key] = append(ts, lostToken{holder: holder, token: token, until: now.Add(lostKeep)})
	t.n++
}

// lost reports whether token of holder is one of key's lost acquisitions.
func (t *lostTokens) lost(key, holder, token string, now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, lt := range t.prune(key, now) {
		if lt.holder == holder && lt.token == token {
			return true
		}
	}
	return false
}

// forget drops token from key's lost acquisitions: its lease was deleted,
// and a script runs once.
func (t *lostTokens) forget(key, token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.byKey[key]
	for i, lt := range ts {
		if lt.token == token {
			ts = append(ts[:i], ts[i+1:]...)
			t.n--
			break
		}
	}
	if len(ts) == 0 {
		delete(t.byKey, key)
	} else {
		t.byKey[key] = ts
	}
}

// prune drops key's expired tokens and returns the rest. It runs with
// t.mu held.
func (t *lostTokens) prune(key string, now time.Time) []lostToken {
	ts := t.byKey[key]
	i := 0
	for i < len(ts) && !now.Before(ts[i].until) {
		i++
	}
	if i > 0 {
		ts = append(ts[:0], ts[i:]...)
		t.n -= i
		if len(ts) == 0 {
			delete(t.byKey, key)
		} else {
			t.byKey[key] = ts
		}
	}
	return ts
}

// reclaimLost deletes the lease of key that holder's lost acquisition
// took under rec's token, if rec is that lease, and reports whether it
// did.
func (b *Backend) reclaimLost(ctx context.Context, key, holder string, rec backend.Record) bool {
	if rec.HolderID != holder || !b.lostAcq.lost(key, holder, rec.Token, time.Now()) {
		return false
	}
	v, _, err := b.runAny(ctx, releaseScript, false, []string{b.keyBase(key)}, []any{holder, rec.Token, b.publishArg})
	if err != nil || v != int64(1) {
		return false
	}
	b.lostAcq.forget(key, rec.Token)
	return true
}
