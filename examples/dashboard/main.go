// Command dashboard shows what a lock dashboard reads: locks named
// subject/predicate/resource ("alice/edits/doc-1"), exclusive, shared and
// semaphore permits, held by three processes, listed by prefix with List
// and counted per subject with Stats. It runs on the in-memory backend, so
// no server is needed; List and Stats answer the same on Redis and etcd.
//
//	go run ./examples/dashboard
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, out io.Writer) error {
	store := memorybackend.NewStore()
	var lockers []*lock.Locker
	for _, id := range []string{"proc-1", "proc-2", "proc-3"} {
		b := store.Client()
		defer b.Close()
		l, err := lock.New(b, id, &lock.Options{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		defer l.Close()
		lockers = append(lockers, l)
	}
	p1, p2, p3 := lockers[0], lockers[1], lockers[2]
	shared := &lock.AcquireOptions{Mode: lock.Shared}
	permit := &lock.AcquireOptions{Mode: lock.Shared, Limit: 2}
	for _, t := range []struct {
		l    *lock.Locker
		key  string
		opts *lock.AcquireOptions
	}{
		{p1, "alice/edits/doc-1", nil},
		{p1, "alice/reads/doc-2", shared},
		{p2, "alice/reads/doc-2", shared},
		{p3, "alice/reads/doc-2", shared},
		{p2, "bob/exports/tenant-9", permit},
		{p3, "bob/exports/tenant-9", permit},
		{p1, "bob/exports/tenant-9", permit}, // a third permit of 2: refused
		{p3, "carol:edits:doc-3", nil},       // ":" separates a subject too
		{p2, "alicex/edits/doc-9", nil},      // another subject, though "alice" is a prefix of it
	} {
		_, err := t.l.TryAcquire(ctx, t.key, t.opts)
		var held *lock.HeldError
		switch {
		case errors.As(err, &held):
			fmt.Fprintf(out, "%s: %v\n", t.l.ID(), err)
		case err != nil:
			return err
		}
	}

	// List's prefix is a string prefix, not a level: "alice/" lists one
	// subject, "alice" also lists "alicex/...".
	for _, prefix := range []string{"alice/", "alice"} {
		recs, err := p1.List(ctx, prefix)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "\nList(%q): %d holders\n", prefix, len(recs))
		for _, r := range recs { // one record per holder: a shared key once per reader
			fmt.Fprintf(out, "  %-20s %-9v %-6s term %d, TTL left %v\n", r.Key, r.Mode, r.HolderID, r.Term, r.TTL.Round(time.Second))
		}
	}

	stats, err := p1.Stats(ctx, "")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nStats(\"\"): per subject\n")
	for _, s := range stats {
		fmt.Fprintf(out, "  %-7s %d keys, %d holders (%d shared, %d exclusive), oldest %s on %s\n",
			s.Subject, s.Keys, s.Held, s.Shared, s.Exclusive, s.Oldest.HolderID, s.Oldest.Key)
	}
	return nil
}
