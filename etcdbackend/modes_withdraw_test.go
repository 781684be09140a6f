package etcdbackend_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// withdrawalRace sets up a registered Exclusive waiter on "k" (held
// Shared by another Backend) next to an entry of b on the same session,
// runs refresh (a retry of the waiter) once at the given stage of a
// withdrawal of the registration as due, then renews b's entry (its
// orphan sweep runs) and reports whether the registration still refuses
// a Shared reader (writer preference).
func withdrawalRace(t *testing.T, stage string) {
	ctx := testCtx(t)
	b, other := modesPair(t, nil, nil)
	held, err := other.AcquireMode(ctx, modeRequest("k", "other", backend.Shared))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := b.AcquireMode(ctx, modeRequest("keep", "h", backend.Exclusive))
	if err != nil {
		t.Fatal(err)
	}
	w := modeRequest("k", "waiter", backend.Exclusive)
	w.WaitID = "wait"
	if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	var once sync.Once
	ran := false
	etcdbackend.OnWithdrawal(b, func(s string) {
		if s != stage {
			return
		}
		once.Do(func() {
			ran = true
			// The waiter's retry, within its TTL.
			if _, err := b.AcquireMode(ctx, w); !errors.Is(err, backend.ErrHeld) {
				t.Errorf("the waiter's retry during the withdrawal: got %v, want ErrHeld", err)
			}
		})
	})
	etcdbackend.ExpireRegistrations(b, time.Now().Add(w.TTL))
	etcdbackend.OnWithdrawal(b, nil)
	if !ran {
		t.Fatalf("the withdrawal never reached stage %q", stage)
	}
	for i, err := range b.RenewBatch(ctx, []backend.Lease{keep}) {
		if err != nil {
			t.Errorf("RenewBatch, lease %d: %v", i, err)
		}
	}
	var he *backend.HeldError
	l, err := other.AcquireMode(ctx, modeRequest("k", "reader", backend.Shared))
	if err == nil {
		_ = other.Release(ctx, l)
	}
	if !errors.As(err, &he) || he.Waiting != 1 {
		t.Errorf("Shared reader after the waiter's retry: got %v, want a HeldError with Waiting 1 (the retry keeps the waiter registered)", err)
	}
	if err := b.CancelWait(ctx, "k", w.WaitID); err != nil {
		t.Error(err)
	}
	for _, x := range []struct {
		b *etcdbackend.Backend
		l backend.Lease
	}{{b, keep}, {other, held}} {
		if err := x.b.Release(ctx, x.l); err != nil {
			t.Error(err)
		}
	}
}

// TestModesRetryDuringWithdrawal: a waiter's retry whose read-only probe
// finds its registration still there while its Backend is withdrawing it
// as due (the probe sent before the delete, answered after the retry's
// send time moved the registration's end) must not leave the waiter
// believing it is registered while the delete removes the registration:
// a Shared reader that comes after the retry is refused by the waiter.
func TestModesRetryDuringWithdrawal(t *testing.T) {
	withdrawalRace(t, "delete")
}

// TestModesRetryAfterWithdrawal: a retry that registers the waiter again
// right after its Backend deleted the registration as due, before that
// withdrawal has forgotten it, keeps it owned: RenewBatch's orphan sweep
// leaves the new registration alone.
func TestModesRetryAfterWithdrawal(t *testing.T) {
	withdrawalRace(t, "done")
}
