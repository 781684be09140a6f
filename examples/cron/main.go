// Command cron shows three replicas of a cron runner sharing one schedule:
// at every tick each replica tries the job's lock with TryDo; one runs the
// job, the other two skip it and say who holds it. Their ticks arrive apart,
// the last one after the job has finished: the lock's MinHold keeps it held
// for most of the period, so that replica skips the job too instead of
// running it again. A replica that crashes mid-job loses nothing but its
// run: the lock expires after its TTL. It runs on the in-memory backend, so
// no server is needed. Ctrl-C stops early.
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
		// The replicas' ticks arrive apart, as clocks and schedulers make
		// them: replica-3's comes after the job (a fifth of the period)
		// has finished. Without MinHold the lock would be free by then and
		// replica-3 would run the job a second time.
		key := lock.Key("cron", "nightly-report")
		var wg sync.WaitGroup
		for i, l := range lockers {
			late := time.Duration(i) * every / 5
			wg.Go(func() {
				select {
				case <-time.After(late):
					replica(ctx, l, key, every/5, every*9/10, say)
				case <-ctx.Done():
				}
			})
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

// replica runs the job for one tick, unless another replica does. The
// lock is kept (renewed) for minHold after it was taken, however soon the
// job finishes.
func replica(ctx context.Context, l *lock.Locker, key string, work, minHold time.Duration, say func(string, ...any)) {
	err := l.TryDo(ctx, key, &lock.AcquireOptions{MinHold: minHold}, func(ctx context.Context, lk *lock.Lock) error {
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
