package coalesce_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/internal/coalesce"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Requests made at the same instant go out as one batch, each with its own
// result.
func TestOneBatchPerInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reg coalesce.Registry[string, int]
		var mu sync.Mutex
		var batches [][]int
		send := func(_ context.Context, items []int) []error {
			mu.Lock()
			batches = append(batches, append([]int(nil), items...))
			mu.Unlock()
			errs := make([]error, len(items))
			for i, v := range items {
				if v%2 == 1 {
					errs[i] = errors.New("odd")
				}
			}
			return errs
		}
		var wg sync.WaitGroup
		for i := range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := reg.Do(context.Background(), "b", send, i)
				if (err != nil) != (i%2 == 1) {
					t.Errorf("item %d: got %v", i, err)
				}
			}()
		}
		wg.Wait()
		if len(batches) != 1 || len(batches[0]) != 100 {
			t.Errorf("got %d batches (first of %d), want 1 of 100", len(batches), len(batches[0]))
		}
	})
}

// A caller whose context ends returns at once; the batch goes on for the
// others.
func TestCallerReturnsAtItsDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reg coalesce.Registry[string, int]
		release := make(chan struct{})
		send := func(ctx context.Context, items []int) []error {
			<-release
			return make([]error, len(items))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		other := make(chan error, 1)
		go func() { other <- reg.Do(context.Background(), "b", send, 2) }()
		start := time.Now()
		if err := reg.Do(ctx, "b", send, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d != 10*time.Millisecond {
			t.Errorf("returned after %v, want at its 10ms deadline", d)
		}
		close(release)
		if err := <-other; err != nil {
			t.Errorf("the other caller: %v", err)
		}
	})
}

func TestGrid(t *testing.T) {
	iv := 200 * time.Millisecond
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, off := range []time.Duration{0, time.Millisecond, 199 * time.Millisecond, 200 * time.Millisecond, 333 * time.Millisecond} {
		now := base.Add(off)
		d := coalesce.Grid(now, iv)
		if d <= 0 || d > iv {
			t.Errorf("Grid(+%v): %v, want in (0, %v]", off, d, iv)
		}
		if next := now.Add(d); next.Sub(base)%iv != 0 {
			t.Errorf("Grid(+%v): next instant +%v is not on the grid", off, next.Sub(base))
		}
	}
}
