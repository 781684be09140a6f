package lock_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// gatedReleases wraps a memory client: every Release waits until gate is
// closed, and the releases in flight are counted.
type gatedReleases struct {
	*memorybackend.Backend
	gate     chan struct{}
	inflight atomic.Int64
}

func (g *gatedReleases) Release(ctx context.Context, l backend.Lease) error {
	g.inflight.Add(1)
	defer g.inflight.Add(-1)
	select {
	case <-g.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Backend.Release(ctx, l)
}

// TestCloseBoundsReleases: Close of a Locker holding many locks sends a
// bounded number of releases at once (128), not one per lock: a store that
// serves a few thousand writes a second would otherwise answer most of a
// large Locker's releases after their timeout, and the retries would feed
// the flood. Every lock is still released.
func TestCloseBoundsReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, bound = 300, 128
		store := memorybackend.NewStore()
		g := &gatedReleases{Backend: client(t, store), gate: make(chan struct{})}
		l := newLocker(t, g, "a", fastOpts())
		for i := range n {
			if _, err := l.TryAcquire(t.Context(), fmt.Sprintf("k/%d", i), nil); err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
		}
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			l.Close()
		}()
		synctest.Wait() // every releaser is in Release, waiting for the gate
		if got := g.inflight.Load(); got != bound {
			t.Errorf("releases in flight during Close: %d, want %d", got, bound)
		}
		close(g.gate)
		<-closed
		recs, err := client(t, store).List(t.Context(), "")
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if len(recs) != 0 {
			t.Errorf("after Close: %d locks still held, want 0", len(recs))
		}
	})
}
