package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/sovereign-go/sovereign/lock"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// handoffProcs is the number of processes contending for the lock in the
// hand-off scenario: at each release, all but the holder are waiting.
const handoffProcs = 4

// redislockRetry is the retry interval used for bsm/redislock waiters: the
// LinearBackoff(100 ms) of its README's example (which also limits it to 3
// retries; here a waiter retries until it gets the lock).
const redislockRetry = 100 * time.Millisecond

// handoffProc is one process of the hand-off scenario, with its own client:
// acquire waits until it holds the lock, release releases it.
type handoffProc struct {
	acquire func(ctx context.Context) error
	release func(ctx context.Context) error
	close   func()
}

// handoffImpl is one lock implementation of the hand-off scenario.
type handoffImpl struct {
	col string
	// procs returns n processes contending for key, and a function
	// returning the requests all of them have sent so far.
	procs func(key string, n int) ([]*handoffProc, func() int64, error)
}

func closeProcs(ps []*handoffProc) {
	for _, p := range ps {
		p.close()
	}
}

// handoffImpls returns every implementation of the hand-off scenario.
func (e *env) handoffImpls() []handoffImpl {
	sov := func(k kind) handoffImpl {
		return handoffImpl{col: k.column(), procs: func(key string, n int) (ps []*handoffProc, _ func() int64, err error) {
			defer func() {
				if err != nil {
					closeProcs(ps)
				}
			}()
			var counters []func() int64
			for i := range n {
				b, requests, _, closeB, err := e.sovBackend(k, fmt.Sprintf("handoff-%d", i))
				if err != nil {
					return ps, nil, err
				}
				lk, err := lock.New(b, fmt.Sprintf("proc-%d", i), &lock.Options{TTL: lockTTL, Logger: e.log})
				if err != nil {
					closeB()
					return ps, nil, err
				}
				counters = append(counters, requests)
				var held *lock.Lock // only this process's goroutine touches it
				ps = append(ps, &handoffProc{
					acquire: func(ctx context.Context) error {
						h, err := lk.Acquire(ctx, key, nil)
						held = h
						return err
					},
					release: func(ctx context.Context) error { return held.Release(ctx) },
					close:   func() { lk.Close(); closeB() },
				})
			}
			return ps, sum(counters), nil
		}}
	}
	mutex := handoffImpl{col: colMutex, procs: func(key string, n int) (ps []*handoffProc, _ func() int64, err error) {
		defer func() {
			if err != nil {
				closeProcs(ps)
			}
		}()
		var counters []func() int64
		for range n {
			ctr := &rpcCounter{}
			cli, err := newEtcdClient(e.etcd, ctr)
			if err != nil {
				return ps, nil, err
			}
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(lockTTL/time.Second)))
			if err != nil {
				cli.Close()
				return ps, nil, err
			}
			counters = append(counters, ctr.requests)
			m := concurrency.NewMutex(s, "/"+key)
			ps = append(ps, &handoffProc{
				acquire: m.Lock,
				release: m.Unlock,
				close:   func() { s.Close(); cli.Close() },
			})
		}
		return ps, sum(counters), nil
	}}
	rsync := handoffImpl{col: colRedsync, procs: func(key string, n int) ([]*handoffProc, func() int64, error) {
		var ps []*handoffProc
		var counters []func() int64
		for i := range n {
			cli, ctr := e.redisLockClient(fmt.Sprintf("handoff-redsync-%d", i))
			counters = append(counters, ctr.n.Load)
			// Default retries: 32 tries, 50-250 ms apart (uniform).
			m := redsync.New(goredis.NewPool(cli)).NewMutex(key, redsync.WithExpiry(lockTTL))
			ps = append(ps, &handoffProc{
				acquire: func(ctx context.Context) error {
					for {
						err := m.LockContext(ctx)
						if err == nil || ctx.Err() != nil || !redsyncHeld(err) {
							return err
						}
						// Out of tries: keep waiting, as a caller would.
					}
				},
				release: func(ctx context.Context) error {
					ok, err := m.UnlockContext(ctx)
					if err == nil && !ok {
						err = errors.New("redsync: unlock reported not ok")
					}
					return err
				},
				close: func() { cli.Close() },
			})
		}
		return ps, sum(counters), nil
	}}
	rlock := handoffImpl{col: colRedislock, procs: func(key string, n int) ([]*handoffProc, func() int64, error) {
		var ps []*handoffProc
		var counters []func() int64
		for i := range n {
			cli, ctr := e.redisLockClient(fmt.Sprintf("handoff-redislock-%d", i))
			counters = append(counters, ctr.n.Load)
			c := redislock.New(cli)
			var held *redislock.Lock
			ps = append(ps, &handoffProc{
				acquire: func(ctx context.Context) error {
					// Obtain retries until ctx's deadline (the run's bound).
					l, err := c.Obtain(ctx, key, lockTTL, &redislock.Options{RetryStrategy: redislock.LinearBackoff(redislockRetry)})
					held = l
					return err
				},
				release: func(ctx context.Context) error { return held.Release(ctx) },
				close:   func() { cli.Close() },
			})
		}
		return ps, sum(counters), nil
	}}
	return []handoffImpl{sov(kindRedis), sov(kindEtcd), mutex, rsync, rlock}
}

func sum(fs []func() int64) func() int64 {
	return func() int64 {
		var n int64
		for _, f := range fs {
			n += f()
		}
		return n
	}
}

// handoffResult is the outcome of one hand-off run.
type handoffResult struct {
	delays             []time.Duration
	requestsPerHandoff float64
}

// run measures hand-offs between n processes contending for one key: each
// process, in a loop, waits for the lock (acquire), holds it for a random
// time around hold (uniform in [0.8, 1.2] × hold), records the release
// instant and releases it; then it waits until another process holds the
// lock before it queues again, so each release has n-1 waiters. A sample is
// the time from a release call to the next holder's acquire returning. The
// first warm hand-offs are not recorded (the waiters' first attempts).
func (h handoffImpl) run(key string, n, samples, warm int, hold time.Duration) (handoffResult, error) {
	ps, requests, err := h.procs(key, n)
	if err != nil {
		return handoffResult{}, fmt.Errorf("%s hand-off: %w", h.col, err)
	}
	defer closeProcs(ps)
	bound := time.Duration(samples+warm)*(2*hold+2*time.Second) + 10*time.Second
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()

	var (
		mu       sync.Mutex // guards the fields below
		holder   = -1
		released time.Time // the last release call, zero before the first
		seq      int       // acquisitions so far
		acquired = make(chan struct{})
		out      []time.Duration
		c0, c1   int64
		done     bool
		firstErr error
	)
	fail := func(err error) {
		mu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		done = true
		mu.Unlock()
		cancel()
	}
	c0 = requests()
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Go(func() {
			for {
				err := p.acquire(ctx)
				t1 := time.Now()
				mu.Lock()
				if done {
					mu.Unlock()
					if err == nil {
						_ = p.release(context.Background())
					}
					return
				}
				if err != nil {
					mu.Unlock()
					fail(fmt.Errorf("%s hand-off: process %d: acquire: %w", h.col, i, err))
					return
				}
				if holder >= 0 {
					mu.Unlock()
					fail(fmt.Errorf("%s hand-off: process %d acquired while process %d held the lock", h.col, i, holder))
					return
				}
				holder = i
				if !released.IsZero() {
					seq++
					switch k := seq - warm; {
					case k == 0:
						c0 = requests()
					case k > 0:
						out = append(out, t1.Sub(released))
						if len(out) == samples {
							c1 = requests()
							done = true
						}
					}
				}
				close(acquired)
				acquired = make(chan struct{})
				finished := done
				mu.Unlock()

				if !finished {
					d := hold*4/5 + rand.N(hold*2/5+1)
					time.Sleep(d) // holding the lock, as a real holder would
				}
				mu.Lock()
				holder = -1
				released = time.Now()
				next := acquired
				mu.Unlock()
				if err := p.release(context.Background()); err != nil {
					fail(fmt.Errorf("%s hand-off: process %d: release: %w", h.col, i, err))
					return
				}
				if finished {
					cancel() // ends the waiters
					return
				}
				// Queue again only once another process holds the lock.
				select {
				case <-next:
				case <-ctx.Done():
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return handoffResult{delays: out}, firstErr
	}
	if len(out) < samples {
		return handoffResult{delays: out}, fmt.Errorf("%s hand-off: %d of %d samples within %v", h.col, len(out), samples, bound)
	}
	return handoffResult{delays: out, requestsPerHandoff: float64(c1-c0) / float64(samples)}, nil
}

// handoffs runs the hand-off scenario: every implementation, in interleaved
// rounds.
func handoffs(e *env, cfg config, r *results) error {
	impls := e.handoffImpls()
	what := fmt.Sprintf("Lock hand-off, %d waiting processes, release → next Acquire returns", handoffProcs-1)
	p50, p99 := what+" p50 (ms)", what+" p99 (ms)"
	const reqRow = "Lock hand-off: store requests per hand-off, all processes"
	r.row(p50, "%.1f")
	r.row(p99, "%.1f")
	r.row(reqRow, "%.1f")
	for round := range cfg.rounds {
		for i := range impls {
			im := impls[(i+round)%len(impls)]
			progress("round %d/%d: lock hand-off, %s (%d samples)", round+1, cfg.rounds, im.col, cfg.handoffN)
			res, err := im.run(e.name("handoff"), handoffProcs, cfg.handoffN, handoffProcs, cfg.handoffHold)
			if err != nil {
				return err
			}
			xs := make([]float64, len(res.delays))
			for i, d := range res.delays {
				xs[i] = ms(d)
			}
			r.add(p50, im.col, "%.1f", percentile(xs, 50))
			r.add(p99, im.col, "%.1f", percentile(xs, 99))
			r.add(reqRow, im.col, "%.1f", res.requestsPerHandoff)
		}
	}
	return nil
}
