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
