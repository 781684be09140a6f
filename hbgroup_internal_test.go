package sovereign

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// groupedHB is a memory client that records heartbeats in batches and
// places election keys in groups, recording which groups each batch call
// carried and when.
type groupedHB struct {
	*memorybackend.Backend
	groups int

	mu    sync.Mutex
	calls []hbCall
}

type hbCall struct {
	at     time.Time
	groups map[uint32]int
}

func (b *groupedHB) BatchGroup(key string) uint32 {
	n, _ := strconv.Atoi(strings.TrimPrefix(key, "e"))
	return uint32(n % b.groups)
}

func (b *groupedHB) HeartbeatBatch(ctx context.Context, reqs []backend.HeartbeatRequest) []error {
	c := hbCall{at: time.Now(), groups: map[uint32]int{}}
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		c.groups[b.BatchGroup(r.Key)]++
		errs[i] = b.Backend.Heartbeat(ctx, r.Key, r.ID, r.TTL)
	}
	b.mu.Lock()
	b.calls = append(b.calls, c)
	b.mu.Unlock()
	return errs
}

// Heartbeats of more elections than one call carries are split along the
// backend's groups (backend.BatchGrouper): each group's records in one call.
func TestHeartbeatBatchSplitAlongGroups(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		saved := maxHeartbeatBatch
		maxHeartbeatBatch = 10
		defer func() { maxHeartbeatBatch = saved }()
		c := memorybackend.NewStore().Client()
		defer c.Close()
		const n, groups = 40, 4
		b := &groupedHB{Backend: c, groups: groups}
		for i := range n {
			e, err := New(b, fmt.Sprintf("e%d", i), "me", &Options{TTL: time.Second, NoStartupJitter: true, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			defer e.Close()
		}
		time.Sleep(3 * time.Second)
		b.mu.Lock()
		defer b.mu.Unlock()
		byInstant := map[time.Time][]hbCall{}
		for _, c := range b.calls {
			byInstant[c.at] = append(byInstant[c.at], c)
		}
		full := 0
		for at, cs := range byInstant {
			pairs, recs := 0, 0
			for _, c := range cs {
				pairs += len(c.groups)
				for _, k := range c.groups {
					recs += k
				}
			}
			if recs < n {
				continue // not every election's heartbeat fell due then
			}
			full++
			if pairs != groups {
				t.Errorf("instant %v: %d calls carried %d (call, group) pairs for %d groups: groups split across calls", at, len(cs), pairs, groups)
			}
		}
		if full == 0 {
			t.Fatalf("no instant carried every election's heartbeat: %d calls", len(b.calls))
		}
	})
}
