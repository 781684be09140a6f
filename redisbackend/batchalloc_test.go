package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// idleLeaders returns a Backend on a real server and n leases of it held
// as an elector's leaders hold them: each with its holder's heartbeat
// record, written by one HeartbeatBatch.
func idleLeaders(tb testing.TB, n int) (*redisbackend.Backend, []backend.Lease, []backend.HeartbeatRequest) {
	tb.Helper()
	srv := testredis.Start(tb)
	c := srv.NewClient(tb, &redis.Options{ContextTimeoutEnabled: true})
	b := newBackend(tb, c, nil)
	ctx := context.Background()
	leases := make([]backend.Lease, n)
	reqs := make([]backend.HeartbeatRequest, n)
	for i := range leases {
		key := fmt.Sprintf("election-%d", i)
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "me", TTL: 10 * time.Second})
		if err != nil {
			tb.Fatal(err)
		}
		leases[i] = l
		reqs[i] = backend.HeartbeatRequest{Key: key, ID: "me", TTL: 15 * time.Second}
	}
	if err := errors.Join(b.HeartbeatBatch(ctx, reqs)...); err != nil {
		tb.Fatal(err)
	}
	return b, leases, reqs
}

// An idle pass costs few allocations per lease: RenewBatch builds each
// lease's keys in one string and passes its keys and arguments to go-redis
// by pointer (the rest is go-redis reading the replies), and a
// HeartbeatBatch whose records are all fresh (a leader's renewals keep
// them so) allocates nothing per request.
func TestIdlePassAllocations(t *testing.T) {
	const n = 1000
	b, leases, reqs := idleLeaders(t, n)
	ctx := context.Background()
	var renewErr error
	renew := testing.AllocsPerRun(5, func() {
		if err := errors.Join(b.RenewBatch(ctx, leases)...); err != nil {
			renewErr = err
		}
	})
	if renewErr != nil {
		t.Fatal(renewErr)
	}
	// Measured: about 4.3 per lease (13 before the keys were built in one
	// string and passed by pointer).
	if per := renew / n; per > 6 {
		t.Errorf("RenewBatch of %d leases: %.1f allocations per lease, want at most 6", n, per)
	}
	var hbErr error
	hb := testing.AllocsPerRun(5, func() {
		if err := errors.Join(b.HeartbeatBatch(ctx, reqs)...); err != nil {
			hbErr = err
		}
	})
	if hbErr != nil {
		t.Fatal(hbErr)
	}
	if hb > 50 {
		t.Errorf("HeartbeatBatch of %d fresh records: %.0f allocations, want a few, none per request", n, hb)
	}
	t.Logf("RenewBatch: %.1f allocations per lease; HeartbeatBatch of fresh records: %.0f in all", renew/n, hb)
}

// BenchmarkIdlePass measures one idle renewal pass of 1000 leaders and the
// heartbeat pass that follows it (with -benchmem: its allocations).
func BenchmarkIdlePass(b *testing.B) {
	const n = 1000
	be, leases, reqs := idleLeaders(b, n)
	ctx := context.Background()
	for b.Loop() {
		if err := errors.Join(be.RenewBatch(ctx, leases)...); err != nil {
			b.Fatal(err)
		}
		if err := errors.Join(be.HeartbeatBatch(ctx, reqs)...); err != nil {
			b.Fatal(err)
		}
	}
}

// On a Cluster a batch call serves one hash slot, and the keys of a batch
// share slots only a few at a time, so a RenewBatch sends about one call a
// lease. Each call must be sized for its slot's leases, not for every lease
// left in the batch: made with room for up to 256 leases, the calls of a
// pass over 1,000 leases allocated about 30 KiB a lease, most of a Cluster
// client's garbage and CPU (bench: 10,000 elections on a 3-master Cluster).
func TestClusterPassBytes(t *testing.T) {
	const n = 1000
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	b := newBackend(t, srv.NewClusterClient(t, &redis.ClusterOptions{ContextTimeoutEnabled: true}), nil)
	ctx := context.Background()
	leases := make([]backend.Lease, n)
	for i := range leases {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("election-%d", i), HolderID: "me", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	pass := func() {
		if err := errors.Join(b.RenewBatch(ctx, leases)...); err != nil {
			t.Fatal(err)
		}
	}
	pass() // the first pass loads the script (NOSCRIPT, then EVAL)
	// The least of three passes: a loaded machine only adds (go-redis's
	// pools and timers), never removes.
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		pass()
		runtime.ReadMemStats(&after)
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	per := least / n
	t.Logf("RenewBatch on a Cluster, %d leases: %d bytes allocated a lease", n, per)
	// Measured: about 1.2 KiB a lease (30 KiB before).
	if per > 4<<10 {
		t.Errorf("RenewBatch on a Cluster: %d bytes allocated a lease, want at most 4 KiB", per)
	}
}
