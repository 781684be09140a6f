package sovereign_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
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
