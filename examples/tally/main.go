// Command tally shows a lock guarding a job that must not run twice: two
// requests to tally the same election arrive at two servers at once. Both
// try the lock "tally/election-42"; one tallies, the other answers at once
// who is already doing it, since when, and under which fencing term, read
// from the lock's record in the same round trip as the failed attempt. It
// runs on the in-memory backend, so no server is needed.
//
//	go run ./examples/tally
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func main() {
	work := flag.Duration("work", 2*time.Second, "how long the tally takes")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *work); err != nil {
		fmt.Fprintln(os.Stderr, "tally:", err)
		os.Exit(1)
	}
}

// run races two requests for the tally of election 42 and returns once both
// are answered.
func run(ctx context.Context, out io.Writer, work time.Duration) error {
	var mu sync.Mutex // serialises printing
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
	}

	store := memorybackend.NewStore() // one store: one simulated Redis or etcd
	key := lock.Key("tally", "election-42")
	servers := []string{"alice@host-a", "bob@host-b"}
	start := make(chan struct{}) // both requests arrive at the same instant
	errs := make(chan error, len(servers))
	for _, id := range servers {
		b := store.Client() // each server has its own connection
		l, err := lock.New(b, id, &lock.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		go func() {
			defer b.Close()
			defer l.Close()
			<-start
			errs <- handle(ctx, l, key, work, say)
		}()
	}
	close(start)
	var errOut error
	for range servers {
		errOut = errors.Join(errOut, <-errs)
	}
	return errOut
}

// handle answers one request: tally, or say who already is.
func handle(ctx context.Context, l *lock.Locker, key string, work time.Duration, say func(string, ...any)) error {
	opts := &lock.AcquireOptions{Metadata: map[string]string{"request": "tally election 42"}}
	err := l.TryDo(ctx, key, opts, func(ctx context.Context, lk *lock.Lock) error {
		say("%s: tallying election 42 (fencing term %d)...", l.ID(), lk.Term())
		select {
		case <-time.After(work): // the tally; a real one stops when ctx is cancelled
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		say("%s: tally of election 42 done", l.ID())
		return nil
	})
	var held *lock.HeldError
	if errors.As(err, &held) {
		h := held.Holder
		say("%s: already in progress, started by %s at %s (term %d, %s)", l.ID(), h.HolderID,
			h.AcquiredAt.Local().Format(time.TimeOnly), h.Term, h.Metadata["request"])
		say("%s: the error reads: %v", l.ID(), err)
		return nil
	}
	return err
}
