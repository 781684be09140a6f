package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// lockTTL is the TTL of every lock in the lock benchmark.
const lockTTL = 10 * time.Second

// locker is one lock implementation: pair makes a worker that acquires and
// releases key once per call.
type locker struct {
	col    string
	client *redis.Client
	ctr    *cmdCounter
	worker func(key string) func(ctx context.Context) error
	close  func()
}

func (e *env) lockers() ([]*locker, error) {
	var ls []*locker
	mk := func(col string) *locker {
		ctr := &cmdCounter{}
		cli := newRedisClient(e.redis.Addr(), "lock-"+col, ctr)
		l := &locker{col: col, client: cli, ctr: ctr, close: func() { cli.Close() }}
		ls = append(ls, l)
		return l
	}

	sov := mk(colSovRedis)
	rb, err := redisbackend.New(sov.client, nil)
	if err != nil {
		return nil, err
	}
	sov.close = func() { rb.Close(); sov.client.Close() }
	sov.worker = func(key string) func(context.Context) error {
		return func(ctx context.Context) error {
			l, err := rb.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "bench", TTL: lockTTL})
			if err != nil {
				return err
			}
			return rb.Release(ctx, l)
		}
	}

	rsl := mk(colRedsync)
	rs := redsync.New(goredis.NewPool(rsl.client))
	rsl.worker = func(key string) func(context.Context) error {
		m := rs.NewMutex(key, redsync.WithExpiry(lockTTL), redsync.WithTries(1))
		return func(ctx context.Context) error {
			if err := m.LockContext(ctx); err != nil {
				return err
			}
			ok, err := m.UnlockContext(ctx)
			if err == nil && !ok {
				err = errors.New("redsync: unlock reported not ok")
			}
			return err
		}
	}

	rlk := mk(colRedislock)
	lc := redislock.New(rlk.client)
	rlk.worker = func(key string) func(context.Context) error {
		return func(ctx context.Context) error {
			l, err := lc.Obtain(ctx, key, lockTTL, nil)
			if err != nil {
				return err
			}
			return l.Release(ctx)
		}
	}
	return ls, nil
}

// lockRun is the outcome of one timed run.
type lockRun struct {
	pairsPerSec float64
	cmdsPerPair float64
}

// run makes acquire+release pairs on g distinct keys, one goroutine each,
// for d, and reports pairs per second and commands per pair.
func (l *locker) run(prefix string, g int, d time.Duration) (lockRun, error) {
	workers := make([]func(context.Context) error, g)
	for i := range g {
		workers[i] = l.worker(fmt.Sprintf("%s:%d", prefix, i))
	}
	ctx := context.Background()
	// Warm up, all goroutines at once: scripts loaded, as many connections
	// dialled as the run uses (dialling sends commands of its own).
	warm := make([]error, g)
	var wwg sync.WaitGroup
	for i, w := range workers {
		wwg.Go(func() {
			for range 5 {
				if err := w(ctx); err != nil {
					warm[i] = err
					return
				}
			}
		})
	}
	wwg.Wait()
	if err := errors.Join(warm...); err != nil {
		return lockRun{}, fmt.Errorf("%s warm-up: %w", l.col, err)
	}
	var pairs, errs atomic.Int64
	var firstErr atomic.Pointer[error]
	c0 := l.ctr.n.Load()
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				if err := w(ctx); err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
					continue
				}
				pairs.Add(1)
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	cmds := l.ctr.n.Load() - c0
	if p := firstErr.Load(); p != nil {
		return lockRun{}, fmt.Errorf("%s: %d errors, first: %w", l.col, errs.Load(), *p)
	}
	n := pairs.Load()
	return lockRun{
		pairsPerSec: float64(n) / el.Seconds(),
		cmdsPerPair: float64(cmds) / float64(n),
	}, nil
}
