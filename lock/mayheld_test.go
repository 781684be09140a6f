package lock_test

import (
	"context"
	"errors"
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

// Reads are not refused (README, "RestartGuard"): after a restart that lost
// the lease, WaitFree returns at once and Holders lists nobody, while an
// acquisition is refused with MayBeHeld for the guard's time left.
func TestReadsSeeFreeDuringARefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		cl := store.Client()
		defer cl.Close()
		lk, err := lock.New(cl, "w", &lock.Options{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Close()
		held, err := lk.TryAcquire(t.Context(), "job", nil)
		if err != nil {
			t.Fatal(err)
		}
		store.Restart(&memorybackend.RestartOptions{Guard: 10 * time.Second})
		start := time.Now()
		if err := lk.WaitFree(t.Context(), "job"); err != nil {
			t.Fatalf("WaitFree during the refusal: %v", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("WaitFree returned after %v, want at once (it reads the key)", d)
		}
		if hs, err := lk.Holders(t.Context(), "job"); err != nil || len(hs) != 0 {
			t.Errorf("Holders during the refusal: got %v, %v; want none", hs, err)
		}
		var he *lock.HeldError
		if _, err := lk.TryAcquire(t.Context(), "job", nil); !errors.As(err, &he) || !he.MayBeHeld || he.Holder.TTL != 10*time.Second {
			t.Errorf("TryAcquire during the refusal: got %v, want a HeldError with MayBeHeld and 10s left", err)
		}
		<-held.Done() // the restart lost its lease: its holder is told
	})
}
