package lock_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// A job that every replica runs under TryDo at its tick, with MinHold:
// the replica whose tick comes after the job has finished elsewhere finds
// the lock still held (renewed past its TTL) and does not run the job
// again; the lock is released once MinHold has passed, not left to expire.
func TestMinHoldKeepsTheLockAfterTheFunction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a := newLocker(t, client(t, store), "a", fastOpts())
		b := newLocker(t, client(t, store), "b", fastOpts())
		obs := client(t, store)
		const minHold = 10 * time.Second // fastOpts' TTL is 1 s
		job := &lock.AcquireOptions{MinHold: minHold}
		runs := 0
		fn := func(context.Context, *lock.Lock) error { runs++; return nil }
		start := time.Now()
		if err := a.TryDo(t.Context(), "report", job, fn); err != nil {
			t.Fatalf("a's TryDo = %v, want nil", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("TryDo returned after %v of virtual time, want at once (the lock is kept in the background)", d)
		}
		time.Sleep(5 * time.Second) // b's tick, late, after a's job finished
		err := b.TryDo(t.Context(), "report", job, fn)
		var held *lock.HeldError
		if !errors.As(err, &held) || held.Holder.HolderID != "a" {
			t.Fatalf("b's late TryDo = %v, want HeldError with holder a (MinHold not passed)", err)
		}
		if runs != 1 {
			t.Fatalf("the job ran %d times, want once", runs)
		}
		time.Sleep(minHold - 5*time.Second + time.Millisecond)
		synctest.Wait()
		if _, err := obs.Get(t.Context(), backend.LockKeyPrefix+"report"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("just after MinHold: Get err = %v, want ErrNotHeld (released, not left to expire)", err)
		}
		if err := b.TryDo(t.Context(), "report", job, fn); err != nil || runs != 2 {
			t.Errorf("b's TryDo after MinHold = %v (runs %d), want nil and the job's second run", err, runs)
		}
	})
}

// Close releases a lock kept for MinHold at once.
func TestMinHoldEndsWithClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l, err := lock.New(client(t, store), "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		obs := client(t, store)
		lk, err := l.TryAcquire(t.Context(), "report", &lock.AcquireOptions{MinHold: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := lk.Release(t.Context()); err != nil {
			t.Fatalf("Release before MinHold = %v, want nil", err)
		}
		time.Sleep(3 * time.Second)
		if !lk.Held() {
			t.Fatal("not held 3 s after an early Release with MinHold 1m")
		}
		before := time.Now()
		l.Close()
		if d := time.Since(before); d != 0 {
			t.Errorf("Close took %v of virtual time, want none (it ends the wait for MinHold)", d)
		}
		if _, err := obs.Get(t.Context(), backend.LockKeyPrefix+"report"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("after Close: Get err = %v, want ErrNotHeld", err)
		}
	})
}

// MinHold is checked like the other options.
func TestMinHoldOptions(t *testing.T) {
	l := newLocker(t, client(t, memorybackend.NewStore()), "a", fastOpts())
	for _, ao := range []*lock.AcquireOptions{
		{MinHold: -time.Second},
		{MinHold: time.Second, NoRenew: true},
		{MinHold: time.Minute, MaxHold: time.Second},
	} {
		if _, err := l.TryAcquire(t.Context(), "k", ao); !errors.Is(err, lock.ErrInvalidOptions) {
			t.Errorf("TryAcquire with %+v = %v, want ErrInvalidOptions", *ao, err)
		}
	}
}
