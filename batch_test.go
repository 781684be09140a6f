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
	"github.com/sovereign-go/sovereign/internal/electortest"
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
		// TTL 1s: renew every 333ms, heartbeat every 500ms.
		if got := b.renewBatches.Load(); got < 29 || got > 31 {
			t.Errorf("%d renewal batches in 10s for %d elections, want about 30", got, n)
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

// A follower that stopped polling (its watch reports every expiry) still
// takes over as soon as a crashed leader's lease expires.
func TestQuietFollowerTakesOverAtExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, &sovereign.Options{Logger: quiet}) // TTL 10s
		c.start(t)
		li := c.leader(t, 2*time.Second)
		fi := 1 - li
		time.Sleep(5 * time.Minute) // the follower has long stopped polling
		synctest.Wait()
		before := c.clients[fi].Calls()["Acquire"]
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := c.clients[fi].Calls()["Acquire"] - before; got > 1 {
			t.Fatalf("idle follower made %d attempts in a minute, want at most 1", got)
		}
		crashed := time.Now()
		c.clients[li].Partition() // the leader's process is gone: no renewal, no release
		deadline := crashed.Add(12 * time.Second)
		for !c.es[fi].IsLeader() {
			if time.Now().After(deadline) {
				t.Fatal("the follower did not take over within the TTL after the leader crashed")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// The lease expires TTL after the last renewal, which came at most
		// one RenewInterval (2s) before the crash.
		if d := time.Since(crashed); d < 8*time.Second || d > 10*time.Second+50*time.Millisecond {
			t.Errorf("follower led %v after the crash, want within (TTL - RenewInterval, TTL]", d)
		}
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

// The double verification checks the store's own atomic reply when the
// backend confirms with it (no second request), and reads the record back
// when it does not.
func TestVerificationFoldedIntoConfirmedAcquire(t *testing.T) {
	for _, confirm := range []bool{true, false} {
		t.Run(fmt.Sprintf("confirms=%v", confirm), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memorybackend.New()
				defer mem.Close()
				var b backend.Backend = mem
				if !confirm {
					b = &hooked{Backend: mem} // hides AcquireConfirmer
				}
				e, err := sovereign.New(b, "election", "a", fastOpts())
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if err := e.Start(t.Context()); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
				if !e.IsLeader() {
					t.Fatal("no leader")
				}
				gets := mem.Calls()["Get"]
				switch {
				case confirm && gets != 0:
					t.Errorf("%d reads after a confirmed acquisition, want 0", gets)
				case !confirm && gets != 1:
					t.Errorf("%d reads after an acquisition, want 1 (the read-back)", gets)
				}
				if r, err := mem.Get(t.Context(), "election"); err != nil || r.Term != e.Term() || r.HolderID != "a" {
					t.Errorf("store holds %+v (%v), want a's lease of term %d", r, err, e.Term())
				}
			})
		})
	}
}
