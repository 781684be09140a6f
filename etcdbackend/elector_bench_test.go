package etcdbackend_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	sovereign "github.com/sovereign-go/sovereign"
)

// BenchmarkElectorHandover measures a graceful hand-over over etcd: from
// the leader's Resign call until the leader function of another of three
// candidates starts.
func BenchmarkElectorHandover(b *testing.B) {
	c := newCandidates(b, nil, 3, nil, nil)
	var lat []time.Duration
	for b.Loop() {
		old := c.leader(nil)
		// Pacing, not synchronisation: let every earlier resigner's sit-out
		// end, so each hand-over has two eligible followers.
		<-time.After(old.e.Options().ResignSitOut)
		start := time.Now()
		if err := old.e.Resign(b.Context()); err != nil {
			b.Fatalf("Resign: %v", err)
		}
		lat = append(lat, c.startOf(c.leader(old)).Sub(start))
	}
	reportLatency(b, lat, "")
}

// BenchmarkElectorCrashFailover measures failover after the leader's etcd
// client is closed without releasing anything (a crash), with the 1 s TTL:
// from the crash until the leader function of another of three candidates
// starts ("crash-" metrics, which include up to a TTL of lease life left),
// and from the moment etcd deleted the expired lease (seen by a separate
// watch) until then ("after-expiry-" metrics: the failover beyond the TTL).
func BenchmarkElectorCrashFailover(b *testing.B) {
	c := newCandidates(b, nil, 3, nil, nil)
	raw := newClient(b, nil, nil)
	key := c.prefix + c.name
	var crashLat, expiryLat []time.Duration
	for i := 0; b.Loop(); i++ {
		old := c.leader(nil)
		wctx, cancel := context.WithCancel(b.Context())
		deleted := make(chan time.Time, 1)
		ch := raw.Watch(wctx, key, clientv3.WithCreatedNotify())
		<-ch // created
		go func() {
			for resp := range ch {
				for _, ev := range resp.Events {
					if ev.Type == mvccpb.DELETE {
						select {
						case deleted <- time.Now():
						default:
						}
					}
				}
			}
		}()
		crash := time.Now()
		old.crash()
		start := c.startOf(c.leader(old))
		expiry := <-deleted
		cancel()
		crashLat = append(crashLat, start.Sub(crash))
		expiryLat = append(expiryLat, start.Sub(expiry))
		// Replace the crashed candidate, so three campaign again.
		old.stop()
		c.cands = slices.DeleteFunc(c.cands, func(cand *candidate) bool { return cand == old })
		c.add(fmt.Sprintf("cand-r%d", i), nil)
	}
	reportLatency(b, crashLat, "crash-")
	reportLatency(b, expiryLat, "after-expiry-")
}

// BenchmarkElectorIdleRequests counts the etcd requests of an idle leader
// and an idle follower in the steady state, with the elector's default
// options (TTL 10 s: renewal every 5 s, heartbeat every 5 s), over a
// 20-second window, reported per minute.
func BenchmarkElectorIdleRequests(b *testing.B) {
	const window = 20 * time.Second
	c := newCandidates(b, nil, 2, &sovereign.Options{TTL: sovereign.DefaultTTL}, nil)
	leader := c.leader(nil)
	follower := c.cands[0]
	if follower == leader {
		follower = c.cands[1]
	}
	// Let the start-up traffic (campaign, verification, clean-up) pass.
	<-time.After(time.Second)
	perMinute := func(n int64) float64 { return float64(n) * float64(time.Minute) / float64(window) }
	for b.Loop() {
		leader.n.reset()
		follower.n.reset()
		<-time.After(window)
		b.ReportMetric(perMinute(leader.n.total()), "leader-requests/min")
		b.ReportMetric(perMinute(follower.n.total()), "follower-requests/min")
		b.Logf("in %v: leader %v, follower %v", window, leader.n.byMethod(), follower.n.byMethod())
	}
	if !leader.e.IsLeader() {
		b.Fatal("the leader lost its lease while idle")
	}
}

// reportLatency reports the median and maximum of lat, in ms, with the
// metric names prefixed by prefix.
func reportLatency(b *testing.B, lat []time.Duration, prefix string) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(lat[len(lat)/2]), prefix+"median-ms")
	b.ReportMetric(ms(lat[len(lat)-1]), prefix+"max-ms")
}
