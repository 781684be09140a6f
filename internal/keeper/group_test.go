package keeper_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/coalesce"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// grouped is a batching memory backend that places keys in groups (as
// Redis Cluster places them in hash slots) and records which groups each
// batch call carried.
type grouped struct {
	*memorybackend.Backend
	groups int

	mu    sync.Mutex
	calls []map[uint32]int // per call: holds per group
}

func (b *grouped) BatchGroup(key string) uint32 {
	n, _ := strconv.Atoi(strings.TrimPrefix(key, "k"))
	return uint32(n % b.groups)
}

func (b *grouped) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	seen := map[uint32]int{}
	errs := make([]error, len(leases))
	for i, l := range leases {
		seen[b.BatchGroup(l.Key)]++
		errs[i] = b.Backend.Renew(ctx, l)
	}
	b.mu.Lock()
	b.calls = append(b.calls, seen)
	b.mu.Unlock()
	return errs
}

// A batch larger than one call is split along groups: each group's holds
// go in one call, so a store reached by group (Redis Cluster: a script per
// hash slot) gets one request per group per interval. So it is with more
// chunks than calls in flight at once (coalesce.MaxInFlight), some sent as
// others return.
func TestBatchSplitAlongGroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		const n, groups = coalesce.MaxInFlight*coalesce.MaxBatch + 2000, 1000
		b := &grouped{Backend: c, groups: groups}
		cfg := config(b)
		hs := startN(t, b, cfg, n, 0)
		b.mu.Lock()
		b.calls = nil
		b.mu.Unlock()
		time.Sleep(cfg.RenewInterval) // one grid instant
		synctest.Wait()
		b.mu.Lock()
		calls := b.calls
		b.mu.Unlock()
		if len(calls) <= coalesce.MaxInFlight {
			t.Fatalf("%d batch calls for %d holds, want more than %d (at most %d per call)", len(calls), n, coalesce.MaxInFlight, coalesce.MaxBatch)
		}
		pairs, holds := 0, 0
		for _, call := range calls {
			pairs += len(call)
			for _, k := range call {
				holds += k
			}
		}
		if holds != n {
			t.Fatalf("%d holds renewed in the instant, want %d", holds, n)
		}
		// Each group in one call, but for the one a call boundary may cut.
		if pairs > groups+len(calls)-1 {
			t.Errorf("%d (call, group) pairs over %d calls for %d groups: groups split across calls", pairs, len(calls), groups)
		}
		for i, h := range hs {
			if !h.Held() {
				t.Fatalf("hold %d not held", i)
			}
			release(t, h)
		}
	})
}
