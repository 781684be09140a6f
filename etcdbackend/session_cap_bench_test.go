package etcdbackend_test

import (
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// BenchmarkSessionLookup times the look-up of the keys attached to one
// lease (what RenewBatch sends for each session lease it renews) with as
// many keys as one capped session holds and as 100,000 locks on one lease
// held before the cap.
func BenchmarkSessionLookup(b *testing.B) {
	for _, n := range []int{etcdbackend.SessionKeys, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			ctx := b.Context()
			cli := newClient(b, nil, nil)
			grant, err := cli.Grant(ctx, 600)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _, _ = cli.Revoke(ctx, grant.ID) })
			prefix := newPrefix()
			for i := 0; i < n; {
				var ops []clientv3.Op
				for ; i < n && len(ops) < 128; i++ {
					ops = append(ops, clientv3.OpPut(fmt.Sprintf("%slock/k%06d", prefix, i), "v", clientv3.WithLease(grant.ID)))
				}
				if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				resp, err := cli.TimeToLive(ctx, grant.ID, clientv3.WithAttachedKeys())
				if err != nil {
					b.Fatal(err)
				}
				if len(resp.Keys) != n {
					b.Fatalf("%d keys attached, want %d", len(resp.Keys), n)
				}
			}
		})
	}
}

// BenchmarkRenewBatchManyKeys acquires E5_KEYS keys (default 10,000) on one
// Backend, with the session cap and without it (one session lease for
// all, as before the cap), and times a RenewBatch of 4,096 of them (one
// call of the keeper) and the 4,096-lease calls that renew them all one
// after the other, as the keeper does.
func BenchmarkRenewBatchManyKeys(b *testing.B) {
	n := 10_000
	if s := os.Getenv("E5_KEYS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	for _, capped := range []bool{true, false} {
		b.Run(fmt.Sprintf("keys=%d/capped=%v", n, capped), func(b *testing.B) {
			if !capped {
				b.Cleanup(etcdbackend.SetSessionKeys(1 << 30))
			}
			ctx := b.Context()
			be := newBackend(b, newClient(b, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
			leases := make([]backend.Lease, n)
			var wg sync.WaitGroup
			sem := make(chan struct{}, 64)
			start := time.Now()
			for i := range leases {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					l, err := be.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("many/%d", i), HolderID: "a", TTL: time.Minute})
					if err != nil {
						b.Error(err)
					}
					leases[i] = l
				})
			}
			wg.Wait()
			if b.Failed() {
				return
			}
			b.Logf("%d acquisitions in %v", n, time.Since(start).Round(time.Millisecond))
			const chunk = 4096
			b.ResetTimer()
			var pass time.Duration
			for b.Loop() {
				t0 := time.Now()
				for rest := leases; len(rest) > 0; {
					c := rest[:min(len(rest), chunk)]
					rest = rest[len(c):]
					for i, err := range be.RenewBatch(ctx, c) {
						if err != nil {
							b.Fatalf("lease %d: %v", i, err)
						}
					}
				}
				pass = time.Since(t0)
			}
			b.ReportMetric(float64(pass.Milliseconds()), "ms/pass")
		})
	}
}
