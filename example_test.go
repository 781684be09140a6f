package sovereign_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// Two replicas campaign for one election over the in-memory backend. The
// first leads until it resigns; the second takes over with a higher term.
func Example() {
	store := memorybackend.NewStore() // one store: one simulated cluster
	opts := &sovereign.Options{TTL: time.Second, NoStartupJitter: true, Logger: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	leading := make(chan *sovereign.Elector)
	run := func(id string) *sovereign.Elector {
		client := store.Client()
		e, err := sovereign.New(client, "scheduler", id, opts)
		if err != nil {
			panic(err)
		}
		go e.Run(ctx, func(lctx context.Context) error {
			term, _ := sovereign.TermFromContext(lctx)
			fmt.Printf("%s leads, term %d\n", id, term)
			leading <- e
			<-lctx.Done() // leader work would run here
			fmt.Printf("%s stops leading\n", id)
			return nil
		})
		return e
	}

	a := run("a")
	<-leading
	b := run("b")
	if err := a.Resign(ctx); err != nil { // returns once a's lease is released
		panic(err)
	}
	<-leading
	b.Close()
	a.Close()
	// Output:
	// a leads, term 1
	// a stops leading
	// b leads, term 2
	// b stops leading
}

// Leader answers "already in progress, started by X at T".
func ExampleElector_Leader() {
	store := memorybackend.NewStore()
	opts := &sovereign.Options{NoStartupJitter: true, Logger: slog.New(slog.DiscardHandler),
		Metadata: map[string]string{"version": "1.4.2"}}
	a, _ := sovereign.New(store.Client(), "migrations", "host-a", opts)
	b, _ := sovereign.New(store.Client(), "migrations", "host-b", opts)
	defer a.Close()
	defer b.Close()

	if _, err := b.Leader(context.Background()); errors.Is(err, sovereign.ErrNoLeader) {
		fmt.Println("nobody leads yet")
	}
	acquired := make(chan struct{})
	a.Subscribe(func(ev sovereign.Event) {
		if _, ok := ev.(sovereign.LeadershipAcquired); ok {
			close(acquired)
		}
	})
	a.Start(context.Background())
	<-acquired

	rec, err := b.Leader(context.Background())
	if err != nil {
		panic(err)
	}
	fmt.Printf("already in progress, started by %s (version %s), term %d, %v ago at most\n",
		rec.HolderID, rec.Metadata["version"], rec.Term, time.Since(rec.AcquiredAt).Round(time.Hour))
	// Output:
	// nobody leads yet
	// already in progress, started by host-a (version 1.4.2), term 1, 0s ago at most
}
