package lock_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// A waiter refused because the store may have lost a lease (MayBeHeld) has
// no holder whose release would wake it: it attempts again when the
// refusal ends, not at its polling period (a third of the TTL). Here the
// holder releases at 2 s, and the store refuses the free key from then
// until 5 s.
func TestWaiterRetriesWhenARefusalEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		other, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: lock.Prefix + "job", HolderID: "z", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cl := store.Client()
		defer cl.Close()
		start := time.Now()
		const released, refused = 2 * time.Second, 5 * time.Second
		b := electortest.NewRefusing(cl, start.Add(released), start.Add(refused))
		lk, err := lock.New(b, "w", &lock.Options{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Close()
		go func() {
			time.Sleep(released)
			_ = raw.Release(context.Background(), other)
		}()
		l, err := lk.Acquire(t.Context(), "job", nil)
		if err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < refused || took > refused+100*time.Millisecond {
			t.Errorf("acquired %v after start, want when the refusal ended (%v, within 100 ms)", took, refused)
		}
		if n := b.Attempts.Load(); n > 4 {
			t.Errorf("%d attempts, want at most 4: the first (held), the one woken by the release (refused), the one when the refusal ended, and a spare", n)
		}
		if err := l.Release(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}
