// Package backendtest is the conformance suite for implementations of
// backend.Backend (and, where implemented, backend.Watcher,
// backend.WatchNotifier and backend.Modes).
//
// Every backend's test calls Run once:
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t *testing.T) backendtest.Env {
//			store := memorybackend.NewStore()
//			return backendtest.Env{Open: func() backend.Backend { return store.Client() }}
//		})
//	}
//
// Each subtest checks one promise of the contract and fails when the backend
// breaks it. Subtests run one after another, each on a fresh Env.
//
// A backend whose clients implement backend.Modes also runs the Modes
// subtests (named Modes...): shared holders, limits and limit mismatch,
// Exclusive against Shared and plain Acquire, per-entry expiry and owner
// checks, terms, writer preference, hierarchies, fair order, Holders, Get
// and List, watches of a key and its ancestors, bounded state and a restart.
// Each skips, saying why, when the backend lacks Modes or the part of its
// ModeSupport the subtest needs; ModesUnsupported checks that what
// ModeSupport lacks is refused with backend.ErrUnsupported.
//
// Two promises need more of the Env than a client: bounded per-key state
// (Env.Size, Env.Retention) and behaviour across a store restart
// (Env.Restart, Env.TermsSurviveDataLoss). An Env without those hooks skips
// the subtests that need them, saying which hook is missing, so give them
// wherever the store can provide them.
package backendtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// Env is one fresh, empty store under test.
type Env struct {
	// Open returns a new client of this Env's store. Required. The suite
	// closes what it opens.
	Open func() backend.Backend
	// Advance makes at least d pass on the store's clock (miniredis
	// FastForward, say). Nil: the suite waits in real time, polling for the
	// expected state with a generous bound.
	Advance func(d time.Duration)
	// ShortTTL is the TTL used by expiry tests. Zero means 500ms. etcd sets
	// 1-2s (whole seconds).
	ShortTTL time.Duration

	// Size returns how much state the store holds for this Env: the number
	// of keys or records it stores (memory: Store.Len; Redis: the keys
	// under the backend's prefix; etcd: the keys under the prefix and the
	// live leases), counting everything a backend might leave behind: term
	// counters, heartbeat records, member sets. The suite only compares it
	// with its value before a subtest used any key, so any measure that
	// grows with per-key state will do. Nil: the BoundedState subtest is
	// skipped, and says so.
	Size func() int
	// Retention is how long the store may keep state for a key after the
	// key's lease has been released or has expired and its heartbeat
	// records have expired (a record deleted by RemoveMember counts as
	// expiring when its TTL would have ended): a term counter kept so that
	// terms keep increasing, say. BoundedState lets that much time pass
	// (with Advance, at once) beyond the records' TTLs before it expects
	// Size back at its baseline, and then checks that terms still
	// increase. Zero: nothing outlives the records. A Retention above a
	// minute needs Advance; without it BoundedState is skipped.
	Retention time.Duration

	// Restart restarts the store, as a server restart or a failover does,
	// and returns once the store serves requests again. With loseData the
	// store comes back empty: every lease, heartbeat record and term
	// counter is gone (a Redis without persistence). Without it the store
	// keeps its data (a restart with persistence). Clients opened before Restart must keep working; a
	// call or two may fail while they reconnect (the suite retries reads
	// for a while). A watch open across a restart must be closed or
	// deliver EventReset; across one that kept the data it may instead go
	// on delivering every change (an etcd watch resumes from its revision).
	// Nil: the RestartKeepingData and RestartLosingData subtests are
	// skipped, and say so.
	Restart func(loseData bool)
	// TermsSurviveDataLoss says that the backend promises terms handed out
	// after Restart(true) greater than every term handed out before it (the
	// memory store keeps its counter, Redis starts terms from the server
	// clock). RestartLosingData then checks it; otherwise it only logs the
	// terms it saw.
	TermsSurviveDataLoss bool
}

const (
	// defaultShortTTL is the ShortTTL of an Env that sets none.
	defaultShortTTL = 500 * time.Millisecond
	// longTTL is the TTL of leases that must not expire during a subtest.
	longTTL = time.Minute
	// bound is how long the suite waits, beyond what the promise allows, for
	// a state to be reached or a call to return before it fails.
	bound = 15 * time.Second
	// watchBound is how long the suite waits for a watch event.
	watchBound = 5 * time.Second
	// pollInterval is the pause between two reads while polling.
	pollInterval = 10 * time.Millisecond
)

// Run runs the conformance suite; newEnv is called once per subtest, with
// that subtest's t.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	t.Helper()
	tests := []struct {
		name string
		fn   func(*testing.T, *harness)
	}{
		{"AcquireIsAtomic", testAcquireAtomic},
		{"HeldErrorNamesHolder", testHeldError},
		{"RenewAndReleaseAreOwnerChecked", testWrongLease},
		{"LeaseLostAfterRelease", testLostAfterRelease},
		{"LeaseLostAfterExpiry", testLostAfterExpiry},
		{"SameHolderIDDifferentToken", testSameHolderID},
		{"TermsStrictlyIncrease", testTerms},
		{"LeaseExpires", testExpiry},
		{"RenewExtends", testRenewExtends},
		{"Record", testRecord},
		{"HeartbeatsAndMembers", testHeartbeats},
		{"GetFreeKey", testGetFree},
		{"Watch", testWatch},
		{"WatchRenewals", testWatchRenewals},
		{"WatchRenewalsMuted", testWatchRenewalsMuted},
		{"WatchNotify", testWatchNotify},
		{"CancelledContext", testCancelled},
		{"Closed", testClosed},
		{"InvalidArguments", testInvalid},
		{"ConcurrentUse", testConcurrent},
		{"SetMetadata", testSetMetadata},
		{"List", testList},
		{"ListPrefixIsLiteral", testListLiteral},
		{"ListOnlyLiveLeases", testListLive},
		{"ValidateKey", testValidateKey},
		{"MinTTL", testMinTTL},
		{"NoTakeover", testNoTakeover},
		{"BoundedState", testBounded},
		{"RestartKeepingData", func(t *testing.T, h *harness) { testRestart(t, h, false) }},
		{"RestartLosingData", func(t *testing.T, h *harness) { testRestart(t, h, true) }},
	}
	// The cases of backend.Modes skip, saying so, for a backend without it.
	tests = append(tests, modeCases...)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newEnv(t)
			if env.Open == nil {
				t.Fatal("backendtest: Env.Open is nil")
			}
			if env.ShortTTL == 0 {
				env.ShortTTL = defaultShortTTL
			}
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			t.Cleanup(cancel)
			tt.fn(t, &harness{t: t, env: env, ctx: ctx})
		})
	}
}

// harness is the state of one subtest.
type harness struct {
	t   *testing.T
	env Env
	ctx context.Context // bounds every call of the subtest
}

// open returns a new client, closed at the end of the subtest.
func (h *harness) open() backend.Backend {
	h.t.Helper()
	b := h.env.Open()
	if b == nil {
		h.t.Fatal("backendtest: Env.Open returned nil")
	}
	h.t.Cleanup(func() { _ = b.Close() })
	return b
}

// elapse lets d pass on the store's clock: with Advance, at once; otherwise in
// real time.
func (h *harness) elapse(d time.Duration) {
	h.t.Helper()
	if h.env.Advance != nil {
		h.env.Advance(d)
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-h.ctx.Done():
		h.t.Fatalf("waiting %v: %v", d, h.ctx.Err())
	}
}

// eventually lets after pass on the store's clock (with Advance) and then
// polls cond until it holds. Without Advance it polls for after plus a
// generous bound. cond returns a description of the state it saw.
func (h *harness) eventually(what string, after time.Duration, cond func() (bool, string)) {
	h.t.Helper()
	limit := bound
	if h.env.Advance != nil {
		h.env.Advance(after)
	} else {
		limit += after
	}
	deadline := time.Now().Add(limit)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%s: still %s after %v", what, state, limit)
		}
		timer := time.NewTimer(pollInterval)
		select {
		case <-timer.C:
		case <-h.ctx.Done():
			timer.Stop()
			h.t.Fatalf("%s: %v (last state: %s)", what, h.ctx.Err(), state)
		}
	}
}

// freeCond is an eventually condition: key has no holder.
func (h *harness) freeCond(b backend.Backend, key string) func() (bool, string) {
	return func() (bool, string) {
		rec, err := b.Get(h.ctx, key)
		switch {
		case errors.Is(err, backend.ErrNotHeld):
			return true, ""
		case err != nil:
			h.t.Fatalf("Get(%q): got error %v, want nil or ErrNotHeld", key, err)
		}
		return false, fmt.Sprintf("held by %q (term %d, TTL %v)", rec.HolderID, rec.Term, rec.TTL)
	}
}

func (h *harness) acquire(b backend.Backend, req backend.AcquireRequest) backend.Lease {
	h.t.Helper()
	l, err := b.Acquire(h.ctx, req)
	if err != nil {
		h.t.Fatalf("Acquire(%q by %q): got error %v, want nil",
			req.Key, req.HolderID, err)
	}
	if l.Key != req.Key || l.HolderID != req.HolderID || l.Token == "" || l.Term == 0 {
		h.t.Fatalf("Acquire(%q by %q): got lease %+v, want key, holder, token and term set",
			req.Key, req.HolderID, l)
	}
	if l.TTL < req.TTL {
		h.t.Fatalf("Acquire(%q): got lease TTL %v, want >= requested %v", req.Key, l.TTL, req.TTL)
	}
	return l
}

// acquireKey acquires key for id with ttl.
func (h *harness) acquireKey(b backend.Backend, key, id string, ttl time.Duration) backend.Lease {
	h.t.Helper()
	return h.acquire(b, backend.AcquireRequest{Key: key, HolderID: id, TTL: ttl})
}

// get returns the record of key, failing when it has no holder.
func (h *harness) get(b backend.Backend, key string) backend.Record {
	h.t.Helper()
	rec, err := b.Get(h.ctx, key)
	if err != nil {
		h.t.Fatalf("Get(%q): got error %v, want nil", key, err)
	}
	return rec
}

// mustHold fails unless the store holds exactly l.
func (h *harness) mustHold(b backend.Backend, l backend.Lease) {
	h.t.Helper()
	rec, err := b.Get(h.ctx, l.Key)
	if err != nil {
		h.t.Fatalf("Get(%q): got error %v, want the lease of %q term %d", l.Key, err, l.HolderID, l.Term)
	}
	if !sameLease(rec, l) {
		h.t.Fatalf("Get(%q): got holder %q term %d token %q, want %q term %d token %q",
			l.Key, rec.HolderID, rec.Term, rec.Token, l.HolderID, l.Term, l.Token)
	}
}

// mustBeFree fails unless key has no holder.
func (h *harness) mustBeFree(b backend.Backend, key string) {
	h.t.Helper()
	rec, err := b.Get(h.ctx, key)
	if !errors.Is(err, backend.ErrNotHeld) {
		h.t.Fatalf("Get(%q): got record %+v, error %v; want ErrNotHeld", key, rec, err)
	}
}

func sameLease(rec backend.Record, l backend.Lease) bool {
	return rec.Key == l.Key && rec.HolderID == l.HolderID && rec.Token == l.Token && rec.Term == l.Term
}

// within runs f and fails the test unless it returns within bound.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case err := <-done:
		return err
	case <-timer.C:
		t.Fatalf("%s did not return within %v", what, bound)
		return nil
	}
}
