// Command alerttrial is one replica of election "trial" for alert-trial.sh:
// it campaigns over Redis and serves /metrics (contrib/prometheus) and
// /healthz, as the README's Metrics section shows. It is not built by
// `go build ./...` (testdata); alert-trial.sh builds it.
package main

import (
	"context"
	"flag"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/sovereign-go/sovereign"
	sovereignprom "github.com/sovereign-go/sovereign/contrib/prometheus"
	"github.com/sovereign-go/sovereign/redisbackend"
)

func main() {
	id := flag.String("id", "", "replica ID")
	addr := flag.String("http", "127.0.0.1:0", "address of /metrics and /healthz")
	redisAddr := flag.String("redis", "127.0.0.1:6379", "redis-server address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rdb := redis.NewClient(&redis.Options{Addr: *redisAddr, ContextTimeoutEnabled: true})
	b, err := redisbackend.New(rdb, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()
	reg := prometheus.NewRegistry()
	m, err := sovereignprom.New(reg, nil)
	if err != nil {
		log.Fatal(err)
	}
	e, err := sovereign.New(b, "trial", *id, &sovereign.Options{Metrics: m}) // default options: TTL 10 s
	if err != nil {
		log.Fatal(err)
	}
	m.Init("trial")
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/healthz", e.HealthHandler(5*time.Second))
	go func() { log.Fatal(http.ListenAndServe(*addr, mux)) }()
	err = e.Run(ctx, func(ctx context.Context) error {
		<-ctx.Done()
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
