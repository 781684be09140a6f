package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// BenchmarkBatchServerCPU measures the server's CPU time per lease or record
// of the batch scripts against a real redis-server, one at a time (an idle
// leader) and 500 at a time (two scripts of at most 256): "renew" renews leases whose holders send no
// heartbeat (locks), "renew+heartbeat" renews leases whose holders' heartbeat
// records this Backend's batches keep asking for (leaders: the renewal
// refreshes the record too, as it does when a heartbeat batch would
// otherwise write it), "heartbeat" writes heartbeat records (each
// batch asks with another TTL, so that every record is written). An idle
// leader used to cost a renewal every interval and a heartbeat every other
// heartbeat interval; it now costs "renew" every interval and
// "renew+heartbeat" about as often as a heartbeat batch came (see
// beats.renewal). As in BenchmarkScriptServerCPU, the INFO calls around
// each batch are measured alone and subtracted.
func BenchmarkBatchServerCPU(b *testing.B) {
	for _, n := range []int{1, 500} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) { benchBatchServerCPU(b, n) })
	}
}

func benchBatchServerCPU(b *testing.B, batch int) {
	ctx := context.Background()
	srv := testredis.Start(b)
	admin := srv.NewClient(b, nil)
	c := srv.NewClient(b, &redis.Options{ContextTimeoutEnabled: true})
	be, err := New(c, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = be.Close() })
	base := "bench-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	locks := make([]backend.Lease, batch)
	leaders := make([]backend.Lease, batch)
	beats := make([]backend.HeartbeatRequest, batch)
	for i := range batch {
		var err error
		locks[i], err = be.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("lock/%s/%d", base, i), HolderID: "bench", TTL: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		key := fmt.Sprintf("%s/%d", base, i)
		leaders[i], err = be.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "bench", TTL: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		beats[i] = backend.HeartbeatRequest{Key: key, ID: "bench", TTL: 15 * time.Second}
	}
	// quiet renews as be does, without publishing the renewals
	// (PubSubOff): what the renewal events cost.
	quiet, err := New(c, &Options{PubSub: PubSubOff})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = quiet.Close() })
	check := func(errs []error) error { return errors.Join(errs...) }
	renewLocks := func() error { return check(be.RenewBatch(ctx, locks)) }
	renewQuiet := func() error { return check(quiet.RenewBatch(ctx, locks)) }
	renewLeaders := func() error { return check(be.RenewBatch(ctx, leaders)) }
	// askBeats asks for the leaders' records as the elector's heartbeat
	// scheduler does (the records being fresh, it sends nothing), and
	// makes the pace of renewals unknown, so that the next renewal
	// refreshes every record.
	askBeats := func() error {
		err := check(be.HeartbeatBatch(ctx, beats))
		be.beats.mu.Lock()
		for k, bt := range be.beats.m {
			bt.renewed = time.Time{}
			be.beats.m[k] = bt
		}
		be.beats.mu.Unlock()
		return err
	}
	ttls := []time.Duration{15 * time.Second, 16 * time.Second}
	round := 0
	writeBeats := func() error {
		round++
		reqs := make([]backend.HeartbeatRequest, batch)
		for i, r := range beats {
			reqs[i] = backend.HeartbeatRequest{Key: r.Key + "/w", ID: r.ID, TTL: ttls[round%2]}
		}
		return check(be.HeartbeatBatch(ctx, reqs))
	}
	for _, f := range []func() error{renewLocks, renewQuiet, askBeats, renewLeaders, writeBeats} { // warm up
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	infoCost := 0.0
	for range 20 {
		u := mainThreadCPU(ctx, admin)
		infoCost += (mainThreadCPU(ctx, admin) - u) / 20
	}
	measure := func(b *testing.B, before, op func() error) {
		total, n := 0.0, 0
		for b.Loop() {
			if before != nil {
				if err := before(); err != nil {
					b.Fatal(err)
				}
			}
			u := mainThreadCPU(ctx, admin)
			if err := op(); err != nil {
				b.Fatal(err)
			}
			total += mainThreadCPU(ctx, admin) - u - infoCost
			n += batch
		}
		b.ReportMetric(total/float64(n), "server-cpu-µs/op")
	}
	b.Run("renew", func(b *testing.B) { measure(b, nil, renewLocks) })
	b.Run("renew-unpublished", func(b *testing.B) { measure(b, nil, renewQuiet) })
	b.Run("renew+heartbeat", func(b *testing.B) { measure(b, askBeats, renewLeaders) })
	b.Run("heartbeat", func(b *testing.B) { measure(b, nil, writeBeats) })
}

// mainThreadCPU returns the CPU time the server's main thread has used so
// far (INFO cpu), in microseconds.
func mainThreadCPU(ctx context.Context, admin *redis.Client) float64 {
	total := 0.0
	for _, line := range strings.Split(admin.Info(ctx, "cpu").Val(), "\n") {
		for _, f := range []string{"used_cpu_sys_main_thread:", "used_cpu_user_main_thread:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += n * 1e6
			}
		}
	}
	return total
}
