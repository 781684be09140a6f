package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// BenchmarkClusterBatchCPU measures one renewal pass over n lock leases
// spread over the slots of a real 3-master Cluster, sent one script per
// master ("node", as RenewBatch does) and one script per hash slot ("slot",
// as it did before), in interleaved rounds on the same servers: the
// masters' CPU (main threads, INFO cpu, the INFO calls measured alone and
// subtracted) and this process's CPU (the client's), per lease, medians
// over the rounds.
//
//	go test -run '^$' -bench ClusterBatchCPU -benchtime 20x ./redisbackend
func BenchmarkClusterBatchCPU(b *testing.B) {
	for _, n := range []int{10000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) { benchClusterBatchCPU(b, n) })
	}
}

func benchClusterBatchCPU(b *testing.B, n int) {
	ctx := context.Background()
	c := testredis.StartCluster(b, testredis.ClusterConfig{Masters: 3})
	cc := c.NewClusterClient(b, &redis.ClusterOptions{ContextTimeoutEnabled: true})
	be, err := New(cc, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	leases := make([]backend.Lease, n)
	for i := range leases {
		if leases[i], err = be.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("lock/bench/%d", i), HolderID: "bench", TTL: time.Minute}); err != nil {
			b.Fatal(err)
		}
	}
	var admins []*redis.Client
	for _, a := range c.Addrs() {
		admins = append(admins, c.Node(a).NewClient(b, nil))
	}
	server := func() float64 {
		total := 0.0
		for _, a := range admins {
			total += mainThreadCPU(ctx, a)
		}
		return total
	}
	infoCost := 0.0
	for range 20 {
		u := server()
		infoCost += (server() - u) / 20
	}
	client := func() float64 {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
	}
	pass := func(byNode bool) error {
		errs := make([]error, n)
		be.renewBatch(ctx, leases, errs, byNode)
		return errors.Join(errs...)
	}
	for _, byNode := range []bool{true, false} { // load the scripts
		if err := pass(byNode); err != nil {
			b.Fatal(err)
		}
	}
	var srv, cli [2][]float64 // [node, slot]: µs a lease, per round
	for b.Loop() {
		for m, byNode := range []bool{true, false} {
			s0, c0 := server(), client()
			if err := pass(byNode); err != nil {
				b.Fatal(err)
			}
			c1 := client()
			srv[m] = append(srv[m], (server()-s0-infoCost)/float64(n))
			cli[m] = append(cli[m], (c1-c0)/float64(n))
		}
	}
	median := func(v []float64) float64 {
		v = slices.Clone(v)
		slices.Sort(v)
		return v[len(v)/2]
	}
	b.ReportMetric(median(srv[0]), "node-server-µs/lease")
	b.ReportMetric(median(srv[1]), "slot-server-µs/lease")
	b.ReportMetric(median(cli[0]), "node-client-µs/lease")
	b.ReportMetric(median(cli[1]), "slot-client-µs/lease")
}
