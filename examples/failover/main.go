// Command failover shows Sovereign's failover on the in-memory backend: three
// candidates campaign for one election, the leader crashes (it stops dead,
// without releasing its lease), another takes over once the lease has
// expired, then that leader resigns and a third takes over at once. Every
// event is printed with the time it happened. Ctrl-C stops early, resigning
// gracefully.
//
//	go run ./examples/failover
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func main() {
	ttl := flag.Duration("ttl", 2*time.Second, "lease TTL")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *ttl); err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer, ttl time.Duration) error {
	start := time.Now()
	var mu sync.Mutex // serialises printing
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "[%8.3fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	store := memorybackend.NewStore()
	opts := &sovereign.Options{TTL: ttl, Logger: slog.New(slog.DiscardHandler)}
	type candidate struct {
		id     string
		client *memorybackend.Backend
		e      *sovereign.Elector
		dead   atomic.Bool // crashed: a dead process prints nothing
	}
	acquired := make(chan string, 16)
	var cs []*candidate
	for _, id := range []string{"n1", "n2", "n3"} {
		c := &candidate{id: id, client: store.Client()}
		e, err := sovereign.New(c.client, "demo", id, opts)
		if err != nil {
			return err
		}
		c.e = e
		e.Subscribe(func(ev sovereign.Event) {
			if c.dead.Load() {
				return
			}
			switch ev := ev.(type) {
			case sovereign.StateChanged:
				say("%s  %s -> %s", id, ev.From, ev.To)
			case sovereign.LeadershipAcquired:
				say("%s  LEADER, term %d", id, ev.Term)
				acquired <- id
			case sovereign.LeadershipLost:
				say("%s  stopped leading term %d: %s", id, ev.Term, ev.Reason)
			case sovereign.ElectionFailed:
				say("%s  failed step: %v", id, ev.Err)
			}
		})
		cs = append(cs, c)
	}
	defer func() {
		for _, c := range cs {
			c.e.Close() // resigns gracefully if it leads
			c.client.Close()
		}
	}()
	for _, c := range cs {
		go c.e.Run(ctx, func(lctx context.Context) error {
			<-lctx.Done() // a real leader would do its work here
			return nil
		})
	}
	byID := func(id string) *candidate {
		for _, c := range cs {
			if c.id == id {
				return c
			}
		}
		return nil
	}
	wait := func(d time.Duration) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	next := func() (string, bool) {
		select {
		case id := <-acquired:
			return id, true
		case <-ctx.Done():
			return "", false
		}
	}

	first, ok := next()
	if !ok || !wait(ttl) {
		return nil
	}
	crashed := byID(first)
	say("*** %s crashes: its calls fail from now on, its lease is never released ***", first)
	crashAt := time.Now()
	crashed.dead.Store(true)
	crashed.client.Partition()
	second, ok := next()
	if !ok {
		return nil
	}
	failover := time.Since(crashAt)
	rec, _ := byID(second).e.Leader(ctx)
	if !wait(ttl / 2) {
		return nil
	}
	say("*** %s resigns ***", second)
	resignAt := time.Now()
	if err := byID(second).e.Resign(ctx); err != nil {
		return err
	}
	third, ok := next()
	if !ok {
		return nil
	}
	handover := time.Since(resignAt)
	rec3, _ := byID(third).e.Leader(ctx)
	mu.Lock() // events still arrive and print meanwhile
	defer mu.Unlock()
	fmt.Fprintln(out)
	fmt.Fprintf(out, "crash failover: %s took over (term %d) %v after %s crashed (TTL %v)\n",
		second, rec.Term, failover.Round(time.Millisecond), first, ttl)
	fmt.Fprintf(out, "graceful hand-over: %s took over (term %d) %v after %s resigned\n",
		third, rec3.Term, handover.Round(10*time.Microsecond), second)
	return nil
}
