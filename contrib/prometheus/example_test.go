package sovereignprom_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sovereign-go/sovereign"
	sovereignprom "github.com/sovereign-go/sovereign/contrib/prometheus"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// Register the metrics with a registry, serve it with promhttp.HandlerFor,
// and pass the Metrics to the elector. Here the leader function scrapes its
// own /metrics endpoint.
func ExampleNew() {
	reg := prometheus.NewRegistry()
	m, err := sovereignprom.New(reg, &sovereignprom.Options{ClientGoCompat: true})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	srv := httptest.NewServer(mux) // http.ListenAndServe(":9090", mux) in a daemon
	defer srv.Close()

	b := memorybackend.New() // redisbackend or etcdbackend in production
	defer b.Close()
	e, err := sovereign.New(b, "billing-cron", "host-a", &sovereign.Options{
		Metrics:         m,
		NoStartupJitter: true,
		Logger:          slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	m.Init("billing-cron") // is_leader 0 until the first leadership, not absent

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = e.Run(ctx, func(ctx context.Context) error {
		defer cancel() // one term is enough for the example
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := sc.Text()
			if strings.HasPrefix(line, "sovereign_is_leader") || strings.HasPrefix(line, "sovereign_term") ||
				strings.HasPrefix(line, "leader_election_master_status") {
				fmt.Println(line)
			}
		}
		return sc.Err()
	})
	if err != nil && ctx.Err() == nil {
		panic(err)
	}
	// Output:
	// leader_election_master_status{name="billing-cron"} 1
	// sovereign_is_leader{election="billing-cron"} 1
	// sovereign_term{election="billing-cron"} 1
}

// The same Metrics serves Lockers: pass it as lock.Options.Metrics. Series
// are by lock class (the key's first segment by default), never by key.
func Example_locks() {
	reg := prometheus.NewRegistry()
	m, err := sovereignprom.New(reg, nil)
	if err != nil {
		panic(err)
	}
	b := memorybackend.New()
	defer b.Close()
	locker, err := lock.New(b, "host-a", &lock.Options{Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		panic(err)
	}
	defer locker.Close()

	err = locker.TryDo(context.Background(), lock.Key("invoice", "2026-0042"), nil, func(ctx context.Context, _ *lock.Lock) error {
		return nil // the critical section
	})
	if err != nil {
		panic(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			var labels []string
			for _, l := range s.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			series := mf.GetName() + "{" + strings.Join(labels, ",") + "}"
			switch {
			case s.GetCounter() != nil && s.GetCounter().GetValue() > 0:
				fmt.Println(series, s.GetCounter().GetValue())
			case s.GetGauge() != nil:
				fmt.Println(series, s.GetGauge().GetValue())
			case s.GetHistogram() != nil:
				fmt.Println(series, "count", s.GetHistogram().GetSampleCount())
			}
		}
	}
	// Output:
	// sovereign_lock_acquisitions_total{class="invoice",result="acquired"} 1
	// sovereign_lock_hold_seconds{class="invoice"} count 1
	// sovereign_lock_wait_seconds{class="invoice"} count 1
	// sovereign_locks_held{class="invoice"} 0
}
