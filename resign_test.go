package sovereign_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// releaseHooked is a memory client whose Release is replaced by release.
type releaseHooked struct {
	*memorybackend.Backend
	release func(ctx context.Context, l backend.Lease) error
}

func (r *releaseHooked) Release(ctx context.Context, l backend.Lease) error {
	return r.release(ctx, l)
}

// Resign called with the leader context of another elector (from inside
// that elector's leader function) is an ordinary Resign of this one: it
// returns once this elector's lease is released, not when the step-down
// has begun.
func TestResignWithAnotherElectorsLeaderContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		cb := &releaseHooked{Backend: store.Client()}
		cb.release = func(ctx context.Context, l backend.Lease) error {
			time.Sleep(50 * time.Millisecond) // a slow store
			return cb.Backend.Release(ctx, l)
		}
		defer cb.Close()
		b, err := sovereign.New(cb, "y", "b", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if err := b.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, b, time.Second)

		ca := store.Client()
		defer ca.Close()
		a, err := sovereign.New(ca, "x", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		type result struct {
			err     error
			took    time.Duration
			getErr  error
			holder  string
			leading bool
		}
		res := make(chan result, 1)
		go a.Run(ctx, func(lctx context.Context) error {
			start := time.Now()
			err := b.Resign(lctx)
			r := result{err: err, took: time.Since(start), leading: b.IsLeader()}
			rec, gerr := raw.Get(context.Background(), "y")
			r.getErr, r.holder = gerr, rec.HolderID
			res <- r
			<-lctx.Done()
			return nil
		})
		r := <-res
		if r.err != nil {
			t.Fatalf("b.Resign with a's leader context: got %v, want nil", r.err)
		}
		if r.leading {
			t.Error("b still leads after its Resign returned")
		}
		if !errors.Is(r.getErr, backend.ErrNotHeld) {
			t.Errorf("b's key when its Resign returned (after %v): got holder %q, err %v; want released (ErrNotHeld)", r.took, r.holder, r.getErr)
		}
		cancel()
		a.Close()
	})
}

// Resign of a leader whose lease the store has already lost (it learns so
// from the release) returns nil: nothing was left to release.
func TestResignOfALostLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := &releaseHooked{Backend: memorybackend.NewStore().Client()}
		cl.release = func(ctx context.Context, l backend.Lease) error {
			if err := cl.Backend.Release(ctx, l); err != nil {
				return err
			}
			// As if the store had lost the lease just before.
			return fmt.Errorf("%w: test: the store lost it", backend.ErrLeaseLost)
		}
		defer cl.Close()
		e, err := sovereign.New(cl, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, e, time.Second)
		if err := e.Resign(t.Context()); err != nil {
			t.Errorf("Resign of a lease the store had lost: got %v, want nil", err)
		}
	})
}
