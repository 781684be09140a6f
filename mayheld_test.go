package sovereign_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// A candidate refused because the store may have lost a lease (MayBeHeld)
// has no holder whose release or expiry its watch would bring: it attempts
// again when the refusal ends, not at its rare look while watching (ten
// TTLs), and without polling meanwhile. Here it follows a holder with its
// watch up; the holder releases at 2 s, and the store refuses the free key
// from then until 5 s.
func TestCandidateRetriesWhenARefusalEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		other, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cl := store.Client()
		defer cl.Close()
		start := time.Now()
		const released, refused = 2 * time.Second, 5 * time.Second
		b := electortest.NewRefusing(cl, start.Add(released), start.Add(refused))
		e, err := sovereign.New(b, "election", "e1", &sovereign.Options{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		led := make(chan time.Time, 1)
		e.Subscribe(func(ev sovereign.Event) {
			if _, ok := ev.(sovereign.LeadershipAcquired); ok {
				select {
				case led <- time.Now():
				default:
				}
			}
		})
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		time.Sleep(released)
		if err := raw.Release(t.Context(), other); err != nil {
			t.Fatal(err)
		}
		var at time.Time
		select {
		case at = <-led:
		case <-time.After(time.Minute):
			t.Fatal("no leadership within a minute of virtual time")
		}
		if took := at.Sub(start); took < refused || took > refused+100*time.Millisecond {
			t.Errorf("led %v after start, want when the refusal ended (%v, within 100 ms)", took, refused)
		}
		if n := b.Attempts.Load(); n > 4 {
			t.Errorf("%d attempts, want at most 4: the first (held), the one woken by the release (refused), the one when the refusal ended, and a spare", n)
		}
	})
}
