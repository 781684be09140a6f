package sovereign_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestOneGoroutinePerElector: an elector's loop selects on its watch itself,
// so a leader and a follower with an established watch each cost one
// goroutine (the loop), not one more for the subscription.
func TestOneGoroutinePerElector(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, b := store.Client(), store.Client()
		defer a.Close()
		defer b.Close()
		const n = 40
		before := runtime.NumGoroutine()
		var es []*sovereign.Elector
		for i := range n {
			for _, c := range []*memorybackend.Backend{a, b} {
				e, err := sovereign.New(c, fmt.Sprintf("election-%d", i), fmt.Sprintf("%p", c), fastOpts())
				if err != nil {
					t.Fatal(err)
				}
				if err := e.Start(context.Background()); err != nil {
					t.Fatal(err)
				}
				es = append(es, e)
				defer e.Close()
			}
		}
		time.Sleep(3 * time.Second) // every election has its leader and watches by now
		synctest.Wait()
		leaders := 0
		for _, e := range es {
			if e.IsLeader() {
				leaders++
			}
		}
		if leaders != n {
			t.Fatalf("%d leaders for %d elections", leaders, n)
		}
		if got := runtime.NumGoroutine() - before; got > len(es)+4 {
			t.Errorf("%d electors (%d leading, %d following) run %d goroutines, want at most one each (+4)", len(es), n, n, got)
		}
	})
}

// The electors of a process have at most 256 one-off calls (acquisitions
// with their verification, look-ups) in flight on one backend: the others
// wait for a place, so thousands of elections starting at once do not send
// thousands of requests that time out together. Every one still leads.
func TestCallsInFlightAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		h := &hooked{Backend: mem}
		var (
			mu                sync.Mutex
			inflight, maxSeen int
		)
		gate := make(chan struct{})
		h.set(func(h *hooked) {
			h.onAcquire = func(ctx context.Context, req backend.AcquireRequest) {
				mu.Lock()
				inflight++
				maxSeen = max(maxSeen, inflight)
				mu.Unlock()
				select {
				case <-gate:
				case <-ctx.Done():
				}
				mu.Lock()
				inflight--
				mu.Unlock()
			}
		})
		const n = 600
		opts := fastOpts()
		opts.RequestTimeout = 300 * time.Millisecond
		var es []*sovereign.Elector
		for i := range n {
			e, err := sovereign.New(h, fmt.Sprintf("election-%d", i), "a", opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			es = append(es, e)
		}
		synctest.Wait()
		mu.Lock()
		got := inflight
		mu.Unlock()
		if got != 256 {
			t.Errorf("%d acquisitions in flight at once for %d starting elections, want the bound, 256", got, n)
		}
		close(gate)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		leaders := 0
		for _, e := range es {
			if e.IsLeader() {
				leaders++
			}
		}
		if leaders != n || maxSeen > 256 {
			t.Errorf("%d of %d elections lead, at most %d acquisitions were in flight; want all, at most 256", leaders, n, maxSeen)
		}
	})
}
