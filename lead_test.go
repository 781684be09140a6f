package sovereign_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// waitLeader waits (virtually) until e leads; it fails t after limit.
func waitLeader(t *testing.T, e *sovereign.Elector, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !e.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not leader within %v", e.ID(), limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// events records an elector's events with the time each was published.
type events struct {
	mu  sync.Mutex
	evs []sovereign.Event
	at  []time.Time
}

func (r *events) attach(e *sovereign.Elector) {
	e.Subscribe(func(ev sovereign.Event) {
		r.mu.Lock()
		r.evs = append(r.evs, ev)
		r.at = append(r.at, time.Now())
		r.mu.Unlock()
	})
}

// lost returns the first LeadershipLost event and when it was delivered.
func (r *events) lost() (sovereign.LeadershipLost, time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, ev := range r.evs {
		if l, ok := ev.(sovereign.LeadershipLost); ok {
			return l, r.at[i], true
		}
	}
	return sovereign.LeadershipLost{}, time.Time{}, false
}

// When the leader function returns an error, the term ends with reason
// ReasonReturned and the LeadershipLost event carries that error.
func TestLeaderFunctionErrorInLeadershipLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := memorybackend.NewStore().Client()
		defer cl.Close()
		e, err := sovereign.New(cl, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		var rec events
		rec.attach(e)
		mine := errors.New("test: leader work failed")
		ctx, cancel := context.WithCancel(t.Context())
		fail, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			_ = e.Run(ctx, func(context.Context) error { <-fail; return mine })
		}()
		waitLeader(t, e, 2*time.Second)
		close(fail)
		synctest.Wait()
		cancel()
		<-done
		l, _, ok := rec.lost()
		if !ok {
			t.Fatal("no LeadershipLost event")
		}
		if l.Reason != sovereign.ReasonReturned || !errors.Is(l.Err, mine) {
			t.Errorf("LeadershipLost reason %v err %v, want ReasonReturned with the function's error", l.Reason, l.Err)
		}
	})
}

// Renewals are answers of the backend: a leader whose heartbeats fail but
// whose renewals succeed is healthy, however long that lasts.
func TestRenewalsCountAsBackendContact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := memorybackend.NewStore().Client()
		defer cl.Close()
		h := &hooked{Backend: cl}
		e, err := sovereign.New(h, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, e, 2*time.Second)
		h.set(func(h *hooked) {
			h.onHB = func(context.Context) (error, bool) { return errors.New("test: heartbeat refused"), true }
		})
		time.Sleep(5 * time.Second) // 5 TTLs: the limit is 3
		if !e.IsLeader() {
			t.Fatal("stepped down while renewals succeed")
		}
		if err := e.Check(time.Second); err != nil {
			t.Errorf("Check of a leader renewing for 5 TTLs with failing heartbeats: got %v, want nil", err)
		}
		h.set(func(h *hooked) { h.onHB = nil })
	})
}

// Once the lease is released, the elector knows nobody leads: it publishes
// LeaderChanged with an empty record after its LeadershipLost, also on a
// backend without watches (no EventReleased tells it).
func TestLeaderRecordClearedAfterRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := memorybackend.NewStore().Client()
		defer cl.Close()
		noWatch := struct{ backend.Backend }{cl}
		e, err := sovereign.New(noWatch, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var rec events
		rec.attach(e)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, e, 2*time.Second)
		if err := e.Resign(t.Context()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		synctest.Wait() // within the sit-out: the elector does not campaign yet
		rec.mu.Lock()
		defer rec.mu.Unlock()
		seenLost, cleared := false, false
		for _, ev := range rec.evs {
			switch ev := ev.(type) {
			case sovereign.LeadershipLost:
				seenLost = true
			case sovereign.LeaderChanged:
				if seenLost && ev.Leader.HolderID == "" {
					cleared = true
				}
			}
		}
		if !cleared {
			t.Errorf("events after Resign: %v; want LeaderChanged with an empty record after LeadershipLost", rec.evs)
		}
	})
}

// watchTap is a backend whose watches are channels the test sends on (no
// event of the store reaches them).
type watchTap struct {
	backend.Backend
	mu sync.Mutex
	ch chan backend.Event // the latest watch's; nil once its context ended
}

func (w *watchTap) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	ch := make(chan backend.Event, 16)
	w.mu.Lock()
	w.ch = ch
	w.mu.Unlock()
	context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.ch == ch {
			w.ch = nil
		}
		close(ch)
	})
	return ch, nil
}

func (w *watchTap) send(t *testing.T, typ backend.EventType) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		t.Fatal("no watch established")
	}
	w.ch <- backend.Event{Type: typ}
}

// A leader that sees someone else's acquisition (EventChanged) or a
// re-established connection (EventReset) renews at once: the store may
// have lost its lease, and the renewal finds out within a round trip
// instead of at the next periodic one.
func TestLeaderRenewsOnAWatchEvent(t *testing.T) {
	for _, typ := range []backend.EventType{backend.EventChanged, backend.EventReset} {
		t.Run(typ.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cl := memorybackend.NewStore().Client()
				defer cl.Close()
				w := &watchTap{Backend: cl}
				e, err := sovereign.New(w, "election", "a", fastOpts()) // renewals every 500ms
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if err := e.Start(t.Context()); err != nil {
					t.Fatal(err)
				}
				waitLeader(t, e, 2*time.Second)
				time.Sleep(250 * time.Millisecond) // between two renewals
				synctest.Wait()
				before := cl.Calls()["Renew"]
				w.send(t, typ)
				synctest.Wait()
				if got := cl.Calls()["Renew"] - before; got != 1 {
					t.Errorf("renewals sent at once on %v: got %d, want 1", typ, got)
				}
			})
		})
	}
}

// A leader's calls are cut at its renew deadline: a heartbeat that hangs
// does not delay the step-down (the LeadershipLost event) past the
// deadline, though RequestTimeout would let it run longer.
func TestHungHeartbeatDoesNotDelayTheStepDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := memorybackend.NewStore().Client()
		defer cl.Close()
		h := &hooked{Backend: cl}
		opts := fastOpts() // RenewDeadline 700ms
		opts.RequestTimeout = 600 * time.Millisecond
		e, err := sovereign.New(h, "election", "a", opts)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var rec events
		rec.attach(e)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, e, 2*time.Second)
		time.Sleep(time.Second)
		hang := func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }
		h.set(func(h *hooked) {
			h.onRenew = func(context.Context, backend.Lease) (error, bool) { return errors.New("test: renewal refused"), true }
			h.onHB = func(ctx context.Context) (error, bool) { return hang(ctx), true }
		})
		deadline := e.Status().Deadline
		time.Sleep(2 * time.Second)
		l, at, ok := rec.lost()
		if !ok {
			t.Fatal("no LeadershipLost within 2s of the renewals failing")
		}
		if l.Reason != sovereign.ReasonDeadline || !at.Equal(deadline) {
			t.Errorf("LeadershipLost (%v) %v after the deadline, want ReasonDeadline at the deadline", l.Reason, at.Sub(deadline))
		}
		h.set(func(h *hooked) { h.onRenew, h.onHB = nil, nil })
	})
}

// A new leader's deadline counts from the send time of its acquisition,
// not from when the answer (and its verification) came back.
func TestLeaderDeadlineCountsFromTheAcquisitionSend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := memorybackend.NewStore().Client()
		defer cl.Close()
		cl.SetLatency(50 * time.Millisecond)
		h := &hooked{Backend: cl}
		var (
			mu   sync.Mutex
			sent []time.Time
		)
		h.set(func(h *hooked) {
			h.onAcquire = func(context.Context, backend.AcquireRequest) {
				mu.Lock()
				sent = append(sent, time.Now())
				mu.Unlock()
			}
		})
		e, err := sovereign.New(h, "election", "a", fastOpts()) // RenewDeadline 700ms
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, e, 2*time.Second)
		dl := e.Status().Deadline
		mu.Lock()
		defer mu.Unlock()
		if len(sent) == 0 {
			t.Fatal("no acquisition seen")
		}
		if d := dl.Sub(sent[len(sent)-1]); d != 700*time.Millisecond {
			t.Errorf("deadline %v after the acquisition was sent (its answer took 50ms), want RenewDeadline, 700ms", d)
		}
	})
}
