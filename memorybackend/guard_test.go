package memorybackend_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// RestartOptions.Guard refuses every free key for its length after the
// restart, as redisbackend's RestartGuard does: a HeldError with MayBeHeld,
// no holder, and the time left as TTL; a key still held (KeepLeases) is
// reported with its holder; a reclaim is let through; once the guard ends,
// the key is handed out.
func TestRestartGuard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		b := store.Client()
		defer b.Close()
		ctx := t.Context()
		kept, err := b.Acquire(ctx, backend.AcquireRequest{Key: "kept", HolderID: "a", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		store.Restart(&memorybackend.RestartOptions{KeepLeases: true, Guard: 2 * time.Second})
		time.Sleep(500 * time.Millisecond)

		req := backend.AcquireRequest{Key: "free", HolderID: "b", TTL: time.Second}
		_, err = b.Acquire(ctx, req)
		var held *backend.HeldError
		if !errors.As(err, &held) || !held.MayBeHeld || held.Holder.Key != "free" || held.Holder.HolderID != "" ||
			held.Holder.TTL != 1500*time.Millisecond || len(held.Holders) != 0 {
			t.Fatalf("Acquire during the guard: got %#v, want a HeldError with MayBeHeld, no holder and TTL 1.5s", err)
		}
		_, err = b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: req, Mode: backend.Shared})
		if !errors.As(err, &held) || !held.MayBeHeld || held.Holder.TTL != 1500*time.Millisecond {
			t.Fatalf("AcquireMode during the guard: got %v, want a HeldError with MayBeHeld and TTL 1.5s", err)
		}
		_, err = b.Acquire(ctx, backend.AcquireRequest{Key: "kept", HolderID: "b", TTL: time.Second})
		if !errors.As(err, &held) || held.MayBeHeld || held.Holder.HolderID != "a" || held.Holder.Term != kept.Term {
			t.Fatalf("Acquire of a key still held: got %v, want HELD by %q", err, "a")
		}
		if _, err := b.Get(ctx, "free"); !errors.Is(err, backend.ErrNotHeld) {
			t.Fatalf("Get after the refusals: got %v, want ErrNotHeld", err)
		}
		// A reclaim (the caller's own lease was lost) is let through.
		if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "reclaimed", HolderID: "c", TTL: time.Second, Reclaim: true}); err != nil {
			t.Fatalf("a reclaim during the guard: got %v, want it let through", err)
		}

		time.Sleep(1500 * time.Millisecond)
		l, err := b.Acquire(ctx, req)
		if err != nil {
			t.Fatalf("Acquire once the guard ended: %v", err)
		}
		if l.Term <= kept.Term {
			t.Errorf("term %d, want above %d", l.Term, kept.Term)
		}
		store.Restart(nil) // no guard: a free key is handed out at once
		if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "again", HolderID: "b", TTL: time.Second}); err != nil {
			t.Fatalf("Acquire after a restart without a guard: %v", err)
		}
	})
}
