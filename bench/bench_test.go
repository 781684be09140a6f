package main

import (
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/internal/testetcd"
	"github.com/sovereign-go/sovereign/internal/testredis"
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
		"| Measure | Sovereign-Redis | Sovereign-etcd | etcd concurrency.Election | redsync/v4 | bsm/redislock |",
		"| Hand-over p50 (ms) | 2.0 | — | — | — | — |", // the median of three runs
		"| Pairs/s | — | — | — | — | 1234 |",
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
		{"unknown scenario", []string{"-only", "nope"}, false},
		{"bad many", []string{"-many", "redis:x"}, false},
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
	return &env{redis: rs, etcd: es, log: slog.New(slog.DiscardHandler)}
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
		{"handover/election", func() ([]time.Duration, error) { return e.electionHandover(1, ttl) }, 5 * time.Second},
		{"crash/sovereign-redis", func() ([]time.Duration, error) { return delays(e.sovCrash(kindRedis, 1, ttl)) }, 5 * time.Second},
		{"crash/sovereign-etcd", func() ([]time.Duration, error) { return delays(e.sovCrash(kindEtcd, 1, ttl)) }, 5 * time.Second},
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

	ls, err := e.lockers()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for _, l := range ls {
		t.Run("lock/"+l.col, func(t *testing.T) {
			res, err := l.run(e.name("lock"), 2, 100*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if res.pairsPerSec <= 0 {
				t.Errorf("got %v pairs/s, want > 0", res.pairsPerSec)
			}
			// Every implementation acquires and releases in one command
			// each (a connection dialled mid-run may add a few).
			if math.Abs(res.cmdsPerPair-2) > 0.01 {
				t.Errorf("got %v commands per pair, want 2", res.cmdsPerPair)
			}
		})
	}
}
