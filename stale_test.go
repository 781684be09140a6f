package sovereign_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// staleEvents records the LeaderStale events of an elector.
type staleEvents struct {
	mu  sync.Mutex
	got []sovereign.LeaderStale
}

func (s *staleEvents) attach(e *sovereign.Elector) {
	e.Subscribe(func(ev sovereign.Event) {
		if ls, ok := ev.(sovereign.LeaderStale); ok {
			s.mu.Lock()
			s.got = append(s.got, ls)
			s.mu.Unlock()
		}
	})
}

// terms returns the terms of the LeaderStale events so far.
func (s *staleEvents) terms() []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ts []uint64
	for _, ls := range s.got {
		ts = append(ts, ls.Leader.Term)
	}
	return ts
}

// LeaderStale is published once per leader and term each time its
// heartbeat record goes missing for longer than HeartbeatTTL, and Status
// shows the current state: not again while the record stays missing, no
// longer stale once the record is back, again when it goes missing again,
// and for a new term of the same holder counted afresh from when it was
// first seen missing. (A follower without a watch looks every TTL, 1s.)
func TestLeaderStaleOncePerAbsence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		z1, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cl := store.Client()
		defer cl.Close()
		o := fastOpts() // HeartbeatTTL 6s
		e, err := sovereign.New(noWatch{cl}, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var s staleEvents
		s.attach(e)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		check := func(when string, wantTerms []uint64, wantStale bool) {
			t.Helper()
			synctest.Wait()
			if got := s.terms(); !slices.Equal(got, wantTerms) {
				t.Errorf("%s: LeaderStale for terms %v, want %v", when, got, wantTerms)
			}
			if st := e.Status(); st.LeaderStale != wantStale {
				t.Errorf("%s: Status().LeaderStale = %v (leader %s term %d, for %v), want %v",
					when, st.LeaderStale, st.Leader.HolderID, st.Leader.Term, st.LeaderStaleFor, wantStale)
			}
		}
		time.Sleep(5500 * time.Millisecond)
		check("z's record missing 5.5s", nil, false)
		time.Sleep(10 * time.Second)
		check("z's record missing 15.5s", []uint64{1}, true)

		if err := raw.Heartbeat(t.Context(), "election", "z", time.Hour); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		check("z's record back", []uint64{1}, false)
		if err := raw.RemoveMember(t.Context(), "election", "z"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(8 * time.Second)
		check("z's record missing again for 8s", []uint64{1, 1}, true)

		// z takes a new term: its record, still missing, is counted from now.
		if err := raw.Release(t.Context(), z1); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond)
		if st := e.Status(); st.Leader.Term != 2 {
			t.Fatalf("Status().Leader: got %s term %d, want z term 2", st.Leader.HolderID, st.Leader.Term)
		}
		check("z's term 2 seen", []uint64{1, 1}, false)
		time.Sleep(8 * time.Second)
		check("z's term 2 missing 8s", []uint64{1, 1, 2}, true)
	})
}

// Status reports LeaderStale only for the leader it shows: once the stale
// leader's key is released, Status shows no leader and nothing stale, also
// while this elector's own acquisition is still in flight.
func TestStatusStaleOnlyForTheLeaderShown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		z, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cl := store.Client()
		defer cl.Close()
		h := &hooked{Backend: cl} // watches: looks at a held key every 10 TTLs
		e, err := sovereign.New(h, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(25 * time.Second)
		synctest.Wait()
		if st := e.Status(); !st.LeaderStale || st.Leader.HolderID != "z" {
			t.Fatalf("Status() with z's record missing 25s: got leader %q, stale %v; want z, stale", st.Leader.HolderID, st.LeaderStale)
		}
		hang := make(chan struct{})
		h.set(func(h *hooked) {
			h.onAcquire = func(context.Context, backend.AcquireRequest) { <-hang }
		})
		if err := raw.Release(t.Context(), z); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // a sees the release and attempts; the attempt hangs
		if st := e.Status(); st.Leader.HolderID != "" || st.LeaderStale {
			t.Errorf("Status() after z released: got leader %q, stale %v; want no leader, not stale", st.Leader.HolderID, st.LeaderStale)
		}
		close(hang)
		waitLeader(t, e, time.Second)
	})
}
