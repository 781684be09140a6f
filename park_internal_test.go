package sovereign

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// A release that comes while the follower's loop decides to park (after it
// looked at its watch and found nothing) is not lost: its notification
// makes the loop look again, and the follower takes over at once rather
// than at its next scheduled look, TTLs later.
func TestWakeWhileParkingIsNotLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, b := store.Client(), store.Client()
		defer a.Close()
		defer b.Close()
		lease, err := a.Acquire(context.Background(), backend.AcquireRequest{Key: "election", HolderID: "other", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(b, "election", "follower", &Options{TTL: time.Second, NoStartupJitter: true, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		var (
			once     sync.Once
			released time.Time
		)
		testHookBlock = func(he *Elector) {
			if he != e || !e.w.notified || e.State() != Follower {
				return
			}
			once.Do(func() {
				// The machine has polled its inputs and found none; the
				// release's event and notification come now.
				if err := a.Release(context.Background(), lease); err != nil {
					t.Errorf("Release: %v", err)
				}
				released = time.Now()
			})
		}
		defer func() { testHookBlock = nil }()
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if released.IsZero() {
			t.Fatal("the follower never came to wait with its watch established")
		}
		if !e.IsLeader() {
			t.Fatalf("state %v 1ms after the release, want Leader (the notification of a release while parking was lost)", e.State())
		}
		if d := time.Since(released); d > time.Millisecond {
			t.Errorf("took over %v after the release, want at once", d)
		}
	})
}
