package sovereign_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// batchingMemory is a memory client that renews and records heartbeats in
// batches, counting the batch calls.
type batchingMemory struct {
	*memorybackend.Backend
	renewBatches, hbBatches atomic.Int64
}

func (b *batchingMemory) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	b.renewBatches.Add(1)
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = b.Backend.Renew(ctx, l)
	}
	return errs
}

func (b *batchingMemory) HeartbeatBatch(ctx context.Context, reqs []backend.HeartbeatRequest) []error {
	b.hbBatches.Add(1)
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = b.Backend.Heartbeat(ctx, r.Key, r.ID, r.TTL)
	}
	return errs
}

// Many elections of one instance on a backend that batches cost one
// renewal batch per RenewInterval and one heartbeat batch per
// HeartbeatInterval, however many there are, and all of them lead.
func TestManyElectionsShareBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchingMemory{Backend: c}
		const n = 40
		var es []*sovereign.Elector
		for i := range n {
			opts := fastOpts()
			opts.NoStartupJitter = false // elections start at different times
			e, err := sovereign.New(b, fmt.Sprintf("election-%d", i), "me", opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
		}
		time.Sleep(3 * time.Second) // every election leads by now
		for i, e := range es {
			if !e.IsLeader() {
				t.Fatalf("election %d has no leader after 3 TTLs", i)
			}
		}
		b.renewBatches.Store(0)
		b.hbBatches.Store(0)
		hbBefore := c.Calls()["Heartbeat"]
		time.Sleep(10 * time.Second)
		// TTL 1s: renew every 200ms, heartbeat every 500ms.
		if got := b.renewBatches.Load(); got < 49 || got > 51 {
			t.Errorf("%d renewal batches in 10s for %d elections, want about 50", got, n)
		}
		if got := b.hbBatches.Load(); got < 19 || got > 21 {
			t.Errorf("%d heartbeat batches in 10s for %d elections, want about 20", got, n)
		}
		if got := c.Calls()["Heartbeat"] - hbBefore; got < 19*n || got > 21*n {
			t.Errorf("%d heartbeats recorded in 10s, want about %d (each election every 500ms)", got, 20*n)
		}
		for i, e := range es {
			if !e.IsLeader() {
				t.Errorf("election %d lost its leader while renewing in batches", i)
			}
			e.Close()
		}
	})
}
