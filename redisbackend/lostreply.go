package redisbackend

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
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
//
// An acquisition by AcquireMode may leave, once it runs, an entry (a
// Shared or Exclusive holder, with its intents on its ancestors) under a
// token that no caller has, which takes a permit of a semaphore, blocks
// Exclusive acquirers or, by its intents, locks above it until its TTL
// ends; or, when it found the key held, a waiter registration (its wait
// ID) that no caller renews or withdraws, which keeps later Fair acquirers
// (and, when Exclusive, new Shared ones) waiting until its TTL ends. The
// Backend remembers such an acquisition's token, wait ID and ancestors.
// Its next AcquireMode of the key for that holder ID passes them to the
// script (lostTokens.forMode), which first deletes the entry still there
// under one of the tokens, owner-checked by holder ID and token, with its
// intents and the release event that wakes waiters, and withdraws the
// registrations of those wait IDs, with CancelWait's event; then it
// acquires as usual, in the same round trip. A call made while no token of
// the key is remembered sends nothing more. A wait ID's registration is
// withdrawn only when its wait is over as far as the Backend can tell: not
// the call's own wait ID, nor one whose later attempt was answered HELD,
// until a success with it or its CancelWait (so the registration of
// another wait of the holder ID on the key, going on at the same time, is
// left alone). An entry that a HELD reply names but the script could
// not reach (the intent of a lost lock below the key, a lost holder of an
// ancestor, a lost entry taken with other ancestors than the call names)
// is released by its token (releaseEntry) and the acquisition tried once
// more; so is one that a plain Acquire's reply (HELDM) names.
//
// Safety: an entry is deleted only under a token that this Backend drew
// for an acquisition whose reply it never received, so no caller ever got
// a lease with that token, and no one can act under that entry (a fencing
// term nobody holds); entries of other tokens, and of other Backends
// (which do not know the token), are never touched. A registration is
// withdrawn only by a wait ID this Backend sent in such an acquisition,
// random per wait (backend.ModeRequest), and not while that wait is known
// to go on: it is a place in line that nobody will take (and were the wait
// to go on after all, it would only lose its place: a registration grants
// nothing). The key's term counter is
// not touched, so the next acquisition's term is greater than the deleted
// entry's. A token stays remembered until its entry has been found and
// deleted, or it expires: the deletion may run before the lost script
// (scripts sent on different connections are not ordered), which may then
// still write its entry or registration, found by the next call.
type lostTokens struct {
	mu    sync.Mutex
	byKey map[string][]lostToken
	n     atomic.Int64 // tokens remembered (written with mu held; read without it on the way to success)
	swept time.Time    // the last sweep of every key's expired tokens
}

type lostToken struct {
	holder, token string
	until         time.Time
	// entry is set for an acquisition by AcquireMode, with its wait ID
	// (empty: none) and ancestors; waiting says that a later attempt with
	// that wait ID was answered HELD and the wait has not ended since (a
	// success with it or CancelWait).
	entry     bool
	waitID    string
	ancestors []string
	waiting   bool
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

// remember records the token of an acquisition (by Acquire) of key for
// holder whose reply was lost.
func (t *lostTokens) remember(key, holder, token string, now time.Time) {
	t.add(key, lostToken{holder: holder, token: token}, now)
}

// rememberEntry records the token, wait ID and ancestors of an
// acquisition by AcquireMode of key for holder whose reply was lost.
func (t *lostTokens) rememberEntry(key, holder, token, waitID string, ancestors []string, now time.Time) {
	t.add(key, lostToken{holder: holder, token: token, entry: true, waitID: waitID, ancestors: slices.Clone(ancestors)}, now)
}

// add records lt (its until set from now) for key.
func (t *lostTokens) add(key string, lt lostToken, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byKey == nil {
		t.byKey = make(map[string][]lostToken)
	}
	if d := now.Sub(t.swept); d >= lostKeep || t.n.Load() >= lostMax && d >= time.Second {
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
		t.n.Add(-1)
	}
	if t.n.Load() >= lostMax {
		t.byKey[key] = ts
		if len(ts) == 0 {
			delete(t.byKey, key)
		}
		return
	}
	lt.until = now.Add(lostKeep)
	t.byKey[key] = append(ts, lt)
	t.n.Add(1)
}

// find returns the lost acquisition of key for holder under token, if
// there is one.
func (t *lostTokens) find(key, holder, token string, now time.Time) (lostToken, bool) {
	if t.n.Load() == 0 {
		return lostToken{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, lt := range t.prune(key, now) {
		if lt.holder == holder && lt.token == token {
			return lt, true
		}
	}
	return lostToken{}, false
}

// forMode returns what an AcquireMode of key for holder, with waitID and
// ancestors, passes to its script: the kind (p: a plain lease, e: an
// entry) and token of each lost acquisition it can delete (an entry only
// when it was taken with the same ancestors, whose intents the script
// reaches), and the wait IDs of lost acquisitions whose registrations it
// withdraws (not waitID, nor that of a wait that goes on). Both are nil
// when key has no lost acquisition, without taking t.mu when none at all.
func (t *lostTokens) forMode(key, holder, waitID string, ancestors []string, now time.Time) (toks, wids []any) {
	if t.n.Load() == 0 {
		return nil, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, lt := range t.prune(key, now) {
		if lt.holder != holder {
			continue
		}
		switch {
		case !lt.entry:
			toks = append(toks, "p", lt.token)
		case slices.Equal(lt.ancestors, ancestors):
			toks = append(toks, "e", lt.token)
		}
		if lt.waitID != "" && lt.waitID != waitID && !lt.waiting && !slices.Contains(wids, any(lt.waitID)) {
			wids = append(wids, lt.waitID)
		}
	}
	return toks, wids
}

// waitSeen records that an attempt of key with waitID was answered: HELD
// (waiting: the wait goes on, its registration is the caller's) or not (a
// success, or CancelWait: the wait has ended, and a registration the lost
// acquisition writes later is nobody's).
func (t *lostTokens) waitSeen(key, waitID string, waiting bool) {
	if waitID == "" || t.n.Load() == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ts := t.byKey[key]
	for i := range ts {
		if ts[i].waitID == waitID {
			ts[i].waiting = waiting
		}
	}
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
			t.n.Add(-1)
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
		t.n.Add(-int64(i))
		if len(ts) == 0 {
			delete(t.byKey, key)
		} else {
			t.byKey[key] = ts
		}
	}
	return ts
}

// reclaimNamed deletes the leases and entries that held names (its
// Holders, or its Holder when it has none) which holder's lost
// acquisitions of this Backend took, owner-checked by their tokens, and
// reports whether it deleted any.
func (b *Backend) reclaimNamed(ctx context.Context, holder string, held *backend.HeldError) bool {
	recs := held.Holders
	if len(recs) == 0 {
		recs = []backend.Record{held.Holder}
	}
	done := false
	for _, r := range recs {
		if r.HolderID != holder || r.Token == "" {
			continue
		}
		lt, ok := b.lostAcq.find(r.Key, holder, r.Token, time.Now())
		if ok && b.reclaim(ctx, r.Key, lt) {
			done = true
		}
	}
	return done
}

// reclaim deletes the lease or entry of key that the lost acquisition lt
// took, if it is still there (owner-checked, with the release event), and
// reports whether it did.
func (b *Backend) reclaim(ctx context.Context, key string, lt lostToken) bool {
	if lt.entry {
		l := backend.Lease{Key: key, HolderID: lt.holder, Token: lt.token, Entry: &backend.Entry{Ancestors: lt.ancestors}}
		if b.releaseEntry(ctx, l) != nil {
			return false
		}
	} else {
		v, _, err := b.runAny(ctx, releaseScript, false, []string{b.keyBase(key)}, []any{lt.holder, lt.token, b.publishArg})
		if err != nil || v != int64(1) {
			return false
		}
	}
	b.lostAcq.forget(key, lt.token)
	return true
}
