package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// startDemo runs candidates on the in-memory backend b, so that serve
// --demo has something to show: three replicas of a "billing-cron" whose
// leader resigns now and then, a lone "nightly-report", a held lock and a
// shared lock (a semaphore of 3) held by two readers. It returns a function
// that stops them and waits for them.
func startDemo(ctx context.Context, b backend.Backend, prefix string) (stop func(), err error) {
	if _, ok := b.(*memorybackend.Backend); !ok {
		return nil, errors.New("--demo needs --backend memory://")
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var electors []*sovereign.Elector
	for _, id := range []string{"web-1", "web-2", "web-3"} {
		e, err := sovereign.New(b, prefix+"billing-cron", id, &sovereign.Options{
			TTL: 6 * time.Second, Logger: quiet, Metadata: map[string]string{"version": "1.4.2"},
		})
		if err != nil {
			cancel()
			return nil, err
		}
		electors = append(electors, e)
	}
	report, err := sovereign.New(b, prefix+"nightly-report", "batch-7", &sovereign.Options{Logger: quiet})
	if err != nil {
		cancel()
		return nil, err
	}
	electors = append(electors, report)
	for _, e := range electors {
		if err := e.Start(ctx); err != nil {
			cancel()
			return nil, err
		}
	}
	// The billing-cron leader hands over every few seconds.
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(6+rand.IntN(6)) * time.Second):
			}
			for _, e := range electors[:3] {
				if e.IsLeader() {
					_ = e.Resign(ctx)
					break
				}
			}
		}
	})
	// A lock, held and renewed the way package lock stores it.
	wg.Go(func() {
		key := lockPrefix + prefix + "db-migrate"
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "deploy-42", TTL: 15 * time.Second,
			Metadata: map[string]string{"migration": "0042_add_index"}})
		if err != nil {
			return
		}
		keep(ctx, b, l)
	})
	// A shared lock with two holders, each renewed on its own.
	if m, ok := b.(backend.Modes); ok {
		for _, id := range []string{"report-a", "report-b"} {
			wg.Go(func() {
				l, err := m.AcquireMode(ctx, backend.ModeRequest{
					AcquireRequest: backend.AcquireRequest{Key: lockPrefix + prefix + "reports/read", HolderID: id, TTL: 15 * time.Second},
					Mode:           backend.Shared, Limit: 3,
				})
				if err != nil {
					return
				}
				keep(ctx, b, l)
			})
		}
	}
	return func() {
		cancel()
		for _, e := range electors {
			e.Close()
		}
		wg.Wait()
	}, nil
}

// keep renews l every 3 s until ctx ends, then releases it.
func keep(ctx context.Context, b backend.Backend, l backend.Lease) {
	for {
		select {
		case <-ctx.Done():
			_ = b.Release(context.Background(), l)
			return
		case <-time.After(3 * time.Second):
			_ = b.Renew(ctx, l)
		}
	}
}
