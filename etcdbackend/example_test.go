package etcdbackend_test

import (
	"context"
	"log"
	"os"
	"os/signal"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// This example runs a daemon's work only while it leads the election
// "scheduler" among its replicas, over an etcd cluster. (It needs a running
// cluster, so it has no output to check.)
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// ClientConfig reconnects within a second of etcd's return; add TLS
	// and credentials to it as needed.
	cli, err := clientv3.New(etcdbackend.ClientConfig("10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"))
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close() // the client is yours: the backend never closes it

	b, err := etcdbackend.New(cli, &etcdbackend.Options{Prefix: "myapp/"})
	if err != nil {
		log.Fatal(err)
	}
	defer b.Close()

	host, _ := os.Hostname()
	e, err := sovereign.New(b, "scheduler", host, &sovereign.Options{TTL: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	// Run campaigns until ctx ends (Ctrl-C), then resigns and returns nil.
	err = e.Run(ctx, func(leaderCtx context.Context) error {
		term, _ := sovereign.TermFromContext(leaderCtx)
		log.Printf("leading with fencing term %d (an etcd revision)", term)
		<-leaderCtx.Done() // do the work until leadership ends
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
