// Command cron shows three replicas of a cron runner sharing one schedule:
// at every tick each replica tries the job's lock with TryDo; one runs the
// job, the other two skip it and say who holds it. A replica that crashes
// mid-job loses nothing but its run: the lock expires after its TTL. It runs
// on the in-memory backend, so no server is needed. Ctrl-C stops early.
//
//	go run ./examples/cron
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
	ticks := flag.Int("ticks", 3, "how many ticks of the schedule to run")
	every := flag.Duration("every", time.Second, "schedule interval")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, *ticks, *every); err != nil {
		fmt.Fprintln(os.Stderr, "cron:", err)
		os.Exit(1)
	}
}

// run runs the schedule on three replicas for ticks ticks.
func run(ctx context.Context, out io.Writer, ticks int, every time.Duration) error {
	start := time.Now()
	var mu sync.Mutex // serialises printing
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, "[%6.3fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}

	store := memorybackend.NewStore()
	var lockers []*lock.Locker
	for _, id := range []string{"replica-1", "replica-2", "replica-3"} {
		b := store.Client()
		defer b.Close()
		l, err := lock.New(b, id, &lock.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		defer l.Close()
		lockers = append(lockers, l)
	}

	t := time.NewTicker(every)
	defer t.Stop()
	for tick := 1; tick <= ticks; tick++ {
		// The replicas' ticks arrive together here. In production they
		// arrive a little apart, and a replica whose tick comes after the
		// run has finished and released the lock would run the job again:
		// record the last run (with the lock's fencing term) where the job
		// writes, and skip a run that is already recorded.
		key := lock.Key("cron", "nightly-report")
		var wg sync.WaitGroup
		for _, l := range lockers {
			wg.Go(func() { replica(ctx, l, key, every/2, say) })
		}
		wg.Wait()
		if tick == ticks {
			break
		}
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// replica runs the job for one tick, unless another replica does.
func replica(ctx context.Context, l *lock.Locker, key string, work time.Duration, say func(string, ...any)) {
	err := l.TryDo(ctx, key, nil, func(ctx context.Context, lk *lock.Lock) error {
		say("%s runs %s (fencing term %d)", l.ID(), key, lk.Term())
		select {
		case <-time.After(work):
			say("%s finished %s", l.ID(), key)
			return nil
		case <-ctx.Done(): // the lock was lost, or Ctrl-C
			return context.Cause(ctx)
		}
	})
	var held *lock.HeldError
	switch {
	case errors.As(err, &held):
		say("%s skips %s: held by %s since %s", l.ID(), key, held.Holder.HolderID,
			held.Holder.AcquiredAt.Local().Format("15:04:05.000"))
	case err != nil:
		say("%s: %s failed: %v", l.ID(), key, err)
	}
}
