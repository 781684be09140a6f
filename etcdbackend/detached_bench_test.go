package etcdbackend_test

import (
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// BenchmarkDetachedAcquireRelease measures acquire+release pairs of a
// Detached lease on one key, with this process's CPU time per pair.
func BenchmarkDetachedAcquireRelease(b *testing.B) {
	be, n := benchBackend(b)
	ctx := b.Context()
	req := backend.AcquireRequest{Key: "bench", HolderID: "a", TTL: 10 * time.Second, Detached: true}
	n.reset()
	cpu0 := cpuTime()
	for b.Loop() {
		l, err := be.Acquire(ctx, req)
		if err != nil {
			b.Fatal(err)
		}
		if err := be.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	reportRequests(b, n)
}
