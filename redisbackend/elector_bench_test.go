package redisbackend_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/internal/testredis"
)

// BenchmarkElectorHandover measures a graceful hand-over over real Redis:
// from the leader's Resign call until the leader function of another of
// three candidates starts.
func BenchmarkElectorHandover(b *testing.B) {
	srv := testredis.Start(b)
	c := newCluster(b, srv, 3)
	var lat []time.Duration
	for b.Loop() {
		old := c.leader(nil)
		// Pacing, not synchronisation: let every earlier resigner's sit-out
		// end, so each hand-over has two eligible followers.
		<-time.After(old.e.Options().ResignSitOut)
		start := time.Now()
		if err := old.e.Resign(ctxBound(b)); err != nil {
			b.Fatalf("Resign: %v", err)
		}
		lat = append(lat, c.startOf(c.leader(old)).Sub(start))
	}
	reportLatency(b, lat, 0)
}

// BenchmarkElectorCrashFailover measures failover after the leader is cut
// off from Redis (connections killed, reconnects refused), as after a crash:
// from the moment its lease expired at the server (cut + PTTL read right
// after the cut) until the leader function of another candidate starts.
// This is the failover latency beyond the TTL.
func BenchmarkElectorCrashFailover(b *testing.B) {
	srv := testredis.Start(b)
	c := newCluster(b, srv, 3)
	var lat []time.Duration
	for b.Loop() {
		old := c.leader(nil)
		c.cutOff(old.id)
		pttl, err := c.admin.PTTL(context.Background(), "sovereign:{"+c.name+"}").Result()
		if err != nil || pttl <= 0 {
			b.Fatalf("PTTL of the lease after the cut: got %v, %v; want a positive TTL", pttl, err)
		}
		expiry := time.Now().Add(pttl)
		lat = append(lat, c.startOf(c.leader(old)).Sub(expiry))
		c.reconnect(old.id)
	}
	reportLatency(b, lat, 0)
}

// reportLatency reports the median and maximum of lat minus base, in ms.
func reportLatency(b *testing.B, lat []time.Duration, base time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d-base) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), "median-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
}
