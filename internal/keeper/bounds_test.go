package keeper_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/internal/keeper"
)

type ctxKey struct{}

// Bound gives a call that starts at any time a deadline no later than the
// timeout after it, and no earlier than 15/16 of it; calls of one slice
// share one context, and a later slice gets a new one.
func TestBoundsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 1600 * time.Millisecond
		b := keeper.NewBounds(context.Background(), timeout)
		first, _ := b.Bound(context.Background(), timeout)
		seen := map[context.Context]bool{first: true}
		for range 40 {
			time.Sleep(7 * time.Millisecond)
			ctx, cancel := b.Bound(context.Background(), timeout)
			d, ok := ctx.Deadline()
			now := time.Now()
			switch {
			case !ok:
				t.Fatal("Bound: no deadline")
			case d.After(now.Add(timeout)):
				t.Fatalf("Bound at %v: deadline %v after the call started, want at most %v", now, d.Sub(now), timeout)
			case d.Before(now.Add(timeout * 15 / 16)):
				t.Fatalf("Bound at %v: deadline %v after the call started, want at least %v", now, d.Sub(now), timeout*15/16)
			}
			seen[ctx] = true
			cancel() // does not end the shared context
			if ctx.Err() != nil {
				t.Fatalf("the shared context ended with its call: %v", ctx.Err())
			}
		}
		// 280ms of calls made slices from 0, 105 and 210ms.
		if len(seen) != 3 {
			t.Errorf("contexts of calls every 7ms for 280ms: %d, want 3 (one per slice of 100ms)", len(seen))
		}
		x, _ := b.Bound(context.Background(), timeout)
		if y, _ := b.Bound(context.Background(), timeout); y != x {
			t.Error("two calls at the same instant got two contexts, want one")
		}
		time.Sleep(timeout / 16)
		if z, _ := b.Bound(context.Background(), timeout); z == x {
			t.Error("a call a slice after another shares its context, want a new one")
		}
		start := time.Now()
		<-first.Done()
		if d := time.Since(start) + 280*time.Millisecond + timeout/16; d > timeout {
			t.Errorf("the first call's context ended %v after it started, want at most %v", d, timeout)
		}
		if !errors.Is(first.Err(), context.DeadlineExceeded) {
			t.Errorf("the first call's context: got %v, want DeadlineExceeded", first.Err())
		}
	})
}

// A context that may be cancelled gets its own context.WithTimeout, which
// the Bounds' parent does not end; one that may not shares the parent's
// end and keeps its values, and a context derived from it ends with it.
func TestBoundsParentAndValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, stop := context.WithCancel(context.Background())
		b := keeper.NewBounds(parent, time.Second)

		own, cancelOwn := b.Bound(t.Context(), time.Second)
		defer cancelOwn()
		if b.Shares(t.Context(), time.Second) {
			t.Error("Shares(a cancellable context): got true, want false")
		}
		other, cancelOther := b.Bound(context.Background(), 2*time.Second)
		defer cancelOther()

		vctx := context.WithValue(context.Background(), ctxKey{}, "v")
		if !b.Shares(vctx, time.Second) {
			t.Error("Shares(a context never cancelled): got false, want true")
		}
		shared, _ := b.Bound(vctx, time.Second)
		if got := shared.Value(ctxKey{}); got != "v" {
			t.Errorf("the shared context's value: got %v, want v", got)
		}
		wctx, _ := b.Bound(context.WithoutCancel(t.Context()), time.Second)
		base := bubbleGoroutines()
		child, cancelChild := context.WithCancel(shared)
		defer cancelChild()
		if n := bubbleGoroutines(); n != base {
			t.Errorf("goroutines after deriving a context from the shared one: %d, want %d (none watches it)", n, base)
		}

		stop()
		synctest.Wait()
		for name, ctx := range map[string]context.Context{"shared": shared, "shared (WithoutCancel)": wctx, "derived": child} {
			if !errors.Is(ctx.Err(), context.Canceled) {
				t.Errorf("%s context after the parent ended: got %v, want Canceled", name, ctx.Err())
			}
		}
		if own.Err() != nil || other.Err() != nil {
			t.Errorf("own contexts after the parent ended: got %v and %v, want nil", own.Err(), other.Err())
		}
	})
}

// A nil *Bounds bounds every call with its own context.WithTimeout.
func TestBoundsNil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b *keeper.Bounds
		ctx, cancel := b.Bound(context.Background(), time.Second)
		if d, ok := ctx.Deadline(); !ok || d != time.Now().Add(time.Second) {
			t.Errorf("deadline: got %v (%v), want %v", d, ok, time.Now().Add(time.Second))
		}
		cancel()
		if ctx.Err() == nil {
			t.Error("cancel did not end the context")
		}
	})
}
