package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
	"github.com/sovereign-go/sovereign/redisbackend"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testetcd.IgnoredGoroutines()...)
}

func TestPercentileAndMedian(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 100, 6, 7, 8, 9}
	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		{"p50", percentile(xs, 50), 5},
		{"p99", percentile(xs, 99), 100},
		{"p0", percentile(xs, 0), 1},
		{"median even", median(xs), 5.5},
		{"median odd", median([]float64{3, 1, 2}), 2},
		{"median skips NaN", median([]float64{math.NaN(), 1, 3}), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
	if !math.IsNaN(percentile(nil, 50)) || !math.IsNaN(median(nil)) {
		t.Errorf("got a number for no samples, want NaN")
	}
}

func TestMarkdown(t *testing.T) {
	r := newResults()
	r.add("Hand-over p50 (ms)", colSovRedis, "%.1f", 3)
	r.add("Hand-over p50 (ms)", colSovRedis, "%.1f", 1)
	r.add("Hand-over p50 (ms)", colSovRedis, "%.1f", 2)
	r.add("Pairs/s", colRedislock, "%.0f", 1234.4)
	r.note("a note")
	got := r.markdown()
	for _, want := range []string{
		// Only the columns with a figure, in table order.
		"| Measure | Sovereign-Redis | bsm/redislock |\n|---|---:|---:|\n",
		"| Hand-over p50 (ms) | 2.0 | — |", // the median of three runs
		"| Pairs/s | — | 1234 |",
		"\na note\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("got table\n%s\nwant it to contain %q", got, want)
		}
	}
	if i, j := strings.Index(got, "Hand-over"), strings.Index(got, "Pairs/s"); i > j {
		t.Errorf("got rows out of order:\n%s", got)
	}
}

func TestParseFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"defaults", nil, true},
		{"quick subset", []string{"-quick", "-only", "lock,idle"}, true},
		{"locks and hand-off", []string{"-only", "lock,handoff", "-handoff-samples", "5"}, true},
		{"no hand-off samples", []string{"-handoff-samples", "0"}, false},
		{"unknown scenario", []string{"-only", "nope"}, false},
		{"bad many", []string{"-many", "redis:x"}, false},
		{"many kinds and counts", []string{"-many", "memory/cluster:100/1000", "-many-locks", "mutex/etcd:10"}, true},
		{"many lock kind as election", []string{"-many", "mutex:10"}, false},
		{"many election kind as lock", []string{"-many-locks", "election:10"}, false},
		{"fractional many ttl", []string{"-many-ttl", "2500ms"}, false},
		{"fractional ttl", []string{"-ttl", "1500ms"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseFlags(tc.args)
			if (err == nil) != tc.ok {
				t.Errorf("parseFlags(%q): got error %v, want ok=%v", tc.args, err, tc.ok)
			}
		})
	}
}

// The many runs' window defaults to two renewal intervals of their TTL,
// so that every window holds the same number of renewal instants; a window
// given is kept.
func TestManyWindowDefault(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration
	}{
		{nil, 2 * (sovereign.DefaultTTL / 2)},
		{[]string{"-many-ttl", "3s"}, 3 * time.Second},
		{[]string{"-many-window", "4s"}, 4 * time.Second},
	} {
		c, err := parseFlags(tc.args)
		if err != nil {
			t.Fatalf("parseFlags(%q): %v", tc.args, err)
		}
		if c.manyWindow != tc.want {
			t.Errorf("parseFlags(%q): many window %v, want %v", tc.args, c.manyWindow, tc.want)
		}
	}
	if _, err := parseFlags([]string{"-many-window", "-1s"}); err == nil {
		t.Error("parseFlags(-many-window -1s): no error")
	}
}

func TestHumanInt(t *testing.T) {
	for n, want := range map[int]string{1: "1", 999: "999", 1000: "1,000", 10000: "10,000", 1234567: "1,234,567"} {
		if got := humanInt(n); got != want {
			t.Errorf("humanInt(%d): got %q, want %q", n, got, want)
		}
	}
}

// newTestEnv starts both servers for a smoke test, or skips (loudly) when
// redis-server is not installed.
func newTestEnv(t *testing.T) *env {
	t.Helper()
	rs := testredis.Start(t) // skips loudly without redis-server; fails on CI
	es, err := startEtcd()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(es.stop)
	bin, _ := testredis.FindServer() // found: testredis.Start did not skip
	e := &env{redis: rs, redisBin: bin, etcd: es, log: slog.New(slog.DiscardHandler)}
	t.Cleanup(e.closeCluster)
	return e
}

// TestScenariosSmoke runs one sample of the hand-over, crash and lock
// scenarios of every implementation against real servers.
func TestScenariosSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and etcd")
	}
	e := newTestEnv(t)
	ttl := time.Second
	delays := func(cs []crashSample, err error) ([]time.Duration, error) {
		var ds []time.Duration
		for _, c := range cs {
			ds = append(ds, c.delay)
		}
		return ds, err
	}
	for _, tc := range []struct {
		name string
		run  func() ([]time.Duration, error)
		max  time.Duration
	}{
		{"handover/sovereign-redis", func() ([]time.Duration, error) { return e.sovHandover(kindRedis, 1, ttl) }, 5 * time.Second},
		{"handover/sovereign-etcd", func() ([]time.Duration, error) { return e.sovHandover(kindEtcd, 1, ttl) }, 5 * time.Second},
		{"handover/sovereign-cluster", func() ([]time.Duration, error) { return e.sovHandover(kindCluster, 1, ttl) }, 5 * time.Second},
		{"handover/election", func() ([]time.Duration, error) { return e.electionHandover(1, ttl) }, 5 * time.Second},
		{"crash/sovereign-redis", func() ([]time.Duration, error) { return delays(e.sovCrash(kindRedis, 1, ttl)) }, 5 * time.Second},
		{"crash/sovereign-etcd", func() ([]time.Duration, error) { return delays(e.sovCrash(kindEtcd, 1, ttl)) }, 5 * time.Second},
		{"crash/sovereign-cluster", func() ([]time.Duration, error) { return delays(e.sovCrash(kindCluster, 1, ttl)) }, 5 * time.Second},
		{"crash/election", func() ([]time.Duration, error) { return delays(e.electionCrash(1, ttl)) }, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, err := tc.run()
			if err != nil {
				t.Fatal(err)
			}
			if len(ds) != 1 {
				t.Fatalf("got %d samples, want 1", len(ds))
			}
			// A crash figure is the delay beyond the TTL: it cannot be
			// negative unless a new leader took over a live lease.
			if ds[0] < 0 || ds[0] > tc.max {
				t.Errorf("got %v, want between 0 and %v", ds[0], tc.max)
			}
		})
	}

	ls, err := e.lockImpls()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for _, l := range ls {
		for _, m := range []lockMode{{2, false}, {2, true}} {
			t.Run("lock/"+l.name+"/"+m.String(), func(t *testing.T) {
				// A connection dialled mid-run (the warm-up's calls need not
				// have overlapped, so it may have dialled fewer than the
				// run uses) sends commands of its own: such a run cannot
				// show requests per pair exactly, and is run again.
				const attempts = 5
				var res lockRun
				for attempt := 1; ; attempt++ {
					var err error
					res, err = l.run(e.name("lock"), m.g, m.shared, 100*time.Millisecond)
					if err != nil {
						t.Fatal(err)
					}
					if res.dials == 0 || attempt == attempts {
						break
					}
					t.Logf("run %d dialled %d connections mid-run (%v requests per pair): starting over", attempt, res.dials, res.requestsPerPair)
				}
				if res.pairsPerSec <= 0 {
					t.Errorf("got %v pairs/s, want > 0", res.pairsPerSec)
				}
				if m.shared {
					return
				}
				// The peers and the Sovereign-Redis backend contract acquire
				// and release in one request each (a connection dialled
				// mid-run may add a few); package lock adds its read-back.
				switch {
				case l.col == colSovRedis && l.contract, l.col == colRedsync, l.col == colRedislock, l.col == colMutex:
					if math.Abs(res.requestsPerPair-2) > 0.01 {
						t.Errorf("got %v requests per pair (%d connections dialled mid-run), want 2", res.requestsPerPair, res.dials)
					}
				case res.requestsPerPair < 2:
					t.Errorf("got %v requests per pair, want at least 2", res.requestsPerPair)
				}
			})
		}
	}

	for _, h := range e.handoffImpls() {
		t.Run("handoff/"+h.col, func(t *testing.T) {
			res, err := h.run(e.name("handoff"), 3, 1, 0, 10*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.delays) != 1 {
				t.Fatalf("got %d samples, want 1", len(res.delays))
			}
			// A hand-off cannot end before the release began; redsync
			// waits up to 250 ms between tries.
			if d := res.delays[0]; d <= 0 || d > 5*time.Second {
				t.Errorf("got %v, want between 0 and 5s", d)
			}
			if res.requestsPerHandoff < 1 {
				t.Errorf("got %v requests per hand-off, want at least 1 (the acquisition)", res.requestsPerHandoff)
			}
		})
	}
}

// BenchmarkLockPairs measures one TryAcquire+Release pair (or the peers'
// equivalent) per iteration, on one goroutine, for profiling:
//
//	go test -run '^$' -bench 'LockPairs/Sovereign-Redis_\(package' -cpuprofile /tmp/cpu.out
func BenchmarkLockPairs(b *testing.B) {
	rs := testredis.Start(b)
	es, err := startEtcd()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(es.stop)
	e := &env{redis: rs, etcd: es, log: slog.New(slog.DiscardHandler)}
	ls, err := e.lockImpls()
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for _, l := range ls {
		b.Run(l.name, func(b *testing.B) {
			w, done, err := l.worker(e.name("bench"))
			if err != nil {
				b.Fatal(err)
			}
			defer done()
			ctx := context.Background()
			c0, cpu0 := l.requests(), cpuTime()
			for b.Loop() {
				if err := w(ctx); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(l.requests()-c0)/float64(b.N), "requests/op")
			// The whole process: the embedded etcd server included.
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
		})
	}
}

// BenchmarkLockOverhead measures what package lock adds to a pair without
// any I/O: TryAcquire+Release against Acquire+Release of the in-memory
// backend. Profile it with
//
//	go test -run '^$' -bench LockOverhead/lock -cpuprofile /tmp/cpu.out
func BenchmarkLockOverhead(b *testing.B) {
	ctx := context.Background()
	report := func(b *testing.B, cpu0 time.Duration) {
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
	}
	b.Run("lock", func(b *testing.B) {
		mb := memorybackend.New()
		defer mb.Close()
		lk, err := lock.New(mb, "bench", &lock.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		defer lk.Close()
		b.ReportAllocs()
		cpu0 := cpuTime()
		for b.Loop() {
			h, err := lk.TryAcquire(ctx, "k", nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := h.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
		report(b, cpu0)
	})
	b.Run("contract", func(b *testing.B) {
		mb := memorybackend.New()
		defer mb.Close()
		b.ReportAllocs()
		cpu0 := cpuTime()
		for b.Loop() {
			l, err := mb.Acquire(ctx, backend.AcquireRequest{Key: lock.Prefix + "k", HolderID: "bench", TTL: lockTTL})
			if err != nil {
				b.Fatal(err)
			}
			if err := mb.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
		report(b, cpu0)
	})
}

// BenchmarkPairShapes isolates what the shape of a lock's life costs around
// the same two Redis calls (redisbackend Acquire + Release): made inline; with
// the release made by another goroutine over a channel (as package lock's
// keeper does); with two goroutines started per pair and parked until the
// release (the keeper and the monitor); with three timers armed per pair
// instead. Run it alone: every goroutine started per pair wakes an idle P's
// thread, which on a small machine competes with redis-server.
func BenchmarkPairShapes(b *testing.B) {
	rs := testredis.Start(b)
	cli := newRedisClient(rs.Addr(), "shapes", nil)
	defer cli.Close()
	rb, err := redisbackend.New(cli, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer rb.Close()
	ctx := context.Background()
	acquire := func(b *testing.B) backend.Lease {
		l, err := rb.Acquire(ctx, backend.AcquireRequest{Key: "lock/shapes", HolderID: "bench", TTL: lockTTL})
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	release := func(b *testing.B, l backend.Lease) {
		if err := rb.Release(ctx, l); err != nil {
			b.Fatal(err)
		}
	}
	for _, s := range []struct {
		name string
		pair func(b *testing.B)
	}{
		{"inline", func(b *testing.B) { release(b, acquire(b)) }},
		{"release-by-goroutine", func(b *testing.B) {
			l := acquire(b)
			reply := make(chan error, 1)
			go func() { reply <- rb.Release(ctx, l) }()
			if err := <-reply; err != nil {
				b.Fatal(err)
			}
		}},
		{"two-goroutines-parked", func(b *testing.B) {
			l := acquire(b)
			done := make(chan struct{})
			go func() { <-done }()
			go func() { <-done }()
			release(b, l)
			close(done)
		}},
		{"three-timers", func(b *testing.B) {
			l := acquire(b)
			ts := []*time.Timer{
				time.AfterFunc(7*time.Second, func() {}),
				time.AfterFunc(2*time.Second, func() {}),
				time.AfterFunc(500*time.Millisecond, func() {}),
			}
			release(b, l)
			for _, t := range ts {
				t.Stop()
			}
		}},
	} {
		b.Run(s.name, func(b *testing.B) {
			cpu0 := cpuTime()
			for b.Loop() {
				s.pair(b)
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/op")
		})
	}
}

func TestParseMany(t *testing.T) {
	got, err := parseMany("redis/etcd:100/1000, memory:10,redis:100", false)
	if err != nil {
		t.Fatal(err)
	}
	want := []manySpec{{false, "redis", 100}, {false, "etcd", 100}, {false, "redis", 1000}, {false, "etcd", 1000}, {false, "memory", 10}}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v (kinds varying fastest, duplicates dropped)", got, want)
	}
	got, err = parseMany("mutex:5", true)
	if err != nil || !slices.Equal(got, []manySpec{{true, "mutex", 5}}) {
		t.Errorf("got %v, %v, want one mutex run of 5 locks", got, err)
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, outOK},
		{fmt.Errorf("x: %w", &backend.HeldError{}), outHeld},
		{fmt.Errorf("x: %w", backend.ErrNotHeld), outNotHeld},
		{fmt.Errorf("x: %w", backend.ErrLeaseLost), outLeaseLost},
		{fmt.Errorf("etcdbackend: acquire: %w: %w", context.DeadlineExceeded, errors.New("rpc error")), outTimeout},
		{fmt.Errorf("x: %w", context.Canceled), outCanceled},
		{fmt.Errorf("redisbackend: renew: %w", os.ErrDeadlineExceeded), outTimeout}, // a socket deadline
		{errors.New("etcdserver: too many requests"), outTooMany},
		{errors.New("connection refused"), outOther},
	} {
		if got := classify(tc.err); got != tc.want {
			t.Errorf("classify(%v): got %s, want %s", tc.err, outcomeNames[got], outcomeNames[tc.want])
		}
	}
}

// TestPlots writes the figures of a small result set and checks that each
// is well-formed XML with a line per implementation.
func TestPlots(t *testing.T) {
	r := newResults()
	for _, n := range []float64{100, 1000, 10000} {
		r.point("elections-client-cpu", colSovRedis, n, 20)
		r.point("elections-client-cpu", colElection, n, 0) // drawn hollow on the axis
		r.point("locks-requests", colSovEtcd, n, 1)
	}
	r.fail(colSovEtcd, manySpec{false, "etcd", 10000})
	r.sample("Graceful hand-over", colSovRedis, 1.2, 1.5, 3)
	r.sample("Graceful hand-over", colSovEtcd, 2.5, 4)
	r.sample("Crash failover − TTL (TTL 2s)", colElection, 300, 420)
	dir := t.TempDir()
	files, err := r.writePlots(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{ // file -> polylines (one per implementation)
		"elections-cost.svg": 2, "locks-cost.svg": 1, "handover-cdf.svg": 2, "crash-cdf.svg": 1,
	}
	if len(files) != len(want) {
		t.Errorf("got files %v, want %d files", files, len(want))
	}
	for name, lines := range want {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		d := xml.NewDecoder(bytes.NewReader(b))
		for {
			_, err := d.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Errorf("%s: not well-formed XML: %v", name, err)
				break
			}
		}
		if got := strings.Count(string(b), "<polyline"); got != lines {
			t.Errorf("%s: got %d lines, want %d", name, got, lines)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "elections-cost.svg"))
	if !strings.Contains(string(b), "10k elections failed") {
		t.Errorf("elections-cost.svg does not mark the failed run")
	}
}

// TestRedisCluster starts the bench's 3-master cluster and checks that
// leases acquired through redisbackend on a cluster client land on every
// master, then runs a small many-locks child body against it.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three redis-servers")
	}
	bin, err := testredis.FindServer()
	if err != nil {
		testredis.Start(t) // skips loudly, or fails on CI
		return
	}
	c, err := startCluster(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := len(c.Addrs()); got != clusterMasters {
		t.Fatalf("got %d nodes, want %d", got, clusterMasters)
	}
	cli := newClusterClient(c.Addrs(), "test", nil)
	defer cli.Close()
	rb, err := redisbackend.New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 30 {
		if _, err := rb.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("k%d", i), HolderID: "t", TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	for _, addr := range c.Addrs() {
		n := newRedisClient(addr, "test-node", nil)
		size, err := n.DBSize(ctx).Result()
		n.Close()
		if err != nil {
			t.Fatal(err)
		}
		if size == 0 {
			t.Errorf("master %s holds no key, want some of the 30 leases on every master", addr)
		}
	}

	r, err := measureMany(manyConfig{Locks: true, Kind: "cluster", N: 30, Cluster: c.Addrs(), ServerPIDs: c.PIDs(),
		Bound: 30 * time.Second, Window: 100 * time.Millisecond, Windows: 1})
	if err != nil {
		t.Fatal(err)
	}
	if r.LeadersAtEnd != 30 || r.WithinTwoTTLs != 30 || r.LeadershipLosses != 0 {
		t.Errorf("got %d held at the end, %d within two TTLs, %d lost; want 30, 30, 0", r.LeadersAtEnd, r.WithinTwoTTLs, r.LeadershipLosses)
	}
}

// TestManyMemory runs the many-elections and many-locks child body on the
// memory backend, in this process, with a short TTL so that renewals fall
// in the measurement window.
func TestManyMemory(t *testing.T) {
	for _, locks := range []bool{false, true} {
		t.Run(map[bool]string{false: "elections", true: "locks"}[locks], func(t *testing.T) {
			r, err := measureMany(manyConfig{Locks: locks, Kind: "memory", N: 20, TTL: time.Second,
				Bound: 30 * time.Second, Window: 500 * time.Millisecond, Windows: 1, Diag: true})
			if err != nil {
				t.Fatal(err)
			}
			if r.LeadersAtEnd != 20 || r.WithinTwoTTLs != 20 {
				t.Errorf("got %d at the end, %d within two TTLs, want 20 and 20", r.LeadersAtEnd, r.WithinTwoTTLs)
			}
			// 20 leases renewed every 200 ms: about 100 calls/s.
			if r.ReqPerSec <= 0 {
				t.Errorf("got %v backend calls/s, want renewals", r.ReqPerSec)
			}
			if len(r.ClientCPU) != 1 || len(r.ServerCPU) != 0 {
				t.Errorf("got client CPU %v and server CPU %v, want one window and no server", r.ClientCPU, r.ServerCPU)
			}
		})
	}
}

// TestPlotsMerge checks that a second run's figures add to the first's in
// the plot data, a re-measured point replacing the stored one.
func TestPlotsMerge(t *testing.T) {
	dir := t.TempDir()
	r1 := newResults()
	r1.point("elections-heap", colSovRedis, 100, 7)
	r1.point("elections-heap", colSovRedis, 1000, 8)
	r1.point("elections-requests", colSovRedis, 100, 0.5) // another panel, same points
	r1.point("elections-requests", colSovRedis, 1000, 0.6)
	r1.fail(colSovEtcd, manySpec{false, "etcd", 10000})
	if _, err := r1.writePlots(dir); err != nil {
		t.Fatal(err)
	}
	r2 := newResults()
	r2.point("elections-heap", colSovRedis, 1000, 9)  // replaces 8
	r2.point("elections-heap", colSovEtcd, 10000, 20) // replaces the failure
	if _, err := r2.writePlots(dir); err != nil {
		t.Fatal(err)
	}
	got := map[float64]float64{}
	for _, p := range r2.curves["elections-heap"][colSovRedis] {
		got[p.x] = p.y
	}
	if len(got) != 2 || got[100] != 7 || got[1000] != 9 {
		t.Errorf("got Redis heap points %v, want 100:7 (stored) and 1000:9 (re-measured)", got)
	}
	// The stored request point at 100 stays (every panel of a stored point
	// survives the merge); the one at 1,000 goes with its re-measured count.
	if got := r2.curves["elections-requests"][colSovRedis]; len(got) != 1 || got[0] != (point{100, 0.5}) {
		t.Errorf("got stored request points %v, want only {100 0.5}", got)
	}
	if n := len(r2.failed["elections"][colSovEtcd]); n != 0 {
		t.Errorf("got %d etcd failures, want 0: the run at 10,000 succeeded since", n)
	}
}

// caps lists the optional capabilities b has, as the elector and package
// lock would find them.
func caps(b backend.Backend) []string {
	var cs []string
	if _, ok := b.(backend.Watcher); ok {
		cs = append(cs, "Watcher")
	}
	if a, ok := b.(backend.AcquireConfirmer); ok && a.AcquireConfirms() {
		cs = append(cs, "AcquireConfirms")
	}
	if r, ok := b.(backend.ExpiryReporter); ok && r.ReportsExpiry() {
		cs = append(cs, "ReportsExpiry")
	}
	if _, ok := b.(backend.BatchRenewer); ok {
		cs = append(cs, "BatchRenewer")
	}
	if _, ok := b.(backend.BatchHeartbeater); ok {
		cs = append(cs, "BatchHeartbeater")
	}
	if _, ok := b.(backend.Modes); ok {
		cs = append(cs, "Modes")
	}
	if _, ok := b.(backend.RenewalWatcher); ok {
		cs = append(cs, "RenewalWatcher")
	}
	if _, ok := b.(backend.RenewalMuter); ok {
		cs = append(cs, "RenewalMuter")
	}
	return cs
}

// TestComposeKeepsCapabilities checks that the bench's wrappers have
// exactly the optional capabilities of the backend they wrap, and that a
// crash armed on a batching backend happens after a successful RenewBatch.
func TestComposeKeepsCapabilities(t *testing.T) {
	rs := testredis.Start(t)
	cli := newRedisClient(rs.Addr(), "caps", nil)
	defer cli.Close()
	rb, err := redisbackend.New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer rb.Close()
	mb := memorybackend.New()
	defer mb.Close()
	for name, b := range map[string]backend.Backend{"memory": mb, "redis": rb} {
		t.Run(name, func(t *testing.T) {
			want := caps(b)
			if got := caps(compose(newCountingBackend(b, false), b)); !slices.Equal(got, want) {
				t.Errorf("counting wrapper: got %v, want %v", got, want)
			}
			if got := caps(compose(newLimiter(b, 4), b)); !slices.Equal(got, want) {
				t.Errorf("limiter: got %v, want %v", got, want)
			}
			cr := newCrashable(b)
			w := compose(cr, b)
			if got := caps(w); !slices.Equal(got, want) {
				t.Errorf("crashable wrapper: got %v, want %v", got, want)
			}
			br, ok := w.(backend.BatchRenewer)
			if !ok {
				return
			}
			ctx := context.Background()
			l, err := w.Acquire(ctx, backend.AcquireRequest{Key: "caps-" + name, HolderID: "t", TTL: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			cr.arm()
			if errs := br.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
				t.Fatal(errs[0])
			}
			if !cr.crashed.Load() {
				t.Errorf("got no crash after a successful RenewBatch with the crash armed")
			}
			if errs := br.RenewBatch(ctx, []backend.Lease{l}); !errors.Is(errs[0], errCrashed) {
				t.Errorf("got %v from RenewBatch after the crash, want errCrashed", errs[0])
			}
		})
	}
}

// TestLimiter checks that a call waits for a free slot and gives up, without
// reaching the store, when its context ends first.
func TestLimiter(t *testing.T) {
	mb := memorybackend.New()
	defer mb.Close()
	l := newLimiter(mb, 1)
	b := compose(l, mb)
	ctx := context.Background()
	if err := l.enter(ctx); err != nil { // the only slot, held by "another call"
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err := b.Acquire(cctx, backend.AcquireRequest{Key: "k", HolderID: "t", TTL: time.Second})
	if !errors.Is(err, errLimitWait) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want an error wrapping errLimitWait and context.DeadlineExceeded", err)
	}
	if _, err := mb.Get(ctx, "k"); !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("got %v reading the key, want ErrNotHeld: the waiting Acquire must not reach the store", err)
	}
	l.leave()
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "t", TTL: time.Second}); err != nil {
		t.Errorf("got %v with the slot free, want the lease", err)
	}
}
