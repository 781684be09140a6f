package coalesce_test

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/internal/coalesce"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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

// Chunks sends every chunk once, with up to MaxInFlight calls at once (all
// of them while none has returned), each worker one call at a time.
func TestChunks(t *testing.T) {
	for _, chunks := range []int{0, 1, 2, coalesce.MaxInFlight, 3*coalesce.MaxInFlight + 1} {
		var (
			mu        sync.Mutex
			sent      = make([]int, chunks)
			busy      = make(map[int]bool)
			in, most  int
			gate      = make(chan struct{})
			entered   = make(chan struct{}, chunks)
			wantFirst = min(chunks, coalesce.MaxInFlight)
		)
		done := make(chan struct{})
		go func() {
			defer close(done)
			coalesce.Chunks(chunks, func(w, c int) {
				mu.Lock()
				if w < 0 || w >= coalesce.MaxInFlight || busy[w] {
					t.Errorf("%d chunks: call of chunk %d on worker %d, out of range or already busy", chunks, c, w)
				}
				busy[w] = true
				sent[c]++
				in++
				most = max(most, in)
				mu.Unlock()
				entered <- struct{}{}
				<-gate
				mu.Lock()
				busy[w] = false
				in--
				mu.Unlock()
			})
		}()
		for range wantFirst { // the first calls all start before any returns
			<-entered
		}
		close(gate)
		<-done
		if most != wantFirst {
			t.Errorf("%d chunks: up to %d calls at once, want %d", chunks, most, wantFirst)
		}
		for c, n := range sent {
			if n != 1 {
				t.Errorf("%d chunks: chunk %d sent %d times, want 1", chunks, c, n)
			}
		}
	}
}
