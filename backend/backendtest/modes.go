package backendtest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// The cases of backend.Modes (shared locks, semaphores, hierarchies, fair
// queueing). Each skips, saying why, when the backend does not implement
// Modes or its ModeSupport lacks what the case needs.

// modeCases are the subtests of backend.Modes, run by Run.
var modeCases = []struct {
	name string
	fn   func(*testing.T, *harness)
}{
	{"ModesManyShared", testModesManyShared},
	{"ModesLimit", testModesLimit},
	{"ModesLimitMismatch", testModesLimitMismatch},
	{"ModesExclusiveVsShared", testModesExclusiveVsShared},
	{"ModesPlainAcquire", testModesPlainAcquire},
	{"ModesEntryExpires", testModesEntryExpires},
	{"ModesOwnerChecked", testModesOwnerChecked},
	{"ModesTerms", testModesTerms},
	{"ModesHoldersGetList", testModesHoldersGetList},
	{"ModesWriterPreference", testModesWriterPreference},
	{"ModesHierarchy", testModesHierarchy},
	{"ModesAncestorWaiters", testModesAncestorWaiters},
	{"ModesIntentExpires", testModesIntentExpires},
	{"ModesFairOrder", testModesFairOrder},
	{"ModesCancelWaitFair", testModesCancelWaitFair},
	{"ModesRegisterOnly", testModesRegisterOnly},
	{"ModesWatch", testModesWatch},
	{"ModesWatchRenewals", testModesWatchRenewals},
	{"ModesBoundedState", testModesBounded},
	{"ModesContention", testModesContention},
	{"ModesIntentRenewed", testModesIntentRenewed},
	{"ModesRestartLosingData", testModesRestart},
	{"ModesInvalid", testModesInvalid},
	{"ModesUnsupported", testModesUnsupported},
	{"ModesCancelledAndClosed", testModesCancelledAndClosed},
}

// modeKey is the key of the cases of Modes: a lock key, as package lock
// stores it.
const modeKey = "lock/modes/k"

// modesClient is a client of the backend under test that implements Modes.
type modesClient interface {
	backend.Backend
	backend.Modes
}

// openModes returns a new client, skipping the subtest when the backend does
// not implement Modes or lacks a part of it that need requires.
func (h *harness) openModes(need ...string) modesClient {
	h.t.Helper()
	b := h.open()
	m, ok := b.(modesClient)
	if !ok {
		h.t.Skip("backend does not implement backend.Modes")
	}
	ms := m.ModeSupport()
	for _, n := range need {
		var has bool
		switch n {
		case "Shared":
			has = ms.Shared
		case "Hierarchical":
			has = ms.Hierarchical
		case "Fair":
			has = ms.Fair
		case "WriterFirst":
			has = ms.WriterFirst
		case "AncestorWaiters":
			has = ms.AncestorWaiters
		default:
			h.t.Fatalf("backendtest: unknown mode feature %q", n)
		}
		if !has {
			h.t.Skipf("backend's ModeSupport lacks %s (%+v): not checked", n, ms)
		}
	}
	return m
}

// openMore returns another client of the same kind as openModes, without
// checking again.
func (h *harness) openMore() modesClient {
	h.t.Helper()
	return h.open().(modesClient)
}

// modeReq returns a request for key by id, in mode m, with TTL longTTL.
func modeReq(key, id string, m backend.Mode) backend.ModeRequest {
	return backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: key, HolderID: id, TTL: longTTL}, Mode: m}
}

// shared returns a Shared request for key by id with limit.
func shared(key, id string, limit int) backend.ModeRequest {
	r := modeReq(key, id, backend.Shared)
	r.Limit = limit
	return r
}

// exclusive returns an Exclusive request for key by id.
func exclusive(key, id string) backend.ModeRequest { return modeReq(key, id, backend.Exclusive) }

// below makes r hierarchical, with ancestors.
func below(r backend.ModeRequest, ancestors ...string) backend.ModeRequest {
	r.Ancestors = ancestors
	return r
}

// describe returns a short description of a request, for messages.
func describe(r backend.ModeRequest) string {
	s := fmt.Sprintf("%v %q by %q", r.Mode, r.Key, r.HolderID)
	if r.Limit > 0 {
		s += fmt.Sprintf(" limit %d", r.Limit)
	}
	if len(r.Ancestors) > 0 {
		s += fmt.Sprintf(" below %q", r.Ancestors)
	}
	if r.Fair {
		s += " fair"
	}
	if r.WaitID != "" {
		s += " waiting as " + r.WaitID
	}
	return s
}

// acquireMode acquires r, failing the test on an error or a malformed
// lease.
func (h *harness) acquireMode(m backend.Modes, r backend.ModeRequest) backend.Lease {
	h.t.Helper()
	l, err := m.AcquireMode(h.ctx, r)
	if err != nil {
		h.t.Fatalf("AcquireMode(%s): got error %v, want nil", describe(r), err)
	}
	if l.Key != r.Key || l.HolderID != r.HolderID || l.Token == "" || l.Term == 0 || l.TTL < r.TTL {
		h.t.Fatalf("AcquireMode(%s): got lease %+v, want key, holder, token, term and TTL >= %v", describe(r), l, r.TTL)
	}
	if l.Entry == nil || l.Entry.Mode != r.Mode || l.Entry.Limit != r.Limit || !slices.Equal(l.Entry.Ancestors, r.Ancestors) {
		h.t.Fatalf("AcquireMode(%s): got lease entry %+v, want mode %v, limit %d, ancestors %q", describe(r), l.Entry, r.Mode, r.Limit, r.Ancestors)
	}
	return l
}

// heldMode expects AcquireMode(r) to fail with a *HeldError and returns it.
func (h *harness) heldMode(m backend.Modes, r backend.ModeRequest) *backend.HeldError {
	h.t.Helper()
	l, err := m.AcquireMode(h.ctx, r)
	var held *backend.HeldError
	if !errors.As(err, &held) || !errors.Is(err, backend.ErrHeld) {
		h.t.Fatalf("AcquireMode(%s): got lease %+v, error %v; want a *HeldError that is ErrHeld", describe(r), l, err)
	}
	return held
}

// heldBy expects AcquireMode(r) to fail with a *HeldError whose Holders are
// exactly the leases want, in that order (term order), and Holder the
// first of them.
func (h *harness) heldBy(m backend.Modes, r backend.ModeRequest, want ...backend.Lease) *backend.HeldError {
	h.t.Helper()
	held := h.heldMode(m, r)
	h.sameHolders(fmt.Sprintf("HeldError.Holders of AcquireMode(%s)", describe(r)), held.Holders, want...)
	if len(want) > 0 && !sameLease(held.Holder, want[0]) {
		h.t.Errorf("HeldError.Holder of AcquireMode(%s): got %q %q term %d, want the oldest conflicting holder %q %q term %d",
			describe(r), held.Holder.Key, held.Holder.HolderID, held.Holder.Term, want[0].Key, want[0].HolderID, want[0].Term)
	}
	return held
}

// sameHolders fails unless recs are the records of exactly the leases
// want, in that order, each with the lease's mode and limit.
func (h *harness) sameHolders(what string, recs []backend.Record, want ...backend.Lease) {
	h.t.Helper()
	ok := len(recs) == len(want)
	for i := 0; ok && i < len(recs); i++ {
		ok = sameLease(recs[i], want[i]) && recs[i].Mode == modeOf(want[i]) && recs[i].Limit == limitOf(want[i])
	}
	if !ok {
		h.t.Fatalf("%s: got %s, want %s", what, recordsString(recs), leasesString(want))
	}
}

func modeOf(l backend.Lease) backend.Mode {
	if l.Entry == nil {
		return backend.Exclusive
	}
	return l.Entry.Mode
}

func limitOf(l backend.Lease) int {
	if l.Entry == nil {
		return 0
	}
	return l.Entry.Limit
}

func recordsString(recs []backend.Record) string {
	s := "["
	for i, r := range recs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%q %q term %d %v limit %d", r.Key, r.HolderID, r.Term, r.Mode, r.Limit)
	}
	return s + "]"
}

func leasesString(ls []backend.Lease) string {
	s := "["
	for i, l := range ls {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%q %q term %d %v limit %d", l.Key, l.HolderID, l.Term, modeOf(l), limitOf(l))
	}
	return s + "]"
}

// holders returns Holders(key), failing on an error.
func (h *harness) holders(m backend.Modes, key string) []backend.Record {
	h.t.Helper()
	recs, err := m.Holders(h.ctx, key)
	if err != nil {
		h.t.Fatalf("Holders(%q): got error %v, want nil", key, err)
	}
	return recs
}

// mustHolders fails unless Holders(key) returns exactly the leases want,
// in term order.
func (h *harness) mustHolders(m backend.Modes, key string, want ...backend.Lease) {
	h.t.Helper()
	h.sameHolders(fmt.Sprintf("Holders(%q)", key), h.holders(m, key), want...)
}

// release releases l, failing on an error.
func (h *harness) release(b backend.Backend, l backend.Lease) {
	h.t.Helper()
	if err := b.Release(h.ctx, l); err != nil {
		h.t.Fatalf("Release(%q by %q term %d): got %v, want nil", l.Key, l.HolderID, l.Term, err)
	}
}

// testModesManyShared: many Shared holders hold a key at once, each with
// its own token and a strictly greater term; Holders lists them all in term
// order; an Exclusive acquisition and a plain Acquire fail naming them.
func testModesManyShared(t *testing.T, h *harness) {
	m := h.openModes("Shared")
	const n = 5
	var ls []backend.Lease
	tokens := map[string]bool{}
	for i := range n {
		c := m
		if i%2 == 1 {
			c = h.openMore()
		}
		l := h.acquireMode(c, shared(modeKey, fmt.Sprintf("reader-%d", i), 0))
		if tokens[l.Token] {
			t.Fatalf("reader-%d: token %q handed out twice", i, l.Token)
		}
		tokens[l.Token] = true
		if i > 0 && l.Term <= ls[i-1].Term {
			t.Fatalf("reader-%d: term %d, want > %d (the previous reader's)", i, l.Term, ls[i-1].Term)
		}
		ls = append(ls, l)
	}
	h.mustHolders(m, modeKey, ls...)
	h.heldBy(m, exclusive(modeKey, "writer"), ls...)
	_, err := m.Acquire(h.ctx, backend.AcquireRequest{Key: modeKey, HolderID: "plain", TTL: longTTL})
	var held *backend.HeldError
	if !errors.As(err, &held) || !sameLease(held.Holder, ls[0]) {
		t.Fatalf("plain Acquire of a key with Shared holders: got %v, want ErrHeld naming the oldest, %q term %d", err, ls[0].HolderID, ls[0].Term)
	}
	h.release(m, ls[2])
	ls = slices.Delete(ls, 2, 3)
	h.mustHolders(m, modeKey, ls...)
	for _, l := range ls {
		h.release(m, l)
	}
	h.mustHolders(m, modeKey)
	h.mustBeFree(m, modeKey)
	h.release(m, h.acquireMode(m, exclusive(modeKey, "writer")))
}

// testModesLimit: a Shared key with a limit holds at most that many
// holders; the next fails listing them all, and gets in once one leaves.
func testModesLimit(t *testing.T, h *harness) {
	m := h.openModes("Shared")
	const limit = 3
	var ls []backend.Lease
	for i := range limit {
		ls = append(ls, h.acquireMode(h.openMore(), shared(modeKey, fmt.Sprintf("permit-%d", i), limit)))
	}
	h.mustHolders(m, modeKey, ls...)
	for range 2 { // failed attempts write nothing
		h.heldBy(m, shared(modeKey, "one-too-many", limit), ls...)
	}
	h.mustHolders(m, modeKey, ls...)
	h.release(m, ls[1])
	ls = slices.Delete(ls, 1, 2)
	ls = append(ls, h.acquireMode(m, shared(modeKey, "one-too-many", limit)))
	h.mustHolders(m, modeKey, ls...)
	h.heldBy(m, shared(modeKey, "late", limit), ls...)

	// Another key's limit is its own.
	other := modeKey + "-other"
	h.release(m, h.acquireMode(m, shared(other, "x", 1)))
	l1 := h.acquireMode(m, shared(other, "x", 1))
	h.heldBy(m, shared(other, "y", 1), l1)
}

// testModesLimitMismatch: a Shared acquisition whose limit differs from
// the live holders' fails with ErrLimitMismatch and writes nothing; once
// they are gone a new limit may be chosen.
func testModesLimitMismatch(t *testing.T, h *harness) {
	m := h.openModes("Shared")
	l := h.acquireMode(m, shared(modeKey, "a", 3))
	for _, limit := range []int{0, 2, 4} {
		r := shared(modeKey, "b", limit)
		r.WaitID = "b-wait"
		got, err := m.AcquireMode(h.ctx, r)
		if !errors.Is(err, backend.ErrLimitMismatch) {
			t.Errorf("AcquireMode(%s) with holders of limit 3: got lease %+v, error %v; want ErrLimitMismatch", describe(r), got, err)
		}
		if errors.Is(err, backend.ErrHeld) {
			t.Errorf("AcquireMode(%s): got %v, want ErrLimitMismatch alone, not ErrHeld", describe(r), err)
		}
	}
	h.mustHolders(m, modeKey, l)
	h.release(m, l)
	h.mustHolders(m, modeKey)
	l2 := h.acquireMode(m, shared(modeKey, "b", 2))
	h.mustHolders(m, modeKey, l2)
	if _, err := m.AcquireMode(h.ctx, shared(modeKey, "c", 3)); !errors.Is(err, backend.ErrLimitMismatch) {
		t.Errorf("AcquireMode limit 3 with a holder of limit 2: got %v, want ErrLimitMismatch", err)
	}
}

// testModesExclusiveVsShared: an Exclusive holder excludes Shared holders
// and other Exclusive holders, and Shared holders exclude an Exclusive one.
func testModesExclusiveVsShared(t *testing.T, h *harness) {
	m := h.openModes("Shared")
	b := h.openMore()
	x := h.acquireMode(m, exclusive(modeKey, "writer"))
	h.mustHolders(b, modeKey, x)
	h.heldBy(b, shared(modeKey, "reader", 0), x)
	h.heldBy(b, shared(modeKey, "reader", 2), x)
	h.heldBy(b, exclusive(modeKey, "writer-2"), x)
	h.heldBy(b, exclusive(modeKey, "writer"), x) // the same holder ID too
	h.release(m, x)

	r1 := h.acquireMode(b, shared(modeKey, "reader-1", 0))
	r2 := h.acquireMode(m, shared(modeKey, "reader-2", 0))
	h.heldBy(m, exclusive(modeKey, "writer"), r1, r2)
	h.release(b, r1)
	h.heldBy(m, exclusive(modeKey, "writer"), r2)
	h.release(m, r2)
	x = h.acquireMode(b, exclusive(modeKey, "writer"))
	h.mustHolders(m, modeKey, x)
}

// testModesPlainAcquire: plain Acquire and AcquireMode see each other: a
// plain lease is an Exclusive holder for AcquireMode, a Mode holder makes
// Acquire fail naming the oldest holder, and waiters do not block Acquire.
func testModesPlainAcquire(t *testing.T, h *harness) {
	m := h.openModes()
	b := h.openMore()
	p := h.acquireKey(b, modeKey, "plain", longTTL)
	h.mustHolders(m, modeKey, p)
	h.heldBy(m, exclusive(modeKey, "mode"), p)
	if m.ModeSupport().Shared {
		h.heldBy(m, shared(modeKey, "mode", 0), p)
	}
	h.release(b, p)

	x := h.acquireMode(m, exclusive(modeKey, "mode"))
	_, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: modeKey, HolderID: "plain", TTL: longTTL})
	var held *backend.HeldError
	if !errors.As(err, &held) || !sameLease(held.Holder, x) {
		t.Fatalf("plain Acquire of a key held by AcquireMode: got %v, want ErrHeld naming %q term %d", err, x.HolderID, x.Term)
	}
	h.mustHold(b, x) // Get sees it
	h.release(m, x)

	if !m.ModeSupport().Shared {
		return
	}
	s1 := h.acquireMode(m, shared(modeKey, "reader-1", 0))
	s2 := h.acquireMode(b, shared(modeKey, "reader-2", 0))
	_, err = b.Acquire(h.ctx, backend.AcquireRequest{Key: modeKey, HolderID: "plain", TTL: longTTL})
	if !errors.As(err, &held) || !sameLease(held.Holder, s1) {
		t.Fatalf("plain Acquire of a key with Shared holders: got %v, want ErrHeld naming the oldest, %q term %d", err, s1.HolderID, s1.Term)
	}
	// A waiter registers, then the readers leave: plain Acquire ignores
	// the waiter.
	w := exclusive(modeKey, "waiting-writer")
	w.WaitID = "waiting-writer-1"
	h.heldBy(m, w, s1, s2)
	h.release(m, s1)
	h.release(b, s2)
	p = h.acquireKey(b, modeKey, "plain", longTTL)
	h.mustHolders(m, modeKey, p)
	if err := m.CancelWait(h.ctx, modeKey, w.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
}

// testModesEntryExpires: an entry expires on its own TTL, freeing its slot
// while the others live on; it can then no longer be renewed or released.
func testModesEntryExpires(t *testing.T, h *harness) {
	m := h.openModes("Shared")
	b := h.openMore()
	const limit = 2
	long := h.acquireMode(m, shared(modeKey, "long", limit))
	r := shared(modeKey, "crashes", limit)
	r.TTL = h.env.ShortTTL
	short := h.acquireMode(b, r)
	h.mustHolders(m, modeKey, long, short)
	h.heldBy(m, shared(modeKey, "third", limit), long, short)
	h.eventually("expiry of the short entry", short.TTL, func() (bool, string) {
		recs := h.holders(m, modeKey)
		return len(recs) == 1, recordsString(recs)
	})
	h.mustHolders(m, modeKey, long)
	if err := b.Renew(h.ctx, short); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of an expired entry: got %v, want ErrLeaseLost", err)
	}
	if err := b.Release(h.ctx, short); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Release of an expired entry: got %v, want ErrLeaseLost", err)
	}
	third := h.acquireMode(m, shared(modeKey, "third", limit))
	h.mustHolders(m, modeKey, long, third)
	if err := m.Renew(h.ctx, long); err != nil {
		t.Errorf("Renew of the live entry: got %v, want nil", err)
	}
}

// testModesOwnerChecked: Renew, Release and SetMetadata act on one entry,
// owner-checked by token: two entries of one holder ID are told apart, and
// a wrong token, holder or kind of lease gets ErrLeaseLost and changes
// nothing.
func testModesOwnerChecked(t *testing.T, h *harness) {
	m := h.openModes("Shared")
	b := h.openMore()
	r := shared(modeKey, "same", 0)
	r.TTL = 4 * h.env.ShortTTL
	r.Metadata = map[string]string{"n": "1"}
	l1 := h.acquireMode(m, r)
	r.Metadata = map[string]string{"n": "2"}
	l2 := h.acquireMode(b, r)
	if l1.Token == l2.Token {
		t.Fatalf("two entries of one holder ID: same token %q, want fresh tokens", l1.Token)
	}
	h.mustHolders(m, modeKey, l1, l2)

	plain := l1
	plain.Entry = nil
	wrong := map[string]backend.Lease{
		"random token":             {Key: l1.Key, HolderID: l1.HolderID, Token: backend.NewToken(), Term: l1.Term, TTL: l1.TTL, Entry: l1.Entry},
		"wrong holder":             {Key: l1.Key, HolderID: "other", Token: l1.Token, Term: l1.Term, TTL: l1.TTL, Entry: l1.Entry},
		"wrong key":                {Key: modeKey + "-free", HolderID: l1.HolderID, Token: l1.Token, Term: l1.Term, TTL: l1.TTL, Entry: l1.Entry},
		"no Entry (a plain lease)": plain,
	}
	for name, w := range wrong {
		if err := b.Renew(h.ctx, w); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Renew with %s: got %v, want ErrLeaseLost", name, err)
		}
		if err := b.SetMetadata(h.ctx, w, map[string]string{"n": "foreign"}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("SetMetadata with %s: got %v, want ErrLeaseLost", name, err)
		}
		if err := b.Release(h.ctx, w); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Release with %s: got %v, want ErrLeaseLost", name, err)
		}
		h.mustHolders(m, modeKey, l1, l2)
	}
	recs := h.holders(m, modeKey)
	if recs[0].Metadata["n"] != "1" || recs[1].Metadata["n"] != "2" {
		t.Fatalf("metadata after foreign calls: got %v, %v; want n=1, n=2", recs[0].Metadata, recs[1].Metadata)
	}

	// SetMetadata changes its own entry only, without extending it.
	h.elapse(h.env.ShortTTL)
	before := h.holders(m, modeKey)
	if err := b.SetMetadata(h.ctx, l2, map[string]string{"n": "2b"}); err != nil {
		t.Fatalf("SetMetadata of the second entry: %v", err)
	}
	recs = h.holders(m, modeKey)
	if !maps.Equal(recs[0].Metadata, map[string]string{"n": "1"}) || !maps.Equal(recs[1].Metadata, map[string]string{"n": "2b"}) {
		t.Errorf("metadata after SetMetadata of the second entry: got %v, %v; want n=1, n=2b", recs[0].Metadata, recs[1].Metadata)
	}
	if recs[1].TTL > before[1].TTL {
		t.Errorf("TTL after SetMetadata: got %v, want at most the %v before (SetMetadata must not extend)", recs[1].TTL, before[1].TTL)
	}
	// Renew extends its own entry only.
	if err := m.Renew(h.ctx, l1); err != nil {
		t.Fatalf("Renew of the first entry: %v", err)
	}
	recs = h.holders(m, modeKey)
	if recs[0].TTL <= before[0].TTL || recs[1].TTL > before[1].TTL {
		t.Errorf("TTLs after renewing the first entry: got %v, %v; want the first above %v, the second at most %v",
			recs[0].TTL, recs[1].TTL, before[0].TTL, before[1].TTL)
	}
	// Release removes its own entry only, once.
	h.release(m, l1)
	h.mustHolders(m, modeKey, l2)
	if err := m.Release(h.ctx, l1); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("second Release of the first entry: got %v, want ErrLeaseLost", err)
	}
	if err := m.Renew(h.ctx, l1); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of the released first entry: got %v, want ErrLeaseLost", err)
	}
	if err := m.SetMetadata(h.ctx, l1, nil); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("SetMetadata of the released first entry: got %v, want ErrLeaseLost", err)
	}
	h.mustHolders(m, modeKey, l2)
	if err := b.Renew(h.ctx, l2); err != nil {
		t.Errorf("Renew of the second entry: got %v, want nil", err)
	}
}

// testModesTerms: terms strictly increase across plain and Mode
// acquisitions of a key, across release and expiry; renewal keeps them.
func testModesTerms(t *testing.T, h *harness) {
	m := h.openModes()
	hasShared := m.ModeSupport().Shared
	var terms []uint64
	check := func(step string, l backend.Lease) {
		t.Helper()
		if n := len(terms); n > 0 && l.Term <= terms[n-1] {
			t.Fatalf("term after %s: got %d, want > %d (terms so far %v)", step, l.Term, terms[n-1], terms)
		}
		terms = append(terms, l.Term)
	}
	p := h.acquireKey(m, modeKey, "plain", longTTL)
	check("plain Acquire", p)
	h.release(m, p)
	x := h.acquireMode(m, exclusive(modeKey, "x"))
	check("plain, then Exclusive AcquireMode", x)
	if err := m.Renew(h.ctx, x); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if recs := h.holders(m, modeKey); len(recs) != 1 || recs[0].Term != x.Term {
		t.Fatalf("Holders after Renew: got %s, want term %d unchanged", recordsString(recs), x.Term)
	}
	h.release(m, x)
	if hasShared {
		s1 := h.acquireMode(m, shared(modeKey, "s1", 0))
		check("Shared after Exclusive", s1)
		s2 := h.acquireMode(m, shared(modeKey, "s2", 0))
		check("a second Shared", s2)
		h.release(m, s1)
		s3 := h.acquireMode(m, shared(modeKey, "s3", 0))
		check("a third Shared after the first left", s3)
		h.release(m, s2)
		h.release(m, s3)
	}
	r := exclusive(modeKey, "expiring")
	r.TTL = h.env.ShortTTL
	e := h.acquireMode(m, r)
	check("Exclusive AcquireMode", e)
	h.eventually("expiry of the entry", e.TTL, func() (bool, string) {
		recs := h.holders(m, modeKey)
		return len(recs) == 0, recordsString(recs)
	})
	p = h.acquireKey(m, modeKey, "plain", longTTL)
	check("expiry, then plain Acquire", p)
	t.Logf("terms: %v", terms)
}

// testModesHoldersGetList: Holders lists every holder in term order (an
// empty slice for a free key); Get returns the oldest; List returns one
// record per holder, in key order and then term order, with mode, limit and
// metadata, and never intents or waiters.
func testModesHoldersGetList(t *testing.T, h *harness) {
	m := h.openModes("Shared")
	b := h.openMore()
	if recs := h.holders(b, modeKey); recs == nil || len(recs) != 0 {
		t.Errorf("Holders of a free key: got %#v, want an empty, non-nil slice", recs)
	}
	ka, kb := "lock/list/a", "lock/list/b"
	req := func(key, id string, limit int) backend.ModeRequest {
		r := shared(key, id, limit)
		r.Metadata = map[string]string{"id": id}
		return r
	}
	b1 := h.acquireMode(m, req(kb, "b1", 0))
	a1 := h.acquireMode(b, req(ka, "a1", 2))
	b2 := h.acquireMode(b, req(kb, "b2", 0))
	a2 := h.acquireMode(m, req(ka, "a2", 2))
	c := h.acquireKey(m, "lock/list/c", "c1", longTTL)
	h.mustHolders(b, ka, a1, a2)
	h.mustHolders(b, kb, b1, b2)
	if rec := h.get(b, ka); !sameLease(rec, a1) || rec.Mode != backend.Shared || rec.Limit != 2 || rec.Metadata["id"] != "a1" {
		t.Errorf("Get(%q): got %+v, want the oldest holder a1 (shared, limit 2, metadata id=a1)", ka, rec)
	}
	if recs := h.holders(b, ka); recs[1].Metadata["id"] != "a2" || recs[1].TTL <= 0 || recs[1].AcquiredAt.IsZero() {
		t.Errorf("Holders(%q)[1]: got %+v, want a2's full record", ka, recs[1])
	}
	// A waiter is not listed.
	w := exclusive(ka, "waiter")
	w.WaitID = "waiter-1"
	h.heldMode(b, w)
	recs := h.list(b, "lock/list/")
	h.sameHolders(`List("lock/list/")`, recs, a1, a2, b1, b2, c)
	for _, r := range recs {
		if want := r.HolderID; r.Key != c.Key && r.Metadata["id"] != want {
			t.Errorf("List record of %q by %q: metadata %v, want id=%s", r.Key, r.HolderID, r.Metadata, want)
		}
	}
	h.sameHolders(`List("lock/list/a")`, h.list(b, "lock/list/a"), a1, a2)
	if err := b.CancelWait(h.ctx, ka, w.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	if err := b.CancelWait(h.ctx, ka, w.WaitID); err != nil {
		t.Errorf("CancelWait of a registration already withdrawn: got %v, want nil", err)
	}
	h.release(m, a1)
	if rec := h.get(b, ka); !sameLease(rec, a2) {
		t.Errorf("Get(%q) after the oldest left: got %q term %d, want a2 term %d", ka, rec.HolderID, rec.Term, a2.Term)
	}
	h.release(m, a2)
	h.mustBeFree(b, ka)
	h.sameHolders(`List("lock/list/")`, h.list(b, "lock/list/"), b1, b2, c)
}

// testModesInvalid: ModeRequests out of range are refused with ErrInvalid
// and write nothing.
func testModesInvalid(t *testing.T, h *harness) {
	m := h.openModes()
	good := exclusive("lock/inv/a/b", "a")
	cases := map[string]func(*backend.ModeRequest){
		"empty key":                  func(r *backend.ModeRequest) { r.Key = "" },
		"empty holder":               func(r *backend.ModeRequest) { r.HolderID = "" },
		"zero TTL":                   func(r *backend.ModeRequest) { r.TTL = 0 },
		"unknown mode":               func(r *backend.ModeRequest) { r.Mode = 7 },
		"negative limit":             func(r *backend.ModeRequest) { r.Mode, r.Limit = backend.Shared, -1 },
		"limit on an exclusive lock": func(r *backend.ModeRequest) { r.Limit = 2 },
		"empty ancestor":             func(r *backend.ModeRequest) { r.Ancestors = []string{""} },
		"ancestor equal to the key":  func(r *backend.ModeRequest) { r.Ancestors = []string{"lock/inv/a/b"} },
		"ancestor not a prefix":      func(r *backend.ModeRequest) { r.Ancestors = []string{"lock/other"} },
		"ancestors innermost first":  func(r *backend.ModeRequest) { r.Ancestors = []string{"lock/inv/a", "lock/inv"} },
		"register only, no wait ID":  func(r *backend.ModeRequest) { r.RegisterOnly = true },
	}
	for name, f := range cases {
		r := good
		f(&r)
		if l, err := m.AcquireMode(h.ctx, r); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("AcquireMode with %s: got lease %+v, error %v; want ErrInvalid", name, l, err)
		}
	}
	h.mustHolders(m, good.Key)
	if _, err := m.Holders(h.ctx, ""); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf(`Holders(""): got %v, want ErrInvalid`, err)
	}
	h.release(m, h.acquireMode(m, good))
}

// testModesUnsupported: a request that needs a part of Modes the backend's
// ModeSupport lacks fails with ErrUnsupported, never with a silent
// Exclusive lock.
func testModesUnsupported(t *testing.T, h *harness) {
	m := h.openModes()
	ms := m.ModeSupport()
	var checked int
	try := func(what string, has bool, r backend.ModeRequest) {
		t.Helper()
		if has {
			return
		}
		checked++
		if l, err := m.AcquireMode(h.ctx, r); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("AcquireMode(%s) with ModeSupport %+v (no %s): got lease %+v, error %v; want ErrUnsupported", describe(r), ms, what, l, err)
		}
		h.mustHolders(m, r.Key)
	}
	try("Shared", ms.Shared, shared(modeKey, "a", 0))
	try("Shared", ms.Shared, shared(modeKey, "a", 2))
	try("Hierarchical", ms.Hierarchical, below(exclusive("lock/u/a/b", "a"), "lock/u", "lock/u/a"))
	fair := exclusive(modeKey, "a")
	fair.Fair = true
	try("Fair", ms.Fair, fair)
	if checked == 0 {
		t.Skipf("ModeSupport %+v lacks nothing that AcquireMode could refuse", ms)
	}
}

// testModesCancelledAndClosed: the methods of Modes honour a cancelled
// context and return ErrClosed after Close.
func testModesCancelledAndClosed(t *testing.T, h *harness) {
	m := h.openModes()
	modeCalls := func(ctx context.Context) map[string]func() error {
		return map[string]func() error{
			"AcquireMode": func() error { _, err := m.AcquireMode(ctx, exclusive(modeKey, "a")); return err },
			"Holders":     func() error { _, err := m.Holders(ctx, modeKey); return err },
			"CancelWait":  func() error { return m.CancelWait(ctx, modeKey, "w") },
		}
	}
	ctx, cancel := context.WithCancel(h.ctx)
	cancel()
	for name, call := range modeCalls(ctx) {
		if err := within(t, name+" with a cancelled context", call); !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: got %v, want an error that is context.Canceled", name, err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for name, call := range modeCalls(h.ctx) {
		if err := within(t, name+" after Close", call); !errors.Is(err, backend.ErrClosed) {
			t.Errorf("%s after Close: got %v, want ErrClosed", name, err)
		}
	}
}

// testModesWriterPreference: an Exclusive acquirer that failed with a
// WaitID blocks new non-fair Shared holders (ErrHeld, Waiting > 0) until it
// withdraws (CancelWait), succeeds, or its registration expires.
func testModesWriterPreference(t *testing.T, h *harness) {
	m := h.openModes("Shared", "WriterFirst")
	b := h.openMore()
	r1 := h.acquireMode(m, shared(modeKey, "reader-1", 0))
	writer := exclusive(modeKey, "writer")
	writer.WaitID = "writer-wait-1"
	h.heldBy(b, writer, r1)
	blocked := func(step string) {
		t.Helper()
		held := h.heldMode(m, shared(modeKey, "reader-2", 0))
		if held.Waiting < 1 {
			t.Errorf("Shared acquisition with an Exclusive waiter (%s): HeldError.Waiting %d, want >= 1", step, held.Waiting)
		}
	}
	blocked("registered")
	h.heldBy(b, writer, r1) // a retry refreshes the registration
	blocked("refreshed")
	// Waiters do not stop Holders from listing the live holders.
	h.mustHolders(b, modeKey, r1)

	// CancelWait withdraws it.
	if err := b.CancelWait(h.ctx, modeKey, writer.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	r2 := h.acquireMode(m, shared(modeKey, "reader-2", 0))

	// A success removes it.
	writer.WaitID = "writer-wait-2"
	h.heldBy(b, writer, r1, r2)
	blocked("registered again")
	h.release(m, r1)
	h.release(m, r2)
	x := h.acquireMode(b, writer)
	h.release(b, x)
	h.release(m, h.acquireMode(m, shared(modeKey, "reader-3", 0)))

	// Retries refresh it beyond its TTL; then it expires on its own TTL.
	r4 := h.acquireMode(m, shared(modeKey, "reader-4", 0))
	writer.WaitID = "writer-wait-3"
	writer.TTL = h.env.ShortTTL
	h.heldBy(b, writer, r4)
	blocked("registered with a short TTL")
	for i := range 5 { // 1⅔ TTLs
		h.elapse(writer.TTL / 3)
		h.heldBy(b, writer, r4)
		blocked(fmt.Sprintf("refreshed by retry %d", i+1))
	}
	h.eventually("expiry of the writer's registration", writer.TTL, func() (bool, string) {
		l, err := m.AcquireMode(h.ctx, shared(modeKey, "reader-5", 0))
		if err == nil {
			h.release(m, l)
			return true, ""
		}
		if !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("Shared acquisition: got %v, want nil or ErrHeld", err)
		}
		return false, fmt.Sprintf("still refused: %v", err)
	})
	h.mustHolders(m, modeKey, r4)

	// A Shared acquirer with a WaitID that is not Fair does not register:
	// it blocks nobody.
	h.release(m, r4)
	x = h.acquireMode(b, exclusive(modeKey, "writer"))
	rs := shared(modeKey, "reader-6", 0)
	rs.WaitID = "reader-wait"
	h.heldBy(m, rs, x)
	h.release(b, x)
	if m.ModeSupport().Fair {
		// A Fair acquisition gets in only when no waiter is registered.
		fair := exclusive(modeKey, "writer-2")
		fair.Fair = true
		h.release(b, h.acquireMode(b, fair))
	}
	if err := m.CancelWait(h.ctx, modeKey, rs.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
}

// Keys of the hierarchy cases: a file set and two of its pages.
const (
	hSet   = "lock/h/set"
	hPage1 = "lock/h/set/p1"
	hPage2 = "lock/h/set/p2"
	hRoot  = "lock/h"
)

// testModesHierarchy: intents on ancestors make a lock below and an
// Exclusive lock above exclude each other, both ways, while Shared locks
// above and below coexist; a Shared lock above excludes an Exclusive one
// below; intents are not holders.
func testModesHierarchy(t *testing.T, h *harness) {
	m := h.openModes("Shared", "Hierarchical")
	b := h.openMore()
	page := func(key, id string, mode backend.Mode) backend.ModeRequest {
		return below(modeReq(key, id, mode), hRoot, hSet)
	}

	// An Exclusive lock above blocks every lock below.
	x := h.acquireMode(m, below(exclusive(hSet, "set-writer"), hRoot))
	h.heldBy(b, page(hPage1, "page-writer", backend.Exclusive), x)
	h.heldBy(b, page(hPage1, "page-reader", backend.Shared), x)
	h.mustHolders(b, hPage1)
	h.release(m, x)

	// A lock below blocks an Exclusive lock above, and a plain Acquire.
	p1 := h.acquireMode(b, page(hPage1, "page-writer", backend.Exclusive))
	held := h.heldBy(m, below(exclusive(hSet, "set-writer"), hRoot), p1)
	if held.Holder.Key != hPage1 {
		t.Errorf("HeldError.Holder.Key for an intent conflict: got %q, want the lock below, %q", held.Holder.Key, hPage1)
	}
	h.heldBy(m, exclusive(hRoot, "root-writer"), p1)
	_, err := m.Acquire(h.ctx, backend.AcquireRequest{Key: hSet, HolderID: "plain", TTL: longTTL})
	var plainHeld *backend.HeldError
	if !errors.As(err, &plainHeld) || !sameLease(plainHeld.Holder, p1) {
		t.Errorf("plain Acquire of a key with an intent: got %v, want ErrHeld naming the lock below, %q term %d", err, p1.Key, p1.Term)
	}
	// An Exclusive lock below also excludes a Shared lock above.
	h.heldBy(m, below(shared(hSet, "set-reader", 0), hRoot), p1)
	// Intents are not holders: not in Get, Holders or List.
	h.mustBeFree(m, hSet)
	h.mustHolders(m, hSet)
	h.sameHolders(`List("lock/h")`, h.list(m, hRoot), p1)
	// A sibling page is independent.
	p2 := h.acquireMode(m, page(hPage2, "page-2-writer", backend.Exclusive))
	h.heldBy(m, below(exclusive(hSet, "set-writer"), hRoot), p1, p2)
	// The intent ends with its lock.
	h.release(b, p1)
	h.heldBy(m, below(exclusive(hSet, "set-writer"), hRoot), p2)
	h.release(m, p2)
	x = h.acquireMode(m, below(exclusive(hSet, "set-writer"), hRoot))
	h.release(m, x)

	// Shared above and Shared below coexist; an Exclusive lock below does
	// not get in under a Shared lock above.
	s := h.acquireMode(m, below(shared(hSet, "set-reader", 0), hRoot))
	sp := h.acquireMode(b, page(hPage1, "page-reader", backend.Shared))
	h.heldBy(b, page(hPage2, "page-writer", backend.Exclusive), s)
	h.release(m, s)
	// Shared locks below let a Shared lock above in, not an Exclusive one.
	s = h.acquireMode(m, below(shared(hSet, "set-reader", 0), hRoot))
	h.heldBy(m, below(exclusive(hSet, "set-writer"), hRoot), sp, s)
	h.release(m, s)
	h.heldBy(m, below(exclusive(hSet, "set-writer"), hRoot), sp)
	// Renewing the lock below keeps its intents.
	if err := b.Renew(h.ctx, sp); err != nil {
		t.Fatalf("Renew of the page lock: %v", err)
	}
	h.heldBy(m, exclusive(hRoot, "root-writer"), sp)
	h.release(b, sp)
	h.release(m, h.acquireMode(m, exclusive(hRoot, "root-writer")))

	// A plain lease above counts as an Exclusive holder.
	pl := h.acquireKey(m, hSet, "plain", longTTL)
	h.heldBy(b, page(hPage1, "page-reader", backend.Shared), pl)
	h.release(m, pl)
}

// testModesAncestorWaiters: an Exclusive waiter on an ancestor blocks new
// non-fair hierarchical locks below it, Exclusive or Shared, at any depth,
// with a HeldError naming the ancestor; it blocks neither keys outside its
// subtree, nor plain Acquire, nor acquisitions without Ancestors, nor Fair
// ones; Shared waiters above do not count; the refused acquirer registers
// on its own key; the rule ends when the waiter withdraws, expires or
// acquires.
func testModesAncestorWaiters(t *testing.T, h *harness) {
	m := h.openModes("Hierarchical", "AncestorWaiters")
	b := h.openMore()
	ms := m.ModeSupport()
	page := func(key, id string, mode backend.Mode) backend.ModeRequest {
		return below(modeReq(key, id, mode), hRoot, hSet)
	}
	// blockedBy expects r to be refused by waiting Exclusive waiters of
	// ancestor alone, with holder (nil: none) as the ancestor's holder.
	blockedBy := func(step string, r backend.ModeRequest, ancestor string, waiting int, holder *backend.Lease) {
		t.Helper()
		held := h.heldMode(b, r)
		if len(held.Holders) != 0 || held.Waiting != waiting || held.Holder.Key != ancestor {
			t.Errorf("%s: AcquireMode(%s): got HeldError Holders %s, Waiting %d, Holder.Key %q; want no holders, Waiting %d, Holder.Key %q (the ancestor with the Exclusive waiter)",
				step, describe(r), recordsString(held.Holders), held.Waiting, held.Holder.Key, waiting, ancestor)
		}
		if holder != nil && !sameLease(held.Holder, *holder) {
			t.Errorf("%s: AcquireMode(%s): got HeldError.Holder %q %q term %d, want the ancestor's oldest holder %q %q term %d",
				step, describe(r), held.Holder.Key, held.Holder.HolderID, held.Holder.Term, holder.Key, holder.HolderID, holder.Term)
		}
		if holder == nil && held.Holder.HolderID != "" {
			t.Errorf("%s: AcquireMode(%s): got HeldError.Holder %q by %q, want a record with only the ancestor's key", step, describe(r), held.Holder.Key, held.Holder.HolderID)
		}
	}

	// A lock below keeps the file-set writer waiting: it registers.
	p1 := h.acquireMode(m, page(hPage1, "page-1", backend.Exclusive))
	writer := below(exclusive(hSet, "set-writer"), hRoot)
	writer.WaitID = "set-writer-wait-1"
	h.heldBy(m, writer, p1)

	// New locks below the file set are refused, at any depth.
	blockedBy("Exclusive page", page(hPage2, "page-2", backend.Exclusive), hSet, 1, nil)
	deep := below(exclusive(hPage2+"/line", "line"), hRoot, hSet, hPage2)
	blockedBy("a lock two levels below", deep, hSet, 1, nil)
	if ms.Shared {
		blockedBy("Shared page", page(hPage2, "page-2-reader", backend.Shared), hSet, 1, nil)
	}
	// A second Exclusive waiter above counts too.
	writer2 := below(exclusive(hSet, "set-writer-2"), hRoot)
	writer2.WaitID = "set-writer-2-wait"
	h.heldBy(m, writer2, p1)
	blockedBy("two writers waiting", page(hPage2, "page-2", backend.Exclusive), hSet, 2, nil)
	if err := m.CancelWait(h.ctx, hSet, writer2.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	blockedBy("one writer withdrew", page(hPage2, "page-2", backend.Exclusive), hSet, 1, nil)
	// With Exclusive waiters on two ancestors, only those of the outermost
	// one count, and the HeldError names that ancestor.
	rootWriter := exclusive(hRoot, "root-writer")
	rootWriter.WaitID = "root-writer-wait"
	h.heldBy(m, rootWriter, p1)
	blockedBy("writers waiting on two ancestors", page(hPage2, "page-2", backend.Exclusive), hRoot, 1, nil)
	if err := m.CancelWait(h.ctx, hRoot, rootWriter.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}

	// Outside the file set's subtree, without Ancestors, by plain Acquire
	// or in a Fair line of its own: not affected.
	h.release(b, h.acquireMode(b, below(exclusive(hRoot+"/other", "other"), hRoot)))
	h.release(b, h.acquireMode(b, exclusive(hPage2, "not-hierarchical")))
	h.release(b, h.acquireKey(b, hPage2, "plain", longTTL))
	if ms.Fair {
		fair := page(hPage2, "fair-page", backend.Exclusive)
		fair.Fair = true
		h.release(b, h.acquireMode(b, fair))
	}

	// The refused acquirer registers on its own key, as any failed
	// acquisition: an Exclusive one blocks a Shared acquisition there.
	p2w := page(hPage2, "page-2", backend.Exclusive)
	p2w.WaitID = "page-2-wait"
	blockedBy("Exclusive page with a WaitID", p2w, hSet, 1, nil)
	if ms.Shared && ms.WriterFirst {
		held := h.heldMode(b, shared(hPage2, "page-2-reader", 0))
		if held.Waiting != 1 {
			t.Errorf("Shared acquisition of the page whose refused acquirer registered: HeldError.Waiting %d, want 1", held.Waiting)
		}
	}
	if err := b.CancelWait(h.ctx, hPage2, p2w.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}

	// Withdrawn, the waiter blocks nobody.
	if err := m.CancelWait(h.ctx, hSet, writer.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	p2 := h.acquireMode(b, page(hPage2, "page-2", backend.Exclusive))
	h.release(b, p2)

	// Shared waiters above do not count (only Fair ones register).
	if ms.Shared && ms.Fair {
		sw := below(shared(hSet, "set-reader", 0), hRoot)
		sw.Fair, sw.WaitID = true, "set-reader-wait"
		h.heldBy(m, sw, p1)
		h.release(b, h.acquireMode(b, page(hPage2, "page-2", backend.Exclusive)))
		if err := m.CancelWait(h.ctx, hSet, sw.WaitID); err != nil {
			t.Fatalf("CancelWait: %v", err)
		}
	}

	// The waiter acquires once the locks below are gone; its success
	// removes the registration; then locks below get in again.
	writer.WaitID = "set-writer-wait-2"
	h.heldBy(m, writer, p1)
	blockedBy("writer registered again", page(hPage2, "page-2", backend.Exclusive), hSet, 1, nil)
	h.release(m, p1)
	x := h.acquireMode(m, writer)
	h.heldBy(b, page(hPage2, "page-2", backend.Exclusive), x)
	h.release(m, x)
	h.release(b, h.acquireMode(b, page(hPage2, "page-2", backend.Exclusive)))

	// With a holder above: a Shared lock on the file set lets Shared pages
	// in until an Exclusive waiter registers; the HeldError then names the
	// file set's holder.
	if ms.Shared {
		s := h.acquireMode(m, below(shared(hSet, "set-reader", 0), hRoot))
		sp := h.acquireMode(b, page(hPage1, "page-1-reader", backend.Shared))
		writer.WaitID = "set-writer-wait-3"
		h.heldBy(m, writer, s, sp)
		blockedBy("Shared page under a Shared file set", page(hPage2, "page-2-reader", backend.Shared), hSet, 1, &s)
		h.release(m, s)
		h.release(b, sp)
		h.release(m, h.acquireMode(m, writer))
	}

	// A waiter that stops re-trying stops blocking after its TTL.
	p1 = h.acquireMode(m, page(hPage1, "page-1", backend.Exclusive))
	writer.WaitID = "set-writer-wait-4"
	writer.TTL = h.env.ShortTTL
	h.heldBy(m, writer, p1)
	blockedBy("writer registered with a short TTL", page(hPage2, "page-2", backend.Exclusive), hSet, 1, nil)
	var p2l backend.Lease
	h.eventually("expiry of the file-set writer's registration", writer.TTL, func() (bool, string) {
		l, err := b.AcquireMode(h.ctx, page(hPage2, "page-2", backend.Exclusive))
		if err != nil {
			if !errors.Is(err, backend.ErrHeld) {
				t.Fatalf("page lock: got %v, want nil or ErrHeld", err)
			}
			return false, fmt.Sprintf("still refused: %v", err)
		}
		p2l = l
		return true, ""
	})
	h.release(b, p2l)
	h.release(m, p1)
}

// testModesIntentExpires: the intents of a lock that expires end with it.
func testModesIntentExpires(t *testing.T, h *harness) {
	m := h.openModes("Hierarchical")
	b := h.openMore()
	r := below(exclusive(hPage1, "crashes"), hRoot, hSet)
	r.TTL = h.env.ShortTTL
	p := h.acquireMode(b, r)
	h.heldBy(m, exclusive(hSet, "set-writer"), p)
	h.heldBy(m, exclusive(hRoot, "root-writer"), p)
	var x backend.Lease
	h.eventually("expiry of the page lock's intents", p.TTL, func() (bool, string) {
		l, err := m.AcquireMode(h.ctx, exclusive(hSet, "set-writer"))
		if err != nil {
			return false, err.Error()
		}
		x = l
		return true, ""
	})
	h.release(m, x)
	h.release(m, h.acquireMode(m, exclusive(hRoot, "root-writer")))
	if err := b.Renew(h.ctx, p); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of the expired page lock: got %v, want ErrLeaseLost", err)
	}
}

// testModesFairOrder: Fair acquisitions are served in registration order:
// with three waiters registered, after a release only the first may
// acquire, then the next; a newcomer without registration waits behind
// them.
func testModesFairOrder(t *testing.T, h *harness) {
	m := h.openModes("Fair")
	x := h.acquireMode(m, exclusive(modeKey, "holder"))
	var ws []backend.ModeRequest
	for i := range 3 {
		w := exclusive(modeKey, fmt.Sprintf("waiter-%d", i))
		w.Fair = true
		w.WaitID = fmt.Sprintf("wait-%d", i)
		h.heldBy(h.openMore(), w, x)
		ws = append(ws, w)
	}
	h.release(m, x)
	newcomer := exclusive(modeKey, "newcomer")
	newcomer.Fair = true
	for round := range ws {
		// Everyone behind the head of the line is refused, last first.
		for i := len(ws) - 1; i > round; i-- {
			held := h.heldMode(m, ws[i])
			if held.Waiting != i-round {
				t.Errorf("round %d: %s: HeldError.Waiting %d, want %d (the waiters ahead)", round, ws[i].HolderID, held.Waiting, i-round)
			}
		}
		held := h.heldMode(m, newcomer)
		if held.Waiting < len(ws)-round {
			t.Errorf("round %d: unregistered newcomer: HeldError.Waiting %d, want >= %d", round, held.Waiting, len(ws)-round)
		}
		l := h.acquireMode(m, ws[round])
		h.mustHolders(m, modeKey, l)
		h.release(m, l)
	}
	h.release(m, h.acquireMode(m, newcomer))

	// A waiter that withdraws or expires gives up its place.
	x = h.acquireMode(m, exclusive(modeKey, "holder"))
	first, second := ws[0], ws[1]
	first.WaitID, second.WaitID = "wait-again-0", "wait-again-1"
	first.TTL = h.env.ShortTTL
	h.heldBy(m, first, x)
	h.heldBy(m, second, x)
	h.release(m, x)
	h.heldMode(m, second)
	var l backend.Lease
	h.eventually("expiry of the first waiter's registration", first.TTL, func() (bool, string) {
		got, err := m.AcquireMode(h.ctx, second)
		if err != nil {
			return false, err.Error()
		}
		l = got
		return true, ""
	})
	h.release(m, l)
	if m.ModeSupport().Shared {
		// Fair Shared acquirers queue too, and share once at the head.
		x = h.acquireMode(m, exclusive(modeKey, "holder"))
		var rs []backend.ModeRequest
		for i := range 2 {
			r := shared(modeKey, fmt.Sprintf("fair-reader-%d", i), 0)
			r.Fair = true
			r.WaitID = fmt.Sprintf("fair-reader-wait-%d", i)
			h.heldBy(m, r, x)
			rs = append(rs, r)
		}
		h.release(m, x)
		h.heldMode(m, rs[1])
		l0 := h.acquireMode(m, rs[0])
		l1 := h.acquireMode(m, rs[1])
		h.mustHolders(m, modeKey, l0, l1)
	}
}

// testModesCancelWaitFair: CancelWait of the head of the line lets the
// next one in at once.
func testModesCancelWaitFair(t *testing.T, h *harness) {
	m := h.openModes("Fair")
	x := h.acquireMode(m, exclusive(modeKey, "holder"))
	var ws []backend.ModeRequest
	for i := range 2 {
		w := exclusive(modeKey, fmt.Sprintf("waiter-%d", i))
		w.Fair, w.WaitID = true, fmt.Sprintf("wait-%d", i)
		h.heldBy(m, w, x)
		ws = append(ws, w)
	}
	h.release(m, x)
	h.heldMode(m, ws[1])
	if err := m.CancelWait(h.ctx, modeKey, ws[0].WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}
	h.release(m, h.acquireMode(m, ws[1]))
	if err := m.CancelWait(h.ctx, modeKey, "never-registered"); err != nil {
		t.Errorf("CancelWait of an unknown registration: got %v, want nil", err)
	}
}

// testModesWatch: releasing an entry notifies the watchers of its key and
// of each of its ancestors with EventReleased (or EventExpired).
func testModesWatch(t *testing.T, h *harness) {
	m := h.openModes("Hierarchical")
	w, ok := backend.Backend(h.openMore()).(backend.Watcher)
	if !ok {
		t.Skip("backend does not implement backend.Watcher")
	}
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	watch := func(k string) <-chan backend.Event {
		ch, err := w.Watch(ctx, k)
		if err != nil {
			t.Fatalf("Watch(%q): %v", k, err)
		}
		return ch
	}
	onKey, onSet, onRoot := watch(hPage1), watch(hSet), watch(hRoot)
	p := h.acquireMode(m, below(exclusive(hPage1, "page-writer"), hRoot, hSet))
	h.release(m, p)
	released := func(e backend.Event) bool {
		return e.Type == backend.EventReleased || e.Type == backend.EventExpired
	}
	for k, ch := range map[string]<-chan backend.Event{hPage1: onKey, hSet: onSet, hRoot: onRoot} {
		waitEvent(t, ch, k, "release of the lock "+hPage1, released)
	}
	if !m.ModeSupport().Shared {
		return
	}
	// A Shared entry's release is seen while another holder remains.
	s1 := h.acquireMode(m, below(shared(hPage1, "r1", 0), hRoot, hSet))
	s2 := h.acquireMode(m, below(shared(hPage1, "r2", 0), hRoot, hSet))
	h.release(m, s1)
	waitEvent(t, onKey, hPage1, "release of one Shared entry", released)
	waitEvent(t, onSet, hSet, "release of one Shared entry below", released)
	h.release(m, s2)
}

// waitEvent waits for an event on ch accepted by want, failing after
// watchBound.
func waitEvent(t *testing.T, ch <-chan backend.Event, key, what string, want func(backend.Event) bool) {
	t.Helper()
	timer := time.NewTimer(watchBound)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatalf("watch of %q, %s: channel closed, want an event", key, what)
			}
			if e.Key != key {
				t.Errorf("watch of %q: got event for key %q", key, e.Key)
			}
			if want(e) {
				return
			}
		case <-timer.C:
			t.Fatalf("watch of %q, %s: no release event within %v", key, what, watchBound)
		}
	}
}

// testModesBounded: once every entry, intent and waiter is released,
// withdrawn or expired, the store returns to its size before (Env.Size),
// and terms still increase.
func testModesBounded(t *testing.T, h *harness) {
	if h.env.Size == nil {
		t.Skip("backendtest: Env.Size is nil: bounded per-key state of Modes is NOT checked for this backend")
	}
	if h.env.Retention > time.Minute && h.env.Advance == nil {
		t.Skipf("backendtest: Env.Retention is %v and Env.Advance is nil: bounded state of Modes is NOT checked", h.env.Retention)
	}
	m := h.openModes()
	ms := m.ModeSupport()
	base := h.env.Size()
	ttl := h.env.ShortTTL
	const keys = 50
	var last uint64
	for i := range keys {
		k := fmt.Sprintf("lock/mb/%d", i)
		k2 := k + "/x"
		anc := []string(nil)
		if ms.Hierarchical {
			anc = []string{"lock/mb", k}
		}
		mode := backend.Exclusive
		if ms.Shared {
			mode = backend.Shared
		}
		// Released at once.
		r := below(modeReq(k2, "a", mode), anc...)
		l := h.acquireMode(m, r)
		last = max(last, l.Term)
		// Left to expire.
		r.TTL = ttl
		if ms.Shared {
			last = max(last, h.acquireMode(m, r).Term)
		}
		// A waiter withdrawn, one left to expire.
		if i == 0 && h.env.Size() <= base {
			t.Fatalf("Size with entries held: got %d, want above the baseline %d", h.env.Size(), base)
		}
		w := exclusive(k2, "w")
		w.TTL, w.WaitID = ttl, "w1"
		h.heldMode(m, w)
		w.WaitID = "w2"
		h.heldMode(m, w)
		if err := m.CancelWait(h.ctx, k2, "w1"); err != nil {
			t.Fatalf("CancelWait: %v", err)
		}
		h.release(m, l)
	}
	h.eventually(fmt.Sprintf("Size back at its baseline %d (TTL %v, retention %v)", base, ttl, h.env.Retention),
		ttl+h.env.Retention, func() (bool, string) {
			size := h.env.Size()
			return size <= base, fmt.Sprintf("Size %d", size)
		})
	if l := h.acquireMode(m, exclusive("lock/mb/0/x", "a")); l.Term <= last {
		t.Errorf("term after the state was dropped: got %d, want > %d", l.Term, last)
	}
}

// testModesContention: of many Shared acquirers of a semaphore on separate
// clients, all at once, exactly Limit win; the others fail with ErrHeld.
func testModesContention(t *testing.T, h *harness) {
	h.openModes("Shared")
	const contenders, limit = 20, 3
	clients := make([]modesClient, contenders)
	for i := range clients {
		clients[i] = h.openMore()
	}
	errs := make(chan error, contenders)
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var won []backend.Lease
	for i, c := range clients {
		wg.Go(func() {
			<-start
			l, err := c.AcquireMode(h.ctx, shared(modeKey, fmt.Sprintf("contender-%02d", i), limit))
			if err == nil {
				mu.Lock()
				won = append(won, l)
				mu.Unlock()
			}
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && !errors.Is(err, backend.ErrHeld) {
			t.Errorf("AcquireMode under contention: got %v, want nil or ErrHeld", err)
		}
	}
	if len(won) != limit {
		t.Fatalf("winners of a semaphore of %d among %d contenders: got %d", limit, contenders, len(won))
	}
	slices.SortFunc(won, func(a, b backend.Lease) int { return cmp.Compare(a.Term, b.Term) })
	h.mustHolders(clients[0], modeKey, won...)
}

// testModesIntentRenewed: renewing a lock below extends its intents with
// it: an Exclusive lock above stays refused for as long as the lock below
// is renewed, beyond its TTL.
func testModesIntentRenewed(t *testing.T, h *harness) {
	m := h.openModes("Hierarchical")
	b := h.openMore()
	untilConclusive(t, func() string { return intentRenewed(t, h, m, b) })
	h.release(m, h.acquireMode(m, exclusive(hRoot, "root-writer")))
}

// intentRenewed is one run of testModesIntentRenewed. It returns "" when
// the locks above stayed refused, or what delayed the run when (in real
// time only) the machine delayed a call beyond the TTL, so that the run
// shows nothing; it fails t otherwise. Each renewal is due one step after
// the previous one began, however long the checks between them took.
func intentRenewed(t *testing.T, h *harness, m, b modesClient) (late string) {
	t.Helper()
	r := below(exclusive(hPage1, "page-writer"), hRoot, hSet)
	r.TTL = h.env.ShortTTL
	sent := time.Now() // when the call that last extended the lease and its intents began
	p := h.acquireMode(b, r)
	// delayed says whether the TTL has passed since sent, in real time: the
	// lease and its intents may then have expired.
	delayed := func() bool { return h.env.Advance == nil && time.Since(sent) >= p.TTL }
	step := p.TTL / 3
	for i := range 5 { // 1⅔ TTLs
		wait := step
		if h.env.Advance == nil {
			wait -= time.Since(sent)
		}
		if wait > 0 {
			h.elapse(wait)
		}
		start := time.Now()
		if err := b.Renew(h.ctx, p); err != nil {
			if delayed() { // the lease lasts at least its TTL from sent
				return fmt.Sprintf("Renew %d returned %v after the previous extension began, beyond the TTL %v (%v)", i+1, time.Since(sent), p.TTL, err)
			}
			t.Fatalf("Renew %d of the page lock: %v", i+1, err)
		}
		sent = start
		for _, above := range []backend.ModeRequest{exclusive(hSet, "set-writer"), exclusive(hRoot, "root-writer")} {
			l, err := m.AcquireMode(h.ctx, above)
			if err == nil && delayed() {
				_ = m.Release(h.ctx, l)
				_ = b.Release(h.ctx, p)
				return fmt.Sprintf("AcquireMode(%s) after renew %d returned %v after the renewal began, beyond the TTL %v", describe(above), i+1, time.Since(sent), p.TTL)
			}
			var held *backend.HeldError
			if !errors.As(err, &held) || !errors.Is(err, backend.ErrHeld) {
				t.Fatalf("AcquireMode(%s) after renew %d, %v after the renewal began: got lease %+v, error %v; want a *HeldError that is ErrHeld", describe(above), i+1, time.Since(sent), l, err)
			}
			h.sameHolders(fmt.Sprintf("HeldError.Holders of AcquireMode(%s)", describe(above)), held.Holders, p)
			if !sameLease(held.Holder, p) {
				t.Errorf("HeldError.Holder of AcquireMode(%s): got %q %q term %d, want %q %q term %d",
					describe(above), held.Holder.Key, held.Holder.HolderID, held.Holder.Term, p.Key, p.HolderID, p.Term)
			}
		}
	}
	h.release(b, p)
	return ""
}

// testModesRestart: a store restart without persistence loses entries,
// intents and waiters like leases: they are reported lost, the keys are
// free, and terms increase when the backend promises it.
func testModesRestart(t *testing.T, h *harness) {
	if h.env.Restart == nil {
		t.Skip("backendtest: Env.Restart is nil: Modes across a store restart are NOT checked for this backend")
	}
	m := h.openModes()
	ms := m.ModeSupport()
	b := h.openMore()
	r := exclusive(hPage1, "page-writer")
	if ms.Hierarchical {
		r = below(r, hRoot, hSet)
	}
	p := h.acquireMode(m, r)
	w := exclusive(hPage1, "waiter")
	w.WaitID = "waiter-1"
	h.heldBy(b, w, p)
	h.env.Restart(true)
	h.reconnect(m)
	h.reconnect(b)
	if err := m.Renew(h.ctx, p); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of an entry the store lost: got %v, want ErrLeaseLost", err)
	}
	if err := m.Release(h.ctx, p); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Release of an entry the store lost: got %v, want ErrLeaseLost", err)
	}
	h.mustHolders(b, hPage1)
	h.mustBeFree(b, hPage1)
	// Neither the intents nor the waiter survived.
	x := h.acquireMode(b, exclusive(hSet, "set-writer"))
	if ms.Fair {
		fair := exclusive(hPage1, "fair")
		fair.Fair = true
		h.release(b, h.acquireMode(b, fair))
	}
	if h.env.TermsSurviveDataLoss && x.Term <= p.Term {
		t.Errorf("term after a restart that lost the data: got %d, want > %d", x.Term, p.Term)
	}
}

// testModesRegisterOnly: an acquisition with RegisterOnly never takes the
// key. It registers (or refreshes) its WaitID as a failed acquisition
// would: on a held key it fails with the same *HeldError; on a key it
// could have taken it fails with ErrRegisteredOnly (not ErrHeld), writing
// no entry and no intent, and the registration it wrote refuses new Shared
// holders (writer preference) and keeps a Fair waiter's place in line;
// refreshed so, it outlives its TTL. Terms still increase.
func testModesRegisterOnly(t *testing.T, h *harness) {
	m := h.openModes("Shared", "WriterFirst")
	b := h.openMore()
	registered := func(r backend.ModeRequest) error {
		t.Helper()
		l, err := b.AcquireMode(h.ctx, r)
		if err == nil {
			t.Fatalf("AcquireMode(%s) with RegisterOnly: got lease %+v, want no lease", describe(r), l)
		}
		return err
	}
	free := func(step string, r backend.ModeRequest) {
		t.Helper()
		err := registered(r)
		if !errors.Is(err, backend.ErrRegisteredOnly) || errors.Is(err, backend.ErrHeld) {
			t.Errorf("%s: AcquireMode(%s) with RegisterOnly on a key it could take: got %v, want ErrRegisteredOnly (not ErrHeld)", step, describe(r), err)
		}
		h.mustHolders(m, r.Key) // nothing taken
	}
	readerRefused := func(step string) {
		t.Helper()
		held := h.heldMode(m, shared(modeKey, "reader", 0))
		if held.Waiting < 1 {
			t.Errorf("%s: Shared acquisition: HeldError.Waiting %d, want >= 1 (the writer registered)", step, held.Waiting)
		}
	}

	// A free key: registered, not taken.
	writer := exclusive(modeKey, "writer")
	writer.WaitID, writer.RegisterOnly = "writer-wait", true
	free("free key", writer)
	readerRefused("registered on a free key")
	if err := b.CancelWait(h.ctx, modeKey, writer.WaitID); err != nil {
		t.Fatalf("CancelWait: %v", err)
	}

	// A held key: the HeldError of a failed attempt, and registered.
	r1 := h.acquireMode(m, shared(modeKey, "reader-1", 0))
	h.heldBy(b, writer, r1)
	readerRefused("registered on a held key")
	h.release(m, r1)
	free("after the release", writer)
	readerRefused("refreshed on a free key")

	// Refreshed so, the registration outlives its TTL.
	writer.TTL = h.env.ShortTTL
	free("short TTL", writer)
	for i := range 5 { // 1⅔ TTLs
		h.elapse(writer.TTL / 3)
		free(fmt.Sprintf("refresh %d", i+1), writer)
		readerRefused(fmt.Sprintf("refresh %d", i+1))
	}

	// The acquisition proper takes the key, with a greater term, and
	// ends the registration.
	writer.RegisterOnly = false
	x := h.acquireMode(b, writer)
	if x.Term <= r1.Term {
		t.Errorf("term %d after RegisterOnly calls, want more than %d", x.Term, r1.Term)
	}
	h.release(b, x)
	h.release(m, h.acquireMode(m, shared(modeKey, "reader-2", 0)))

	if ms := m.ModeSupport(); ms.Hierarchical {
		// No intent is written: the ancestor stays free.
		page := below(exclusive("lock/ro/a/b", "page"), "lock/ro", "lock/ro/a")
		page.WaitID, page.RegisterOnly = "page-wait", true
		free("hierarchical", page)
		h.release(m, h.acquireMode(m, exclusive("lock/ro", "root")))
		if err := b.CancelWait(h.ctx, page.Key, page.WaitID); err != nil {
			t.Fatalf("CancelWait: %v", err)
		}
	}
	if !m.ModeSupport().Fair {
		return
	}
	// Fair: a RegisterOnly call keeps its place in line and is told of
	// the waiters ahead; the first in line is told the key is free.
	x = h.acquireMode(m, exclusive(modeKey, "holder"))
	var ws []backend.ModeRequest
	for i := range 2 {
		w := exclusive(modeKey, fmt.Sprintf("fair-%d", i))
		w.Fair, w.WaitID = true, fmt.Sprintf("fair-wait-%d", i)
		h.heldBy(h.openMore(), w, x)
		ws = append(ws, w)
	}
	h.release(m, x)
	second := ws[1]
	second.RegisterOnly = true
	if held, ok := errors.AsType[*backend.HeldError](registered(second)); !ok || held.Waiting != 1 {
		t.Errorf("second in line, RegisterOnly: got %v, want a *HeldError with Waiting 1", held)
	}
	first := ws[0]
	first.RegisterOnly = true
	free("first in line", first)
	h.heldMode(m, ws[1]) // still behind the first
	l := h.acquireMode(m, ws[0])
	h.release(m, l)
	h.release(m, h.acquireMode(m, ws[1]))
}

// testModesWatchRenewals: on a RenewalWatcher, a renewal of an entry is
// told to the watchers of its key and of each ancestor whose intent it
// extends, as an EventRenewed with the entry's TTL and term; a release
// of one of several Shared entries is told with its own term, so a
// waiter can tell which holder is gone.
func testModesWatchRenewals(t *testing.T, h *harness) {
	m := h.openModes("Shared", "Hierarchical")
	rw, ok := m.(backend.RenewalWatcher)
	if !ok {
		t.Skip("backend does not implement backend.RenewalWatcher")
	}
	const root, page = "lock/wr/a", "lock/wr/a/b"
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	watch := func(k string) <-chan backend.Event {
		ch, err := rw.WatchRenewals(ctx, k, nil)
		if err != nil {
			t.Fatalf("WatchRenewals(%q): %v", k, err)
		}
		return ch
	}
	onPage, onRoot := watch(page), watch(root)
	s1 := h.acquireMode(m, below(shared(page, "s1", 0), root))
	s2 := h.acquireMode(m, below(shared(page, "s2", 0), root))
	// next skips the acquisitions' events.
	next := func(ch <-chan backend.Event, what string) backend.Event {
		t.Helper()
		for {
			if e := nextEvent(t, ch, what, watchBound); e.Type != backend.EventChanged {
				return e
			}
		}
	}
	if err := m.Renew(h.ctx, s2); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	for k, ch := range map[string]<-chan backend.Event{page: onPage, root: onRoot} {
		if e := next(ch, "Renew of "+k); e.Type != backend.EventRenewed || e.TTL != s2.TTL || e.Term != s2.Term || e.Key != k {
			t.Errorf("Renew of an entry, watch of %q: got %+v, want %v of %q with TTL %v and term %d", k, e, backend.EventRenewed, k, s2.TTL, s2.Term)
		}
	}
	h.release(m, s1)
	for k, ch := range map[string]<-chan backend.Event{page: onPage, root: onRoot} {
		if e := next(ch, "Release of "+k); e.Type != backend.EventReleased || e.Term != s1.Term {
			t.Errorf("Release of an entry, watch of %q: got %+v, want %v with term %d", k, e, backend.EventReleased, s1.Term)
		}
	}
	h.release(m, s2)
}
