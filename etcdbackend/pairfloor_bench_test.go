package etcdbackend_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// BenchmarkPairFloor measures the wall time of an acquisition and a
// release of a free key from one goroutine (the bench's "1 goroutine" lock
// row) on the embedded etcd server, in interleaved rounds, for four pairs
// sent with clientv3's builders, so that only the requests differ:
//
//	mutex      etcd's concurrency.Mutex, written out: TryLock's
//	           transaction (no key of ours: put an empty value on the
//	           session lease, and read the first key of the prefix) and
//	           Unlock's DeleteRange
//	requests   the Backend's two transactions, written out: the free
//	           check (the record and the range of holder and intent
//	           entries) with the record put on the session lease, the
//	           holder's reads in the else branch; then the owner-checked
//	           delete (two comparisons of the record's value)
//	bare       requests without what the holder's record and the owner
//	           check cost: an empty value, and a plain DeleteRange
//	backend    the Backend's own Acquire and Release
//
// It reports the median over rounds of each pair's µs, and each one's
// pairs/s against mutex's. requests against mutex is what the requests of
// a Sovereign pair cost the server, whatever the client code; backend
// against requests is what the Backend's client code adds.
//
//	go test -run '^$' -bench BenchmarkPairFloor -benchtime 9x ./etcdbackend
func BenchmarkPairFloor(b *testing.B) {
	const pairs = 1500 // per pair kind and round
	ctx := context.Background()
	cli := newClient(b, nil, nil)
	g, err := cli.Grant(ctx, 600)
	if err != nil {
		b.Fatal(err)
	}
	session := g.ID
	pfx := newPrefix()
	be := newBackend(b, newClient(b, nil, nil), &etcdbackend.Options{Prefix: pfx + "backend/"})
	header := "0123456789abcdef0123456789ab \"bench\"\n"
	record := header + `{"acquired_at":"2026-11-25T06:53:30.123456789Z"}`
	key := func(kind string, i int) string { return fmt.Sprintf("%s%s/k%d", pfx, kind, i%16) }
	mutex := func(i int) error {
		k := key("mutex", i) + "/"
		my := fmt.Sprintf("%s%x", k, session)
		if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(my), "=", 0)).
			Then(clientv3.OpPut(my, "", clientv3.WithLease(session)), clientv3.OpGet(k, clientv3.WithFirstCreate()...)).
			Else(clientv3.OpGet(my), clientv3.OpGet(k, clientv3.WithFirstCreate()...)).Commit(); err != nil {
			return err
		}
		_, err := cli.Delete(ctx, my)
		return err
	}
	requests := func(kind string, full bool) func(int) error {
		return func(i int) error {
			k := key(kind, i)
			v := ""
			if full {
				v = record
			}
			if _, err := cli.Txn(ctx).If(
				clientv3.Compare(clientv3.CreateRevision(k), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(k+"\x00h"), "=", 0).WithRange(k+"\x00j"),
			).
				Then(clientv3.OpPut(k, v, clientv3.WithLease(session))).
				Else(clientv3.OpGet(k, clientv3.WithRange(k+"\x00j")), clientv3.OpGet(k+"/heartbeat/", clientv3.WithPrefix())).
				Commit(); err != nil {
				return err
			}
			if !full {
				_, err := cli.Delete(ctx, k)
				return err
			}
			_, err := cli.Txn(ctx).If(
				clientv3.Compare(clientv3.Value(k), ">", header),
				clientv3.Compare(clientv3.Value(k), "<", header[:len(header)-1]+"\x0b"),
			).Then(clientv3.OpDelete(k)).Commit()
			return err
		}
	}
	kinds := []struct {
		name string
		pair func(i int) error
	}{
		{"mutex", mutex},
		{"requests", requests("requests", true)},
		{"bare", requests("bare", false)},
		{"backend", func(i int) error {
			l, err := be.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("k%d", i%16), HolderID: "bench", TTL: pairTTL})
			if err != nil {
				return err
			}
			return be.Release(ctx, l)
		}},
	}
	for _, k := range kinds { // warm up: connections, the session
		for i := range 50 {
			if err := k.pair(i); err != nil {
				b.Fatalf("%s: %v", k.name, err)
			}
		}
	}
	got := make([][]float64, len(kinds))
	round := 0
	for b.Loop() {
		for j := range kinds {
			i := (round + j) % len(kinds)
			start := time.Now()
			for n := range pairs {
				if err := kinds[i].pair(n); err != nil {
					b.Fatalf("%s: %v", kinds[i].name, err)
				}
			}
			got[i] = append(got[i], float64(time.Since(start).Nanoseconds())/1e3/pairs)
		}
		round++
	}
	med := make([]float64, len(kinds))
	for i, k := range kinds {
		slices.Sort(got[i])
		med[i] = got[i][len(got[i])/2]
		b.ReportMetric(med[i], k.name+"-µs/pair")
	}
	for i, k := range kinds[1:] {
		b.ReportMetric(med[0]/med[i+1], k.name+"÷mutex-pairs/s")
	}
}
