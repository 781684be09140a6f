package sovereign

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/coalesce"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// gatedHB is a memory client that records heartbeats in batches, each call
// waiting at a gate until the test opens it, counting the calls in flight.
type gatedHB struct {
	*memorybackend.Backend
	gate chan struct{}

	mu             sync.Mutex
	inFlight, most int
	calls          int
	recorded       map[string]int
}

func (b *gatedHB) HeartbeatBatch(ctx context.Context, reqs []backend.HeartbeatRequest) []error {
	b.mu.Lock()
	b.calls++
	b.inFlight++
	b.most = max(b.most, b.inFlight)
	b.mu.Unlock()
	<-b.gate
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = b.Backend.Heartbeat(ctx, r.Key, r.ID, r.TTL)
	}
	b.mu.Lock()
	b.inFlight--
	for _, r := range reqs {
		b.recorded[r.Key]++
	}
	b.mu.Unlock()
	return errs
}

// The heartbeat calls of one instant go out with up to
// coalesce.MaxInFlight in flight at once: a call that has not come back
// (here: none has) keeps no other waiting, and every chunk is sent.
func TestHeartbeatChunksInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		saved := maxHeartbeatBatch
		maxHeartbeatBatch = 2
		defer func() { maxHeartbeatBatch = saved }()
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &gatedHB{Backend: c, gate: make(chan struct{}), recorded: map[string]int{}}
		var open sync.Once
		openGate := func() { open.Do(func() { close(b.gate) }) }
		const n = 2 * (coalesce.MaxInFlight + 2) // chunks: two more than in flight
		var es []*Elector
		for i := range n {
			e, err := New(b, fmt.Sprintf("e%d", i), "me", &Options{TTL: time.Second, NoStartupJitter: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
		}
		defer func() { // a failure leaves no call stuck in the bubble
			openGate()
			for _, e := range es {
				e.Close()
			}
		}()
		// Started inside one gathering window: one instant, n/2 chunks.
		for _, e := range es {
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * coalesce.Gather) // past the gathering window
		synctest.Wait()
		b.mu.Lock()
		inFlight, calls := b.inFlight, b.calls
		b.mu.Unlock()
		if inFlight != coalesce.MaxInFlight || calls != coalesce.MaxInFlight {
			t.Fatalf("with every call held at the gate: %d calls made, %d in flight; want %d of each", calls, inFlight, coalesce.MaxInFlight)
		}
		openGate()
		synctest.Wait()
		b.mu.Lock()
		for i := range n {
			if k := fmt.Sprintf("e%d", i); b.recorded[k] == 0 {
				t.Errorf("no heartbeat of %s was sent", k)
			}
		}
		if b.most > coalesce.MaxInFlight {
			t.Errorf("%d calls in flight at once, want at most %d", b.most, coalesce.MaxInFlight)
		}
		b.mu.Unlock()
	})
}
