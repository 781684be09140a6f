package sovereign_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// refusing is a memory backend (with its watch) whose Acquire refuses from
// the time from until the time until, as redisbackend's RestartGuard does
// after a restart: a HeldError with MayBeHeld, no holder, and the
// refusal's length as TTL.
type refusing struct {
	backend.Backend
	w           backend.Watcher
	from, until time.Time
	attempts    atomic.Int32
}

func newRefusing(b *memorybackend.Backend, from, until time.Time) *refusing {
	return &refusing{Backend: b, w: b, from: from, until: until}
}

func (r *refusing) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	r.attempts.Add(1)
	if d := time.Until(r.until); d > 0 && !time.Now().Before(r.from) {
		return backend.Lease{}, &backend.HeldError{Holder: backend.Record{Key: req.Key, TTL: d}, MayBeHeld: true}
	}
	return r.Backend.Acquire(ctx, req)
}

func (r *refusing) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	return r.w.Watch(ctx, key)
}

// ReportsExpiry reports, as the memory backend does, that its watch brings
// every release and expiry (so a follower does not poll the holder).
func (r *refusing) ReportsExpiry() bool { return true }

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
		b := newRefusing(cl, start.Add(released), start.Add(refused))
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
		if n := b.attempts.Load(); n > 4 {
			t.Errorf("%d attempts, want at most 4: the first (held), the one woken by the release (refused), the one when the refusal ended, and a spare", n)
		}
	})
}
