package backendtest

import (
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

const key = "sovereign-test/election"

// testAcquireAtomic: of 50 contenders on separate clients, exactly one wins
// and the others learn who.
func testAcquireAtomic(t *testing.T, h *harness) {
	const contenders = 50
	clients := make([]backend.Backend, contenders)
	for i := range clients {
		clients[i] = h.open()
	}
	type result struct {
		id    string
		lease backend.Lease
		err   error
	}
	results := make(chan result, contenders)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, b := range clients {
		id := fmt.Sprintf("contender-%02d", i)
		wg.Go(func() {
			<-start
			l, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: key, HolderID: id, TTL: longTTL})
			results <- result{id, l, err}
		})
	}
	close(start)
	wg.Wait()
	close(results)

	var winners []result
	var losers []result
	for r := range results {
		if r.err == nil {
			winners = append(winners, r)
		} else {
			losers = append(losers, r)
		}
	}
	if len(winners) != 1 {
		t.Fatalf("winners: got %d, want exactly 1 (%+v)", len(winners), winners)
	}
	win := winners[0]
	if win.lease.HolderID != win.id || win.lease.Term == 0 || win.lease.Token == "" {
		t.Fatalf("winning lease: got %+v, want holder %q, a term and a token", win.lease, win.id)
	}
	for _, r := range losers {
		if !errors.Is(r.err, backend.ErrHeld) {
			t.Errorf("%s: got error %v, want ErrHeld", r.id, r.err)
			continue
		}
		var held *backend.HeldError
		if !errors.As(r.err, &held) {
			t.Errorf("%s: errors.As(%v, *HeldError) failed", r.id, r.err)
			continue
		}
		if !sameLease(held.Holder, win.lease) {
			t.Errorf("%s: HeldError holder: got %q term %d, want %q term %d",
				r.id, held.Holder.HolderID, held.Holder.Term, win.id, win.lease.Term)
		}
	}
	h.mustHold(clients[0], win.lease)
}

// testHeldError: a failed Acquire doubles as a read of the holder's record.
func testHeldError(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	meta := map[string]string{"addr": "10.0.0.1:8080"}
	la := h.acquire(a, backend.AcquireRequest{Key: key, HolderID: "a", TTL: longTTL, Metadata: meta})
	_, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: key, HolderID: "b", TTL: longTTL})
	var held *backend.HeldError
	if !errors.As(err, &held) || !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Acquire of a held key: got %v, want a *HeldError that is ErrHeld", err)
	}
	rec := held.Holder
	if !sameLease(rec, la) {
		t.Fatalf("HeldError holder: got %+v, want the lease %+v", rec, la)
	}
	if rec.Metadata["addr"] != meta["addr"] {
		t.Errorf("HeldError metadata: got %v, want %v", rec.Metadata, meta)
	}
	if rec.AcquiredAt.IsZero() || rec.TTL <= 0 || rec.TTL > la.TTL {
		t.Errorf("HeldError record: got AcquiredAt %v, TTL %v; want non-zero and 0 < TTL <= %v",
			rec.AcquiredAt, rec.TTL, la.TTL)
	}
	if held.Error() == "" {
		t.Error("HeldError.Error() is empty")
	}
	// The failed attempt changed nothing.
	h.mustHold(b, la)
}

// testWrongLease: Renew and Release act only on the exact lease held; a failed
// Release changes nothing.
func testWrongLease(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	l := h.acquireKey(a, key, "a", longTTL)
	other := h.acquireKey(a, key+"-other", "a", longTTL)
	wrong := map[string]backend.Lease{
		"random token":            {Key: l.Key, HolderID: l.HolderID, Token: backend.NewToken(), Term: l.Term, TTL: l.TTL},
		"token of another lease":  {Key: l.Key, HolderID: l.HolderID, Token: other.Token, Term: l.Term, TTL: l.TTL},
		"wrong holder":            {Key: l.Key, HolderID: "b", Token: l.Token, Term: l.Term, TTL: l.TTL},
		"wrong key":               {Key: key + "-free", HolderID: l.HolderID, Token: l.Token, Term: l.Term, TTL: l.TTL},
		"another key's own lease": {Key: l.Key, HolderID: other.HolderID, Token: other.Token, Term: other.Term, TTL: other.TTL},
	}
	for name, w := range wrong {
		if err := b.Renew(h.ctx, w); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Renew with %s: got %v, want ErrLeaseLost", name, err)
		}
		if err := b.Release(h.ctx, w); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Release with %s: got %v, want ErrLeaseLost", name, err)
		}
		h.mustHold(b, l) // a failed Release changes nothing
	}
	h.mustBeFree(b, key+"-free")
	if err := a.Renew(h.ctx, l); err != nil {
		t.Fatalf("Renew of the real lease: got %v, want nil", err)
	}
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release of the real lease: got %v, want nil", err)
	}
	h.mustBeFree(b, key)
}

// testLostAfterRelease: a released lease can no longer be renewed or released.
func testLostAfterRelease(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	l := h.acquireKey(a, key, "a", longTTL)
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: got %v, want nil", err)
	}
	if err := a.Renew(h.ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew after Release: got %v, want ErrLeaseLost", err)
	}
	if err := a.Release(h.ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("second Release: got %v, want ErrLeaseLost", err)
	}
	h.mustBeFree(a, key)
	lb := h.acquireKey(b, key, "b", longTTL)
	if err := a.Renew(h.ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of a released lease after re-acquisition: got %v, want ErrLeaseLost", err)
	}
	if err := a.Release(h.ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Release of a released lease after re-acquisition: got %v, want ErrLeaseLost", err)
	}
	h.mustHold(a, lb)
}

// testLostAfterExpiry: an expired lease can no longer be renewed or released.
func testLostAfterExpiry(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	l := h.acquireKey(a, key, "a", h.env.ShortTTL)
	h.eventually("lease expiry", l.TTL, h.freeCond(b, key))
	if err := a.Renew(h.ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew after expiry: got %v, want ErrLeaseLost", err)
	}
	h.mustBeFree(b, key) // a failed Renew does not resurrect the lease
	lb := h.acquireKey(b, key, "b", longTTL)
	if err := a.Renew(h.ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of an expired lease after re-acquisition: got %v, want ErrLeaseLost", err)
	}
	if err := a.Release(h.ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Release of an expired lease after re-acquisition: got %v, want ErrLeaseLost", err)
	}
	h.mustHold(b, lb)
}

// testSameHolderID: two processes configured with the same ID never both hold
// the key, and neither can renew or release the other's lease.
func testSameHolderID(t *testing.T, h *harness) {
	p1, p2 := h.open(), h.open()
	l1 := h.acquireKey(p1, key, "same", longTTL)
	if _, err := p2.Acquire(h.ctx, backend.AcquireRequest{Key: key, HolderID: "same", TTL: longTTL}); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("Acquire by a second process with the same ID: got %v, want ErrHeld", err)
	}
	if err := p1.Release(h.ctx, l1); err != nil {
		t.Fatalf("Release: got %v, want nil", err)
	}
	l2 := h.acquireKey(p2, key, "same", longTTL)
	if l2.Token == l1.Token {
		t.Fatalf("token of the second acquisition: got %q again, want a fresh token", l2.Token)
	}
	if err := p1.Renew(h.ctx, l1); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew with the same ID and the old token: got %v, want ErrLeaseLost", err)
	}
	if err := p1.Release(h.ctx, l1); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Release with the same ID and the old token: got %v, want ErrLeaseLost", err)
	}
	h.mustHold(p1, l2)
	if err := p2.Renew(h.ctx, l2); err != nil {
		t.Errorf("Renew of the current lease: got %v, want nil", err)
	}
}

// testTerms: terms strictly increase across release, expiry and
// re-acquisition; renewal keeps the term.
func testTerms(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	var terms []uint64
	check := func(step string, l backend.Lease) {
		t.Helper()
		if n := len(terms); n > 0 && l.Term <= terms[n-1] {
			t.Fatalf("term after %s: got %d, want > %d (terms so far %v)", step, l.Term, terms[n-1], terms)
		}
		terms = append(terms, l.Term)
		if rec := h.get(b, key); rec.Term != l.Term {
			t.Fatalf("Get term after %s: got %d, want %d", step, rec.Term, l.Term)
		}
	}

	l := h.acquireKey(a, key, "a", longTTL)
	check("first acquire", l)
	if err := a.Renew(h.ctx, l); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if rec := h.get(b, key); rec.Term != l.Term {
		t.Fatalf("term after Renew: got %d, want unchanged %d", rec.Term, l.Term)
	}
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l = h.acquireKey(a, key, "a", longTTL) // the same holder again
	check("release and re-acquire by the same holder", l)
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l = h.acquireKey(b, key, "b", h.env.ShortTTL)
	check("release and acquire by another holder", l)
	h.eventually("lease expiry", l.TTL, h.freeCond(a, key))
	l = h.acquireKey(a, key, "a", longTTL)
	check("expiry and re-acquire", l)
	t.Logf("terms: %v", terms)
}

// testExpiry: an unrenewed lease expires after its TTL, not before, and the
// key can then be acquired.
func testExpiry(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	start := time.Now()
	l := h.acquireKey(a, key, "a", h.env.ShortTTL)
	if h.env.Advance != nil {
		h.env.Advance(l.TTL / 2)
		rec := h.get(b, key)
		if !sameLease(rec, l) {
			t.Fatalf("holder halfway through the TTL: got %q term %d, want %q term %d", rec.HolderID, rec.Term, l.HolderID, l.Term)
		}
		if rec.TTL <= 0 || rec.TTL > l.TTL-l.TTL/2 {
			t.Errorf("remaining TTL halfway: got %v, want in (0, %v]", rec.TTL, l.TTL-l.TTL/2)
		}
		h.eventually("lease expiry", l.TTL-l.TTL/2, h.freeCond(b, key))
	} else {
		h.eventually("lease expiry", l.TTL, h.freeCond(b, key))
		elapsed := time.Since(start)
		if elapsed < l.TTL*9/10 {
			t.Errorf("lease expired after %v, want not before its TTL %v", elapsed, l.TTL)
		}
		t.Logf("lease with TTL %v seen expired after %v", l.TTL, elapsed)
	}
	lb := h.acquireKey(b, key, "b", longTTL)
	if lb.Term <= l.Term {
		t.Errorf("term after expiry: got %d, want > %d", lb.Term, l.Term)
	}
	h.mustHold(a, lb)
}

// testRenewExtends: a lease renewed every third of its TTL stays held across
// several TTLs. In real time (no Env.Advance) a loaded machine may delay a
// renewal, or the read after it, past what the TTL allows; such a run
// proves nothing either way, so the case starts over with a new lease
// (untilConclusive) instead of failing. A loss or a short
// remaining TTL that no delay explains fails at once.
func testRenewExtends(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	untilConclusive(t, func() string { return renewExtends(t, h, a, b) })
}

// untilConclusive calls run, which returns "" when it showed what it
// checks, or what delayed it when a loaded machine delayed a call beyond
// what a TTL allows (in real time only), so that the run showed nothing
// either way: run starts over, up to 5 runs in all, and t fails if every
// one was delayed.
func untilConclusive(t *testing.T, run func() (late string)) {
	t.Helper()
	const attempts = 5
	for attempt := 1; ; attempt++ {
		late := run()
		if late == "" {
			return
		}
		if attempt == attempts {
			t.Fatalf("%d runs all delayed beyond the TTL, the last: %s", attempt, late)
		}
		t.Logf("run %d inconclusive, starting over: %s", attempt, late)
	}
}

// renewExtends is one run of testRenewExtends. It returns "" when the lease
// stayed held, or what delayed the run when (in real time only) the
// machine delayed a call too long for the run to show anything; it fails t
// otherwise.
func renewExtends(t *testing.T, h *harness, a, b backend.Backend) (late string) {
	t.Helper()
	sent := time.Now() // when the call that last extended the lease began
	l := h.acquireKey(a, key, "a", h.env.ShortTTL)
	defer func() {
		if late != "" {
			_ = a.Release(h.ctx, l) // the next run starts on a free key
		}
	}()
	// delayed says whether more than d passed since at, in real time.
	delayed := func(at time.Time, d time.Duration) bool {
		return h.env.Advance == nil && time.Since(at) >= d
	}
	step := l.TTL / 3
	const steps = 7 // 2⅓ TTLs
	for i := range steps {
		h.elapse(step)
		start := time.Now()
		if err := a.Renew(h.ctx, l); err != nil {
			// The lease lasts at least its TTL from sent, and Renew reached
			// the store before it returned.
			if delayed(sent, l.TTL) {
				return fmt.Sprintf("Renew %d returned %v after the previous extension began, beyond the TTL %v (%v)", i+1, time.Since(sent), l.TTL, err)
			}
			t.Fatalf("Renew %d after %v: got %v, want nil", i+1, time.Duration(i+1)*step, err)
		}
		rec := h.get(b, key)
		if !sameLease(rec, l) {
			if delayed(start, l.TTL) {
				return fmt.Sprintf("Get after renew %d returned %v after the renewal began, beyond the TTL %v", i+1, time.Since(start), l.TTL)
			}
			t.Fatalf("holder after renew %d: got %q term %d, want %q term %d", i+1, rec.HolderID, rec.Term, l.HolderID, l.Term)
		}
		if rec.TTL > l.TTL {
			t.Fatalf("remaining TTL just after renew %d: got %v, want at most %v", i+1, rec.TTL, l.TTL)
		}
		if rec.TTL <= step {
			// Just after the renewal, more than step remains unless the Get
			// came more than TTL-step after the renewal began.
			if delayed(start, l.TTL-step) {
				return fmt.Sprintf("Get after renew %d returned %v after the renewal began (remaining TTL %v)", i+1, time.Since(start), rec.TTL)
			}
			t.Fatalf("remaining TTL just after renew %d: got %v, want in (%v, %v]", i+1, rec.TTL, step, l.TTL)
		}
		sent = start
	}
	return ""
}

// testRecord: Get returns every field of the record, including the holder's
// heartbeat.
func testRecord(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	if err := a.Heartbeat(h.ctx, key, "a", longTTL); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if err := a.Heartbeat(h.ctx, key, "not-the-holder", longTTL); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	meta := map[string]string{"addr": "10.0.0.1:8080", "version": "1.2.3", "empty": ""}
	req := backend.AcquireRequest{Key: key, HolderID: "a", TTL: longTTL, Metadata: maps.Clone(meta)}
	l := h.acquire(a, req)
	req.Metadata["addr"] = "changed after Acquire"

	rec := h.get(b, key)
	if !sameLease(rec, l) {
		t.Fatalf("record: got key %q holder %q term %d token %q, want %q %q %d %q",
			rec.Key, rec.HolderID, rec.Term, rec.Token, l.Key, l.HolderID, l.Term, l.Token)
	}
	if !maps.Equal(rec.Metadata, meta) {
		t.Errorf("metadata: got %v, want %v", rec.Metadata, meta)
	}
	if rec.AcquiredAt.IsZero() || rec.RenewedAt.IsZero() {
		t.Errorf("AcquiredAt, RenewedAt: got %v, %v; want non-zero", rec.AcquiredAt, rec.RenewedAt)
	}
	if rec.RenewedAt.Before(rec.AcquiredAt) {
		t.Errorf("RenewedAt %v before AcquiredAt %v", rec.RenewedAt, rec.AcquiredAt)
	}
	if rec.TTL <= 0 || rec.TTL > l.TTL {
		t.Errorf("TTL: got %v, want in (0, %v]", rec.TTL, l.TTL)
	}
	if !rec.HasHeartbeat() || rec.HeartbeatAge < 0 || rec.HeartbeatAge > longTTL {
		t.Errorf("heartbeat of the holder: got HeartbeatAt %v, age %v; want the live record", rec.HeartbeatAt, rec.HeartbeatAge)
	}

	// The record in a HeldError carries the same fields.
	_, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: key, HolderID: "b", TTL: longTTL})
	var held *backend.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Acquire of a held key: got %v, want *HeldError", err)
	}
	if hr := held.Holder; !sameLease(hr, l) || !maps.Equal(hr.Metadata, meta) || !hr.HasHeartbeat() || hr.AcquiredAt.IsZero() {
		t.Errorf("HeldError record: got %+v, want the holder's full record with its heartbeat", hr)
	}

	// A renewal moves RenewedAt, not AcquiredAt.
	h.elapse(10 * time.Millisecond)
	if err := a.Renew(h.ctx, l); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	rec2 := h.get(b, key)
	if !rec2.AcquiredAt.Equal(rec.AcquiredAt) {
		t.Errorf("AcquiredAt after Renew: got %v, want unchanged %v", rec2.AcquiredAt, rec.AcquiredAt)
	}
	if rec2.RenewedAt.Before(rec.RenewedAt) {
		t.Errorf("RenewedAt after Renew: got %v, want >= %v", rec2.RenewedAt, rec.RenewedAt)
	}

	// A holder without a heartbeat record has none in its record.
	l2 := h.acquireKey(a, key+"-2", "no-heartbeat", longTTL)
	if rec := h.get(b, l2.Key); rec.HasHeartbeat() {
		t.Errorf("record of a holder without heartbeat: got HeartbeatAt %v, want zero", rec.HeartbeatAt)
	}
}

// testHeartbeats: heartbeat records expire after their own TTL; Members lists
// the live ones sorted by ID; RemoveMember deletes one.
func testHeartbeats(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	short, long := h.env.ShortTTL, 4*h.env.ShortTTL
	l := h.acquireKey(a, key, "b", longTTL)
	for _, hb := range []struct {
		id  string
		ttl time.Duration
	}{{"c", long}, {"b", short}, {"a", long}} {
		if err := a.Heartbeat(h.ctx, key, hb.id, hb.ttl); err != nil {
			t.Fatalf("Heartbeat(%q): %v", hb.id, err)
		}
	}
	members := func() []backend.Member {
		t.Helper()
		ms, err := b.Members(h.ctx, key)
		if err != nil {
			t.Fatalf("Members: %v", err)
		}
		return ms
	}
	ids := func(ms []backend.Member) []string {
		var s []string
		for _, m := range ms {
			s = append(s, m.ID)
		}
		return s
	}
	ms := members()
	if got := fmt.Sprint(ids(ms)); got != "[a b c]" {
		t.Fatalf("Members: got %v, want [a b c]", got)
	}
	for _, m := range ms {
		if m.HeartbeatAt.IsZero() || m.Age < 0 || m.TTL <= 0 {
			t.Errorf("member %q: got HeartbeatAt %v, age %v, TTL %v; want non-zero time, age >= 0, TTL > 0",
				m.ID, m.HeartbeatAt, m.Age, m.TTL)
		}
	}
	if !h.get(b, key).HasHeartbeat() {
		t.Fatal("record of holder b: no heartbeat, want b's live heartbeat")
	}

	h.eventually("expiry of b's heartbeat", short, func() (bool, string) {
		ms := members()
		got := fmt.Sprint(ids(ms))
		return got == "[a c]", got
	})
	if rec := h.get(b, key); rec.HasHeartbeat() || !sameLease(rec, l) {
		t.Errorf("record after the holder's heartbeat expired: got holder %q, HeartbeatAt %v; want %q with no heartbeat",
			rec.HolderID, rec.HeartbeatAt, l.HolderID)
	}

	// A heartbeat refreshes the record.
	before := members()[0]
	h.elapse(10 * time.Millisecond)
	if err := a.Heartbeat(h.ctx, key, "a", long); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if after := members()[0]; after.HeartbeatAt.Before(before.HeartbeatAt) {
		t.Errorf("HeartbeatAt after a refresh: got %v, want >= %v", after.HeartbeatAt, before.HeartbeatAt)
	}

	if err := b.RemoveMember(h.ctx, key, "c"); err != nil {
		t.Fatalf("RemoveMember: %v", err)
	}
	if got := fmt.Sprint(ids(members())); got != "[a]" {
		t.Errorf("Members after RemoveMember(c): got %v, want [a]", got)
	}
	if err := b.RemoveMember(h.ctx, key, "nobody"); err != nil {
		t.Errorf("RemoveMember of a missing record: got %v, want nil", err)
	}
	if ms, err := b.Members(h.ctx, key+"-other"); err != nil || len(ms) != 0 {
		t.Errorf("Members of another key: got %v, %v; want none", ms, err)
	}
}

// testGetFree: Get reports ErrNotHeld for a key that was never held and for a
// released one.
func testGetFree(t *testing.T, h *harness) {
	a := h.open()
	h.mustBeFree(a, key)
	l := h.acquireKey(a, key, "a", longTTL)
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	h.mustBeFree(a, key)
}

// testWatch: a Watcher delivers acquisitions and releases by other clients
// promptly, and closes its channel when the context ends or the backend is
// closed.
func testWatch(t *testing.T, h *harness) {
	w, ok := h.open().(backend.Watcher)
	if !ok {
		t.Skip("backend does not implement backend.Watcher")
	}
	a := h.open()

	// next waits for an event accepted by want.
	next := func(ch <-chan backend.Event, what string, want func(backend.Event) bool) {
		t.Helper()
		start := time.Now()
		for {
			e := nextEvent(t, ch, what, watchBound-time.Since(start))
			if e.Key != key {
				t.Errorf("%s: got event for key %q, want %q", what, e.Key, key)
			}
			if want(e) {
				t.Logf("%s delivered as %v after %v", what, e.Type, time.Since(start))
				return
			}
		}
	}

	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	events, err := w.Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	l := h.acquireKey(a, key, "a", longTTL)
	next(events, "acquire", func(e backend.Event) bool { return e.Type == backend.EventChanged })
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next(events, "release", func(e backend.Event) bool {
		return e.Type == backend.EventReleased || e.Type == backend.EventExpired
	})

	cancel()
	closed := func(ch <-chan backend.Event, what string) {
		t.Helper()
		timer := time.NewTimer(bound)
		defer timer.Stop()
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return
				}
			case <-timer.C:
				t.Fatalf("watch channel still open %v after %s", bound, what)
			}
		}
	}
	closed(events, "the context was cancelled")

	// Closing the backend closes its watch channels.
	events, err = w.Watch(h.ctx, key)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := w.(backend.Backend).Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed(events, "the backend was closed")
}

// nextEvent returns the next event of ch, failing t when none comes within
// d or the channel closes.
func nextEvent(t *testing.T, ch <-chan backend.Event, what string, d time.Duration) backend.Event {
	t.Helper()
	timer := time.NewTimer(max(d, 0))
	defer timer.Stop()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatalf("%s: watch channel closed, want an event", what)
		}
		return e
	case <-timer.C:
		t.Fatalf("%s: no event within %v", what, d)
	}
	return backend.Event{}
}

// testWatchRenewals: a RenewalWatcher's WatchRenewals delivers an
// EventRenewed with the lease's TTL for each renewal (by Renew, and by
// RenewBatch where the backend has it), between the acquisition's and the
// release's events; a plain Watch of the same key delivers none.
func testWatchRenewals(t *testing.T, h *harness) {
	rw, ok := h.open().(backend.RenewalWatcher)
	if !ok {
		t.Skip("backend does not implement backend.RenewalWatcher")
	}
	a := h.open()
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	renewals, err := rw.WatchRenewals(ctx, key, nil)
	if err != nil {
		t.Fatalf("WatchRenewals: %v", err)
	}
	plain, err := rw.(backend.Watcher).Watch(ctx, key)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	next := func(ch <-chan backend.Event, what string) backend.Event {
		t.Helper()
		return nextEvent(t, ch, what, watchBound)
	}
	l := h.acquireKey(a, key, "a", longTTL)
	if e := next(renewals, "acquire"); e.Type != backend.EventChanged {
		t.Errorf("acquire: got %v, want %v", e.Type, backend.EventChanged)
	}
	if err := a.Renew(h.ctx, l); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if e := next(renewals, "Renew"); e.Type != backend.EventRenewed || e.TTL != l.TTL || e.Key != key || e.Term != l.Term {
		t.Errorf("Renew: got %+v, want %v of %q with TTL %v and term %d", e, backend.EventRenewed, key, l.TTL, l.Term)
	}
	if br, ok := a.(backend.BatchRenewer); ok {
		if errs := br.RenewBatch(h.ctx, []backend.Lease{l}); errs[0] != nil {
			t.Fatalf("RenewBatch: %v", errs[0])
		}
		if e := next(renewals, "RenewBatch"); e.Type != backend.EventRenewed || e.TTL != l.TTL {
			t.Errorf("RenewBatch: got %+v, want %v with TTL %v", e, backend.EventRenewed, l.TTL)
		}
	}
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if e := next(renewals, "release"); (e.Type != backend.EventReleased || e.Term != l.Term) && e.Type != backend.EventExpired {
		t.Errorf("release: got %+v, want %v with term %d", e, backend.EventReleased, l.Term)
	}
	// The plain watch: the acquisition, then the release, nothing between.
	if e := next(plain, "acquire (plain Watch)"); e.Type != backend.EventChanged {
		t.Errorf("plain Watch, acquire: got %v, want %v", e.Type, backend.EventChanged)
	}
	if e := next(plain, "release (plain Watch)"); e.Type != backend.EventReleased && e.Type != backend.EventExpired {
		t.Errorf("plain Watch, after the renewals and the release: got %+v, want %v (no renewal events)", e, backend.EventReleased)
	}
}

// testWatchRenewalsMuted: a RenewalMuter's watch delivers no renewal event
// while its Mute is set, and its other events as before; cleared, it
// delivers renewals again once the backend listens to them (a renewal
// published before then may be lost, so the test renews until each watch
// has heard one). Two watches share the Mute, as an elector's watches
// across a re-subscription do. Each phase renews with a TTL of its own,
// which the events carry, so a muted renewal delivered late is told from
// the later ones. First an unmuted watch of the same Backend (same) wants
// the renewals, as a follower in the leader's process does; then only the
// muted watches are left on it. A probe through another Backend tells
// when the muted renewals have been published.
func testWatchRenewalsMuted(t *testing.T, h *harness) {
	rm, ok := h.open().(backend.RenewalMuter)
	if !ok {
		t.Skip("backend does not implement backend.RenewalMuter")
	}
	other := h.open().(backend.RenewalMuter)
	a := h.open()
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	var muted backend.Mute
	muted.Store(true)
	var chs []<-chan backend.Event
	for range 2 {
		ch, err := rm.WatchRenewalsMuted(ctx, key, nil, &muted)
		if err != nil {
			t.Fatalf("WatchRenewalsMuted: %v", err)
		}
		chs = append(chs, ch)
	}
	sameCtx, sameCancel := context.WithCancel(ctx)
	defer sameCancel()
	same, err := rm.WatchRenewalsMuted(sameCtx, key, nil, new(backend.Mute))
	if err != nil {
		t.Fatalf("WatchRenewalsMuted: %v", err)
	}
	probe, err := other.WatchRenewalsMuted(ctx, key, nil, new(backend.Mute))
	if err != nil {
		t.Fatalf("WatchRenewalsMuted: %v", err)
	}
	l := h.acquireKey(a, key, "a", longTTL)
	nextEvent(t, probe, "acquire (probe)", watchBound)
	nextEvent(t, same, "acquire (same Backend)", watchBound)
	for i, ch := range chs {
		if e := nextEvent(t, ch, "acquire", watchBound); e.Type != backend.EventChanged {
			t.Errorf("watch %d, acquire: got %+v, want %v", i, e, backend.EventChanged)
		}
	}
	// renewMuted renews l with ttl by Renew and by RenewBatch, and waits
	// until the probe and, when not nil, same have heard of each.
	renewMuted := func(ttl time.Duration, same <-chan backend.Event) {
		t.Helper()
		l := l
		l.TTL = ttl
		renew := map[string]func() error{"Renew": func() error { return a.Renew(h.ctx, l) }}
		if br, ok := a.(backend.BatchRenewer); ok {
			renew["RenewBatch"] = func() error { return br.RenewBatch(h.ctx, []backend.Lease{l})[0] }
		}
		for _, name := range slices.Sorted(maps.Keys(renew)) {
			if err := renew[name](); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			for what, ch := range map[string]<-chan backend.Event{"probe": probe, "same Backend": same} {
				if ch == nil {
					continue
				}
				if e := nextEvent(t, ch, name+" ("+what+")", watchBound); e.Type != backend.EventRenewed || e.TTL != ttl {
					t.Fatalf("%s, %s: got %+v, want %v with TTL %v", what, name, e, backend.EventRenewed, ttl)
				}
			}
		}
	}
	renewMuted(longTTL, same) // the channel is listened to, for same
	sameCancel()
	for range same { // closed once the watch has ended
	}
	renewMuted(longTTL+time.Second, nil) // nothing of rm wants them
	muted.Store(false)
	// Renew with a third TTL until each watch has heard one: the first
	// event each gets after the acquisition.
	unmuted := l
	unmuted.TTL = longTTL + 2*time.Second
	heard := make([]bool, len(chs))
	deadline := time.Now().Add(watchBound)
	for slices.Contains(heard, false) {
		if time.Now().After(deadline) {
			t.Fatalf("no renewal event %v after the Mute was cleared (heard: %v)", watchBound, heard)
		}
		if err := a.Renew(h.ctx, unmuted); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		for i, ch := range chs {
			if heard[i] {
				continue
			}
			e, ok := pollEvent(ch, 100*time.Millisecond)
			if !ok {
				continue
			}
			heard[i] = true
			if e.Type != backend.EventRenewed || e.TTL != unmuted.TTL || e.Term != l.Term {
				t.Errorf("watch %d, after the muted renewals, the Mute cleared: got %+v, want %v (TTL %v, term %d)", i, e, backend.EventRenewed, unmuted.TTL, l.Term)
			}
		}
	}
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	for i, ch := range chs {
		// More renewals of the last TTL, then the release.
		for {
			e := nextEvent(t, ch, "release", watchBound)
			if e.Type == backend.EventRenewed && e.TTL == unmuted.TTL {
				continue
			}
			if e.Type != backend.EventReleased && e.Type != backend.EventExpired {
				t.Errorf("watch %d, release: got %+v, want %v", i, e, backend.EventReleased)
			}
			break
		}
	}
}

// pollEvent returns the next event of ch if one comes within d. A closed
// channel gives the zero Event.
func pollEvent(ch <-chan backend.Event, d time.Duration) (backend.Event, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case e := <-ch:
		return e, true
	case <-timer.C:
		return backend.Event{}, false
	}
}

// calls returns one closure per method of b, each making a call with valid
// arguments on ctx. l is a lease to renew and release.
func calls(b backend.Backend, ctx context.Context, l backend.Lease) map[string]func() error {
	m := map[string]func() error{
		"Acquire": func() error {
			_, err := b.Acquire(ctx, backend.AcquireRequest{Key: key + "-new", HolderID: "x", TTL: longTTL})
			return err
		},
		"Renew":        func() error { return b.Renew(ctx, l) },
		"Release":      func() error { return b.Release(ctx, l) },
		"Get":          func() error { _, err := b.Get(ctx, l.Key); return err },
		"Heartbeat":    func() error { return b.Heartbeat(ctx, l.Key, "x", longTTL) },
		"Members":      func() error { _, err := b.Members(ctx, l.Key); return err },
		"RemoveMember": func() error { return b.RemoveMember(ctx, l.Key, "x") },
		"SetMetadata":  func() error { return b.SetMetadata(ctx, l, map[string]string{"x": "y"}) },
		"List":         func() error { _, err := b.List(ctx, ""); return err },
	}
	if w, ok := b.(backend.Watcher); ok {
		m["Watch"] = func() error { _, err := w.Watch(ctx, l.Key); return err }
	}
	return m
}

// testCancelled: every method honours an already cancelled context.
func testCancelled(t *testing.T, h *harness) {
	b := h.open()
	l := h.acquireKey(b, key, "a", longTTL)
	ctx, cancel := context.WithCancel(h.ctx)
	cancel()
	for name, call := range calls(b, ctx, l) {
		err := within(t, name+" with a cancelled context", call)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s with a cancelled context: got %v, want an error that is context.Canceled", name, err)
		}
	}
}

// testClosed: every method of a closed backend returns ErrClosed; Close is
// idempotent.
func testClosed(t *testing.T, h *harness) {
	b := h.open()
	l := h.acquireKey(b, key, "a", longTTL)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for name, call := range calls(b, h.ctx, l) {
		err := within(t, name+" after Close", call)
		if !errors.Is(err, backend.ErrClosed) {
			t.Errorf("%s after Close: got %v, want ErrClosed", name, err)
		}
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: got %v, want nil", err)
	}
}

// testInvalid: arguments a backend cannot accept are rejected with ErrInvalid.
func testInvalid(t *testing.T, h *harness) {
	b := h.open()
	ttl := h.env.ShortTTL
	good := backend.Lease{Key: key, HolderID: "a", Token: backend.NewToken(), Term: 1, TTL: ttl}
	lease := func(f func(*backend.Lease)) backend.Lease { l := good; f(&l); return l }
	acq := func(r backend.AcquireRequest) func() error {
		return func() error { _, err := b.Acquire(h.ctx, r); return err }
	}
	cases := []struct {
		name string
		call func() error
	}{
		{"Acquire empty key", acq(backend.AcquireRequest{HolderID: "a", TTL: ttl})},
		{"Acquire empty holder", acq(backend.AcquireRequest{Key: key, TTL: ttl})},
		{"Acquire zero TTL", acq(backend.AcquireRequest{Key: key, HolderID: "a"})},
		{"Acquire negative TTL", acq(backend.AcquireRequest{Key: key, HolderID: "a", TTL: -time.Second})},
		{"Renew empty key", func() error { return b.Renew(h.ctx, lease(func(l *backend.Lease) { l.Key = "" })) }},
		{"Renew empty holder", func() error { return b.Renew(h.ctx, lease(func(l *backend.Lease) { l.HolderID = "" })) }},
		{"Renew empty token", func() error { return b.Renew(h.ctx, lease(func(l *backend.Lease) { l.Token = "" })) }},
		{"Renew zero TTL", func() error { return b.Renew(h.ctx, lease(func(l *backend.Lease) { l.TTL = 0 })) }},
		{"Release empty key", func() error { return b.Release(h.ctx, lease(func(l *backend.Lease) { l.Key = "" })) }},
		{"Release empty holder", func() error { return b.Release(h.ctx, lease(func(l *backend.Lease) { l.HolderID = "" })) }},
		{"Release empty token", func() error { return b.Release(h.ctx, lease(func(l *backend.Lease) { l.Token = "" })) }},
		{"SetMetadata empty key", func() error { return b.SetMetadata(h.ctx, lease(func(l *backend.Lease) { l.Key = "" }), nil) }},
		{"SetMetadata empty holder", func() error { return b.SetMetadata(h.ctx, lease(func(l *backend.Lease) { l.HolderID = "" }), nil) }},
		{"SetMetadata empty token", func() error { return b.SetMetadata(h.ctx, lease(func(l *backend.Lease) { l.Token = "" }), nil) }},
		{"Get empty key", func() error { _, err := b.Get(h.ctx, ""); return err }},
		{"Heartbeat empty key", func() error { return b.Heartbeat(h.ctx, "", "a", ttl) }},
		{"Heartbeat empty ID", func() error { return b.Heartbeat(h.ctx, key, "", ttl) }},
		{"Heartbeat zero TTL", func() error { return b.Heartbeat(h.ctx, key, "a", 0) }},
		{"Members empty key", func() error { _, err := b.Members(h.ctx, ""); return err }},
		{"RemoveMember empty key", func() error { return b.RemoveMember(h.ctx, "", "a") }},
		{"RemoveMember empty ID", func() error { return b.RemoveMember(h.ctx, key, "") }},
	}
	if w, ok := b.(backend.Watcher); ok {
		cases = append(cases, struct {
			name string
			call func() error
		}{"Watch empty key", func() error { _, err := w.Watch(h.ctx, ""); return err }})
	}
	for _, c := range cases {
		if err := c.call(); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", c.name, err)
		}
	}
	h.mustBeFree(b, key)
}

// testConcurrent: many goroutines on several clients renew, read, heartbeat
// and contend at once (run it with -race); no lease is ever held twice.
func testConcurrent(t *testing.T, h *harness) {
	const (
		clients    = 4
		workers    = 8
		iterations = 25
	)
	bs := make([]backend.Backend, clients)
	for i := range bs {
		bs[i] = h.open()
	}
	const shared = key + "-shared"
	var wg sync.WaitGroup
	for i := range workers {
		b := bs[i%clients]
		id := fmt.Sprintf("worker-%d", i)
		wg.Go(func() {
			own, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: key + "-" + id, HolderID: id, TTL: longTTL})
			if err != nil {
				t.Errorf("%s: Acquire of its own key: %v", id, err)
				return
			}
			for range iterations {
				if err := b.Renew(h.ctx, own); err != nil {
					t.Errorf("%s: Renew: %v", id, err)
					return
				}
				if err := b.Heartbeat(h.ctx, shared, id, longTTL); err != nil {
					t.Errorf("%s: Heartbeat: %v", id, err)
					return
				}
				if _, err := b.Members(h.ctx, shared); err != nil {
					t.Errorf("%s: Members: %v", id, err)
					return
				}
				if _, err := b.Get(h.ctx, shared); err != nil && !errors.Is(err, backend.ErrNotHeld) {
					t.Errorf("%s: Get: %v", id, err)
					return
				}
				l, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: shared, HolderID: id, TTL: longTTL})
				if errors.Is(err, backend.ErrHeld) {
					continue
				}
				if err != nil {
					t.Errorf("%s: Acquire: %v", id, err)
					return
				}
				rec, err := b.Get(h.ctx, shared)
				if err != nil || !sameLease(rec, l) {
					t.Errorf("%s: Get while holding term %d: got holder %q term %d, error %v; want itself",
						id, l.Term, rec.HolderID, rec.Term, err)
					return
				}
				if err := b.Release(h.ctx, l); err != nil {
					t.Errorf("%s: Release of its own lease: %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	ms, err := bs[0].Members(h.ctx, shared)
	if err != nil || len(ms) != workers {
		t.Errorf("Members after the run: got %d members, error %v; want %d", len(ms), err, workers)
	}
}

// list returns the records List(prefix) returns, failing on an error.
func (h *harness) list(b backend.Backend, prefix string) []backend.Record {
	h.t.Helper()
	recs, err := b.List(h.ctx, prefix)
	if err != nil {
		h.t.Fatalf("List(%q): got error %v, want nil", prefix, err)
	}
	return recs
}

// keysOf returns the keys of recs, in order.
func keysOf(recs []backend.Record) []string {
	keys := make([]string, 0, len(recs))
	for _, r := range recs {
		keys = append(keys, r.Key)
	}
	return keys
}

// mustList fails unless List(prefix) returns exactly the keys want, in that
// order, and returns the records.
func (h *harness) mustList(b backend.Backend, prefix string, want ...string) []backend.Record {
	h.t.Helper()
	recs := h.list(b, prefix)
	if got := keysOf(recs); !slices.Equal(got, want) {
		h.t.Fatalf("List(%q): got keys %q, want %q", prefix, got, want)
	}
	return recs
}

// testSetMetadata: SetMetadata replaces the metadata of the exact lease
// held, visibly in Get, List and HeldError, without extending the lease; a
// stale or foreign lease gets ErrLeaseLost and changes nothing.
func testSetMetadata(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	orig := map[string]string{"v": "1", "old": "x"}
	l := h.acquire(a, backend.AcquireRequest{Key: key, HolderID: "a", TTL: 4 * h.env.ShortTTL, Metadata: maps.Clone(orig)})
	metadata := func(step string) map[string]string {
		t.Helper()
		rec := h.get(b, key)
		if !sameLease(rec, l) {
			t.Fatalf("Get after %s: got holder %q term %d, want %q term %d", step, rec.HolderID, rec.Term, l.HolderID, l.Term)
		}
		return rec.Metadata
	}

	// Foreign leases change nothing.
	wrong := map[string]backend.Lease{
		"random token": {Key: l.Key, HolderID: l.HolderID, Token: backend.NewToken(), Term: l.Term, TTL: l.TTL},
		"wrong holder": {Key: l.Key, HolderID: "b", Token: l.Token, Term: l.Term, TTL: l.TTL},
	}
	for name, w := range wrong {
		if err := b.SetMetadata(h.ctx, w, map[string]string{"v": "foreign"}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("SetMetadata with %s: got %v, want ErrLeaseLost", name, err)
		}
		if md := metadata("SetMetadata with " + name); !maps.Equal(md, orig) {
			t.Errorf("metadata after SetMetadata with %s: got %v, want unchanged %v", name, md, orig)
		}
	}

	// Let some of the lease's TTL pass, so that an extension would show.
	h.elapse(h.env.ShortTTL)
	before := h.get(b, key)
	if before.TTL >= l.TTL {
		t.Fatalf("remaining TTL %v after it, got %v, want below the granted %v", h.env.ShortTTL, before.TTL, l.TTL)
	}
	md := map[string]string{"v": "2", "new": "y", "empty": ""}
	want := maps.Clone(md)
	if err := a.SetMetadata(h.ctx, l, md); err != nil {
		t.Fatalf("SetMetadata of the held lease: got %v, want nil", err)
	}
	md["v"] = "changed by the caller after SetMetadata"
	after := h.get(b, key)
	if !maps.Equal(after.Metadata, want) {
		t.Errorf("Get metadata after SetMetadata: got %v, want %v (replaced, not merged)", after.Metadata, want)
	}
	if after.TTL > before.TTL {
		t.Errorf("remaining TTL after SetMetadata: got %v, want at most the %v before it (SetMetadata must not extend the lease)",
			after.TTL, before.TTL)
	}
	_, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: key, HolderID: "b", TTL: longTTL})
	var held *backend.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("Acquire of a held key: got %v, want *HeldError", err)
	}
	if !maps.Equal(held.Holder.Metadata, want) {
		t.Errorf("HeldError metadata after SetMetadata: got %v, want %v", held.Holder.Metadata, want)
	}
	if recs := h.mustList(b, key, key); !maps.Equal(recs[0].Metadata, want) {
		t.Errorf("List metadata after SetMetadata: got %v, want %v", recs[0].Metadata, want)
	}

	if err := a.SetMetadata(h.ctx, l, nil); err != nil {
		t.Fatalf("SetMetadata(nil): got %v, want nil", err)
	}
	if md := metadata("SetMetadata(nil)"); len(md) != 0 {
		t.Errorf("metadata after SetMetadata(nil): got %v, want none", md)
	}

	// A released lease: ErrLeaseLost, and the key stays free.
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := a.SetMetadata(h.ctx, l, map[string]string{"v": "stale"}); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("SetMetadata of a released lease: got %v, want ErrLeaseLost", err)
	}
	h.mustBeFree(b, key)
	// ... and once someone else holds the key, its metadata is untouched.
	bmd := map[string]string{"holder": "b"}
	lb := h.acquire(b, backend.AcquireRequest{Key: key, HolderID: "b", TTL: longTTL, Metadata: bmd})
	if err := a.SetMetadata(h.ctx, l, map[string]string{"v": "stale"}); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("SetMetadata of a released lease after re-acquisition: got %v, want ErrLeaseLost", err)
	}
	rec := h.get(a, key)
	if !sameLease(rec, lb) || !maps.Equal(rec.Metadata, bmd) {
		t.Errorf("record after a stale SetMetadata: got holder %q metadata %v, want %q with %v", rec.HolderID, rec.Metadata, lb.HolderID, bmd)
	}
}

// testList: List returns the complete records of the held keys beginning
// with the prefix, sorted by key; keys may contain "/" and ":" (lock keys
// look like "lock/tally:42/x"); an empty prefix lists every held key.
func testList(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	type held struct {
		lease backend.Lease
		md    map[string]string
	}
	leases := map[string]held{}
	// Acquired out of order, so that a backend returning them in
	// acquisition order is caught.
	for i, k := range []string{"lock/tally:42/y", "lock/tally:5", "billing", "lock/tally:42/x", "lock/tally:420", "lock/tally:42"} {
		md := map[string]string{"key": k, "n": fmt.Sprint(i)}
		c := a
		if i%2 == 1 {
			c = b
		}
		l := h.acquire(c, backend.AcquireRequest{Key: k, HolderID: fmt.Sprintf("holder-%d", i), TTL: longTTL, Metadata: maps.Clone(md)})
		leases[k] = held{l, md}
	}
	// Heartbeat records of a holder and of a key nobody holds are not leases.
	if err := a.Heartbeat(h.ctx, "lock/tally:42/x", leases["lock/tally:42/x"].lease.HolderID, longTTL); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if err := a.Heartbeat(h.ctx, "lock/tally:42/z", "someone", longTTL); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}

	recs := h.mustList(b, "lock/tally:42/", "lock/tally:42/x", "lock/tally:42/y")
	for _, rec := range recs {
		want := leases[rec.Key]
		if !sameLease(rec, want.lease) {
			t.Errorf("List record of %q: got holder %q token %q term %d, want %q %q %d",
				rec.Key, rec.HolderID, rec.Token, rec.Term, want.lease.HolderID, want.lease.Token, want.lease.Term)
		}
		if !maps.Equal(rec.Metadata, want.md) {
			t.Errorf("List record of %q: got metadata %v, want %v", rec.Key, rec.Metadata, want.md)
		}
		if rec.TTL <= 0 || rec.TTL > want.lease.TTL {
			t.Errorf("List record of %q: got TTL %v, want in (0, %v]", rec.Key, rec.TTL, want.lease.TTL)
		}
		if rec.AcquiredAt.IsZero() {
			t.Errorf("List record of %q: AcquiredAt is zero", rec.Key)
		}
	}
	h.mustList(b, "lock/tally:42", "lock/tally:42", "lock/tally:42/x", "lock/tally:42/y", "lock/tally:420")
	h.mustList(b, "lock/", "lock/tally:42", "lock/tally:42/x", "lock/tally:42/y", "lock/tally:420", "lock/tally:5")
	h.mustList(b, "billing", "billing")
	h.mustList(b, "lock/tally:42/x/")
	h.mustList(b, "nothing/")
	all := h.mustList(b, "", "billing", "lock/tally:42", "lock/tally:42/x", "lock/tally:42/y", "lock/tally:420", "lock/tally:5")
	for _, rec := range all {
		if want := leases[rec.Key]; !sameLease(rec, want.lease) || !maps.Equal(rec.Metadata, want.md) {
			t.Errorf(`List(""): record of %q: got %+v, want the lease %+v with metadata %v`, rec.Key, rec, want.lease, want.md)
		}
	}
}

// testListLiteral: List matches its prefix byte for byte: glob characters
// ("*", "?", "[", "\") in a prefix have no special meaning.
func testListLiteral(t *testing.T, h *harness) {
	a := h.open()
	var keys []string
	for _, k := range []string{`glob/a*`, `glob/a*b`, `glob/a?`, `glob/a[b]`, `glob/a\b`, `glob/ab`, `glob/abc`, `glob/aXb`, `glob/a\*`} {
		if err := a.ValidateKey(k); err != nil {
			t.Logf("ValidateKey(%q) refuses it (%v): not used", k, err)
			continue
		}
		h.acquireKey(a, k, "a", longTTL)
		keys = append(keys, k)
	}
	accepted := func(ks ...string) []string {
		var out []string
		for _, k := range ks {
			if slices.Contains(keys, k) {
				out = append(out, k)
			}
		}
		return out
	}
	for _, c := range []struct {
		prefix string
		want   []string
	}{
		{`glob/a*`, []string{`glob/a*`, `glob/a*b`}},
		{`glob/a?`, []string{`glob/a?`}},
		{`glob/a[b]`, []string{`glob/a[b]`}},
		{`glob/a[`, []string{`glob/a[b]`}},
		{`glob/a\`, []string{`glob/a\*`, `glob/a\b`}},
		{`glob/a\*`, []string{`glob/a\*`}},
		{`glob/ab`, []string{`glob/ab`, `glob/abc`}},
	} {
		h.mustList(a, c.prefix, accepted(c.want...)...)
	}
}

// testListLive: List lists held leases only: never a heartbeat record, a
// released lease or an expired one.
func testListLive(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	expiring := h.acquireKey(a, "list/expired", "a", h.env.ShortTTL)
	released := h.acquireKey(a, "list/released", "a", longTTL)
	if err := a.Release(h.ctx, released); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l := h.acquireKey(a, "list/held", "a", longTTL)
	for _, hb := range []struct{ key, id string }{
		{"list/held", "a"}, {"list/held", "b"}, {"list/heartbeat-only", "c"}, {"list/released", "a"}, {"list/expired", "a"},
	} {
		if err := b.Heartbeat(h.ctx, hb.key, hb.id, longTTL); err != nil {
			t.Fatalf("Heartbeat(%q, %q): %v", hb.key, hb.id, err)
		}
	}
	h.eventually("expiry of list/expired", expiring.TTL, h.freeCond(b, expiring.Key))
	for _, prefix := range []string{"list/", "list", ""} {
		recs := h.mustList(b, prefix, "list/held")
		if !sameLease(recs[0], l) {
			t.Errorf("List(%q): got holder %q term %d, want %q term %d", prefix, recs[0].HolderID, recs[0].Term, l.HolderID, l.Term)
		}
	}
	h.mustList(b, "list/heartbeat-only")
	h.mustList(b, "list/released")
	h.mustList(b, "list/expired")
}

// testValidateKey: ValidateKey refuses the empty key with ErrInvalid and
// accepts ordinary keys, lock keys included, which can then be used.
func testValidateKey(t *testing.T, h *harness) {
	b := h.open()
	err := b.ValidateKey("")
	if !errors.Is(err, backend.ErrInvalid) {
		t.Errorf(`ValidateKey(""): got %v, want ErrInvalid`, err)
	}
	for _, k := range []string{"billing", "lock/a/b:c", "lock/tally:42/x", "billing-cron.v2"} {
		if err := b.ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q): got %v, want nil", k, err)
			continue
		}
		l := h.acquireKey(b, k, "a", longTTL)
		h.mustHold(b, l)
	}
}

// testMinTTL: MinTTL is positive and a lease of MinTTL can be acquired.
func testMinTTL(t *testing.T, h *harness) {
	b := h.open()
	min := b.MinTTL()
	if min <= 0 {
		t.Fatalf("MinTTL: got %v, want > 0", min)
	}
	l, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: min})
	if err != nil {
		t.Fatalf("Acquire with TTL MinTTL (%v): got %v, want nil", min, err)
	}
	if l.TTL < min || l.Term == 0 || l.Token == "" {
		t.Errorf("lease with TTL MinTTL (%v): got %+v, want TTL >= %v, a term and a token", min, l, min)
	}
	t.Logf("MinTTL %v, granted %v", min, l.TTL)
}

// testNoTakeover: a holder whose heartbeat record is gone, deleted or
// expired, keeps its lease: another Acquire gets ErrHeld and the holder can
// still renew. Only the lease's own TTL ends it.
func testNoTakeover(t *testing.T, h *harness) {
	a, b := h.open(), h.open()
	if err := a.Heartbeat(h.ctx, key, "a", longTTL); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if err := b.Heartbeat(h.ctx, key, "b", longTTL); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	l := h.acquireKey(a, key, "a", longTTL)
	stillHeld := func(how string) {
		t.Helper()
		rec := h.get(b, key)
		if !sameLease(rec, l) || rec.HasHeartbeat() {
			t.Fatalf("record after the holder's heartbeat %s: got holder %q term %d, HeartbeatAt %v; want %q term %d without heartbeat",
				how, rec.HolderID, rec.Term, rec.HeartbeatAt, l.HolderID, l.Term)
		}
		_, err := b.Acquire(h.ctx, backend.AcquireRequest{Key: key, HolderID: "b", TTL: longTTL})
		var held *backend.HeldError
		if !errors.As(err, &held) || !sameLease(held.Holder, l) {
			t.Fatalf("Acquire by another instance after the holder's heartbeat %s: got %v, want ErrHeld naming %q term %d",
				how, err, l.HolderID, l.Term)
		}
		if err := a.Renew(h.ctx, l); err != nil {
			t.Fatalf("Renew after the holder's heartbeat %s: got %v, want nil", how, err)
		}
		h.mustHold(b, l)
	}

	if err := b.RemoveMember(h.ctx, key, "a"); err != nil {
		t.Fatalf("RemoveMember: %v", err)
	}
	stillHeld("was deleted")

	if err := a.Heartbeat(h.ctx, key, "a", h.env.ShortTTL); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	if !h.get(b, key).HasHeartbeat() {
		t.Fatal("record after a new heartbeat: no heartbeat, want the holder's")
	}
	h.eventually("expiry of the holder's heartbeat", h.env.ShortTTL, func() (bool, string) {
		rec := h.get(b, key)
		return !rec.HasHeartbeat(), fmt.Sprintf("heartbeat %v old", rec.HeartbeatAge)
	})
	stillHeld("expired")
}

// testWatchNotify checks backend.WatchNotifier: after every event, and
// after the channel closes, the notify function is called, and a receive
// that does not block then finds the event or the closed channel. The test
// never blocks on the channel itself: it waits for notify, as the elector
// does, so an event delivered without a call (or before its send) is
// never seen and the test fails.
func testWatchNotify(t *testing.T, h *harness) {
	wb := h.open()
	w, ok := wb.(backend.WatchNotifier)
	if !ok {
		t.Skip("backend does not implement backend.WatchNotifier")
	}
	a := h.open()

	calls := make(chan struct{}, 1)
	notify := func() {
		select {
		case calls <- struct{}{}:
		default:
		}
	}
	// next waits for notify calls, each followed by receives that do not
	// block, until one returns an event accepted by want or, when
	// closedOK, finds the channel closed.
	next := func(ch <-chan backend.Event, what string, closedOK bool, want func(backend.Event) bool) {
		t.Helper()
		start := time.Now()
		timer := time.NewTimer(watchBound)
		defer timer.Stop()
		for {
			select {
			case <-calls:
			case <-timer.C:
				t.Fatalf("%s: notify not called within %v after the event was there to receive", what, watchBound)
			}
			for drained := false; !drained; {
				select {
				case e, open := <-ch:
					switch {
					case !open && closedOK:
						t.Logf("%s: channel closed, notified after %v", what, time.Since(start))
						return
					case !open:
						t.Fatalf("%s: watch channel closed, want an event", what)
					case e.Key != key:
						t.Fatalf("%s: got event for key %q, want %q", what, e.Key, key)
					case want != nil && want(e):
						t.Logf("%s delivered as %v, notified after %v", what, e.Type, time.Since(start))
						return
					}
				default:
					drained = true // wait for the next call
				}
			}
		}
	}

	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	events, err := w.WatchNotify(ctx, key, notify)
	if err != nil {
		t.Fatalf("WatchNotify: %v", err)
	}
	l := h.acquireKey(a, key, "a", longTTL)
	next(events, "acquire", false, func(e backend.Event) bool { return e.Type == backend.EventChanged })
	if err := a.Release(h.ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	next(events, "release", false, func(e backend.Event) bool {
		return e.Type == backend.EventReleased || e.Type == backend.EventExpired
	})
	cancel()
	next(events, "the end of the watch's context", true, nil)

	// A subscription broken by the backend's Close.
	events, err = w.WatchNotify(h.ctx, key, notify)
	if err != nil {
		t.Fatalf("WatchNotify: %v", err)
	}
	if err := wb.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	next(events, "the backend's Close", true, nil)
}
