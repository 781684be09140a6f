package backendtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// boundedKeys is how many distinct keys BoundedState uses.
const boundedKeys = 1000

// testBounded: per-key state is bounded in time. Keys acquired and
// released, or left to expire, with heartbeat records that expire or are
// removed and watches that end, leave the store's Size back at its baseline
// once the records' TTLs and Env.Retention have passed; terms still increase
// after that.
func testBounded(t *testing.T, h *harness) {
	if h.env.Size == nil {
		t.Skip("backendtest: Env.Size is nil: bounded per-key state is NOT checked for this backend")
	}
	if h.env.Retention > time.Minute && h.env.Advance == nil {
		t.Skipf("backendtest: Env.Retention is %v and Env.Advance is nil: waiting that long in real time is not practical, so bounded per-key state is NOT checked",
			h.env.Retention)
	}
	a, b := h.open(), h.open()
	w, _ := b.(backend.Watcher)
	ttl := h.env.ShortTTL
	base := h.env.Size()
	terms := make(map[string]uint64, boundedKeys)
	var cancels []context.CancelFunc
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	for i := range boundedKeys {
		k := fmt.Sprintf("lock/bounded:%d/x", i)
		if err := a.Heartbeat(h.ctx, k, "a", ttl); err != nil {
			t.Fatalf("Heartbeat(%q): %v", k, err)
		}
		// A record deleted before it expires. Its TTL is ttl too: a store
		// may keep bookkeeping (a member set's TTL) until the deleted
		// record would have expired.
		if err := b.Heartbeat(h.ctx, k, "removed", ttl); err != nil {
			t.Fatalf("Heartbeat(%q): %v", k, err)
		}
		if err := b.RemoveMember(h.ctx, k, "removed"); err != nil {
			t.Fatalf("RemoveMember(%q): %v", k, err)
		}
		if w != nil && i%10 == 0 {
			ctx, cancel := context.WithCancel(h.ctx)
			cancels = append(cancels, cancel)
			if _, err := w.Watch(ctx, k); err != nil {
				t.Fatalf("Watch(%q): %v", k, err)
			}
		}
		if i%2 == 1 { // left to expire
			terms[k] = h.acquireKey(a, k, "a", ttl).Term
			continue
		}
		l := h.acquireKey(a, k, "a", longTTL)
		terms[k] = l.Term
		if i == 0 {
			if size := h.env.Size(); size <= base {
				t.Fatalf("Size with a key held: got %d, want above the baseline %d (does Size count anything?)", size, base)
			}
		}
		if err := a.Release(h.ctx, l); err != nil {
			t.Fatalf("Release(%q): %v", k, err)
		}
	}
	for _, cancel := range cancels {
		cancel()
	}
	t.Logf("Size: %d before, %d after %d keys were used", base, h.env.Size(), boundedKeys)
	h.eventually(fmt.Sprintf("Size back at its baseline %d (TTL %v, retention %v)", base, ttl, h.env.Retention),
		ttl+h.env.Retention, func() (bool, string) {
			size := h.env.Size()
			return size <= base, fmt.Sprintf("Size %d", size)
		})

	// Terms still increase for keys the store has forgotten.
	for _, i := range []int{0, 1, boundedKeys - 1} {
		k := fmt.Sprintf("lock/bounded:%d/x", i)
		if l := h.acquireKey(a, k, "a", longTTL); l.Term <= terms[k] {
			t.Errorf("term of %q after its state was dropped: got %d, want > %d", k, l.Term, terms[k])
		}
	}
}

// testRestart: clients keep working across a restart of the store. Without
// data loss leases survive, terms increase, and a watch open across the
// restart is closed, gets EventReset, or goes on delivering changes. With
// data loss such a watch is closed or gets EventReset, a lost lease is
// reported lost (a Renew never recreates it), the key is free, and terms
// increase when the backend promises it (Env.TermsSurviveDataLoss).
func testRestart(t *testing.T, h *harness, loseData bool) {
	if h.env.Restart == nil {
		t.Skip("backendtest: Env.Restart is nil: behaviour across a store restart is NOT checked for this backend")
	}
	a, b := h.open(), h.open()
	w, _ := h.open().(backend.Watcher)

	var terms []uint64 // every term handed out for key before the restart
	for range 3 {
		l := h.acquireKey(a, key, "a", longTTL)
		terms = append(terms, l.Term)
		if err := a.Release(h.ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	l := h.acquireKey(a, key, "a", longTTL)
	terms = append(terms, l.Term)
	last := slices.Max(terms)
	if err := a.Heartbeat(h.ctx, key, "a", longTTL); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	var (
		events <-chan backend.Event
		calls  chan struct{} // notify's calls, when w is a backend.WatchNotifier
	)
	if n, ok := w.(backend.WatchNotifier); ok {
		// The break must be notified too: a receiver that waits for
		// notifications would otherwise never learn of it.
		calls = make(chan struct{}, 1)
		var err error
		if events, err = n.WatchNotify(h.ctx, key, func() {
			select {
			case calls <- struct{}{}:
			default:
			}
		}); err != nil {
			t.Fatalf("WatchNotify: %v", err)
		}
	} else if w != nil {
		var err error
		if events, err = w.Watch(h.ctx, key); err != nil {
			t.Fatalf("Watch: %v", err)
		}
	}

	h.env.Restart(loseData)

	if w != nil && loseData {
		// The lease vanished without an event: the watch must say that it
		// may have missed changes.
		if calls != nil {
			h.resetOrClosedNotified(events, calls)
		} else {
			h.resetOrClosed(events, nil)
		}
	}
	h.reconnect(a)
	h.reconnect(b)
	if w != nil {
		h.reconnect(w.(backend.Backend))
	}

	var lb backend.Lease
	if loseData {
		h.mustBeFree(b, key)
		if err := a.Renew(h.ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("Renew of a lease the store lost: got %v, want ErrLeaseLost", err)
		}
		if err := a.SetMetadata(h.ctx, l, map[string]string{"x": "y"}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("SetMetadata of a lease the store lost: got %v, want ErrLeaseLost", err)
		}
		h.mustBeFree(b, key) // the failed calls recreated nothing
		if ms, err := b.Members(h.ctx, key); err != nil || len(ms) != 0 {
			t.Errorf("Members after a restart that lost the data: got %v, %v; want none", ms, err)
		}
		lb = h.acquireKey(b, key, "b", longTTL)
		switch {
		case h.env.TermsSurviveDataLoss && lb.Term <= last:
			t.Errorf("term after a restart that lost the data: got %d, want > %d (terms before: %v)", lb.Term, last, terms)
		case !h.env.TermsSurviveDataLoss:
			t.Logf("term after a restart that lost the data: %d (terms before: %v; Env.TermsSurviveDataLoss is false, so not checked)",
				lb.Term, terms)
		}
	} else {
		h.mustHold(b, l)
		if err := a.Renew(h.ctx, l); err != nil {
			t.Fatalf("Renew after a restart that kept the data: got %v, want nil", err)
		}
		if rec := h.get(b, key); !rec.HasHeartbeat() {
			t.Errorf("record after a restart that kept the data: no heartbeat, want the holder's")
		}
		if err := a.Release(h.ctx, l); err != nil {
			t.Fatalf("Release after a restart that kept the data: got %v, want nil", err)
		}
		if w != nil {
			// Nothing was lost, so a watch that resumed without missing a
			// change may simply go on; but it must not go silent.
			h.resetOrClosed(events, func(e backend.Event) bool {
				return e.Type == backend.EventReleased || e.Type == backend.EventExpired
			})
		}
		lb = h.acquireKey(b, key, "b", longTTL)
		if lb.Term <= last {
			t.Errorf("term after a restart that kept the data: got %d, want > %d (terms before: %v)", lb.Term, last, terms)
		}
	}

	// A new watch works.
	if w != nil {
		events, err := w.Watch(h.ctx, key)
		if err != nil {
			t.Fatalf("Watch after the restart: %v", err)
		}
		if err := b.Release(h.ctx, lb); err != nil {
			t.Fatalf("Release: %v", err)
		}
		timer := time.NewTimer(watchBound)
		defer timer.Stop()
		for done := false; !done; {
			select {
			case e, ok := <-events:
				if !ok {
					t.Fatal("watch opened after the restart: channel closed, want the release")
				}
				done = e.Type == backend.EventReleased || e.Type == backend.EventExpired
			case <-timer.C:
				t.Fatalf("watch opened after the restart: no release event within %v", watchBound)
			}
		}
	}
}

// resetOrClosed waits until events, a watch open across a restart, is
// closed, delivers EventReset, or delivers an event accepted by also (when
// not nil), ignoring other events; it fails the test if none of that happens
// within bound.
func (h *harness) resetOrClosed(events <-chan backend.Event, also func(backend.Event) bool) {
	h.t.Helper()
	start := time.Now()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-events:
			switch {
			case !ok:
				h.t.Logf("watch closed %v after the restart", time.Since(start))
				return
			case e.Type == backend.EventReset:
				h.t.Logf("watch delivered EventReset %v after the restart", time.Since(start))
				return
			case also != nil && also(e):
				h.t.Logf("watch went on across the restart: delivered %v", e.Type)
				return
			}
		case <-timer.C:
			if also != nil {
				h.t.Fatalf("watch open across a restart: neither closed, nor EventReset, nor the next change within %v", bound)
			}
			h.t.Fatalf("watch open across a restart that lost data: neither closed nor EventReset within %v", bound)
		}
	}
}

// resetOrClosedNotified is resetOrClosed for a subscription made with
// WatchNotify: it waits for notify's calls (on calls) and only then receives
// from events, without blocking, so an EventReset or a close that is not
// notified is never seen.
func (h *harness) resetOrClosedNotified(events <-chan backend.Event, calls <-chan struct{}) {
	h.t.Helper()
	start := time.Now()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case <-calls:
		case <-timer.C:
			h.t.Fatalf("watch made with WatchNotify, open across a restart that lost data: neither closed nor EventReset, with a notify call, within %v", bound)
		}
		for drained := false; !drained; {
			select {
			case e, ok := <-events:
				switch {
				case !ok:
					h.t.Logf("watch closed and notified %v after the restart", time.Since(start))
					return
				case e.Type == backend.EventReset:
					h.t.Logf("watch delivered EventReset, notified, %v after the restart", time.Since(start))
					return
				}
			default:
				drained = true
			}
		}
	}
}

// reconnect waits until b answers a Get (with a record or ErrNotHeld), so
// that a client may fail a call or two while it reconnects after a restart.
func (h *harness) reconnect(b backend.Backend) {
	h.t.Helper()
	deadline := time.Now().Add(bound)
	for {
		_, err := b.Get(h.ctx, key)
		if err == nil || errors.Is(err, backend.ErrNotHeld) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("Get after the restart: still %v after %v", err, bound)
		}
		timer := time.NewTimer(pollInterval)
		select {
		case <-timer.C:
		case <-h.ctx.Done():
			timer.Stop()
			h.t.Fatalf("Get after the restart: %v (last error %v)", h.ctx.Err(), err)
		}
	}
}
