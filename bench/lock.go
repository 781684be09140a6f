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
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/redisbackend"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// lockTTL is the TTL of every lock in the lock benchmarks.
const lockTTL = 10 * time.Second

// lockImpl is one lock implementation of the pairs scenario: one client
// (one process) whose workers each acquire and release a key once per call.
type lockImpl struct {
	col      string // table column
	contract bool   // Sovereign through the backend contract, without package lock
	name     string // for progress lines and test names
	server   int    // pid of the redis-server it talks to; 0 for etcd (embedded in this process)
	requests func() int64
	// dials returns the connections dialled so far; nil for etcd.
	dials func() int64
	// worker returns a function that acquires and releases key once, and a
	// function that frees what the worker holds (an etcd session).
	worker func(key string) (pair func(ctx context.Context) error, done func(), err error)
	// held reports whether err says the key was held by someone else.
	held  func(err error) bool
	close func()
}

// redisLockClient returns a counted client named for col.
func (e *env) redisLockClient(name string) (*redis.Client, *cmdCounter) {
	ctr := &cmdCounter{}
	return newRedisClient(e.redis.Addr(), "lock-"+name, ctr), ctr
}

// lockImpls returns every implementation of the pairs scenario, each with
// its own client. On error it closes those already made.
func (e *env) lockImpls() (_ []*lockImpl, err error) {
	var ls []*lockImpl
	defer func() {
		if err != nil {
			for _, l := range ls {
				l.close()
			}
		}
	}()
	noop := func() {}

	// Sovereign through package lock, then through the backend contract
	// alone, on each store.
	for _, k := range []kind{kindRedis, kindEtcd} {
		for _, contract := range []bool{false, true} {
			b, requests, dials, closeB, err := e.sovBackend(k, fmt.Sprintf("locks-%s-%v", k, contract))
			if err != nil {
				return nil, err
			}
			l := &lockImpl{col: k.column(), contract: contract, requests: requests, dials: dials, close: closeB}
			if k == kindRedis {
				l.server = e.redis.PID()
			}
			if contract {
				l.name = k.column() + " (backend contract)"
				l.held = func(err error) bool { return errors.Is(err, backend.ErrHeld) }
				l.worker = func(key string) (func(context.Context) error, func(), error) {
					bk := lock.Prefix + key
					return func(ctx context.Context) error {
						ls, err := b.Acquire(ctx, backend.AcquireRequest{Key: bk, HolderID: "bench", TTL: lockTTL})
						if err != nil {
							return err
						}
						return b.Release(ctx, ls)
					}, noop, nil
				}
			} else {
				lk, err := lock.New(b, "bench", &lock.Options{TTL: lockTTL, Logger: e.log})
				if err != nil {
					closeB()
					return nil, err
				}
				l.name = k.column() + " (package lock)"
				l.close = func() { lk.Close(); closeB() }
				l.held = func(err error) bool { return errors.Is(err, lock.ErrHeld) }
				l.worker = func(key string) (func(context.Context) error, func(), error) {
					return func(ctx context.Context) error {
						h, err := lk.TryAcquire(ctx, key, nil)
						if err != nil {
							return err
						}
						return h.Release(ctx)
					}, noop, nil
				}
			}
			ls = append(ls, l)
		}
	}

	// etcd concurrency.Mutex: one client, one session per worker (two
	// Mutexes of one session on one key would share the key).
	{
		ctr := &rpcCounter{}
		cli, err := newEtcdClient(e.etcd, ctr)
		if err != nil {
			return nil, err
		}
		ls = append(ls, &lockImpl{
			col: colMutex, name: colMutex, requests: ctr.requests,
			close: func() { cli.Close() },
			held:  func(err error) bool { return errors.Is(err, concurrency.ErrLocked) },
			worker: func(key string) (func(context.Context) error, func(), error) {
				s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(lockTTL/time.Second)))
				if err != nil {
					return nil, nil, err
				}
				m := concurrency.NewMutex(s, "/"+key)
				return func(ctx context.Context) error {
					if err := m.TryLock(ctx); err != nil {
						return err
					}
					return m.Unlock(ctx)
				}, func() { s.Close() }, nil
			},
		})
	}

	cli, ctr := e.redisLockClient(colRedsync)
	rs := redsync.New(goredis.NewPool(cli))
	ls = append(ls, &lockImpl{
		col: colRedsync, name: colRedsync, requests: ctr.n.Load, dials: ctr.dials.Load, server: e.redis.PID(),
		close: func() { cli.Close() },
		held:  redsyncHeld,
		worker: func(key string) (func(context.Context) error, func(), error) {
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
			}, noop, nil
		},
	})

	cli2, ctr2 := e.redisLockClient(colRedislock)
	lc := redislock.New(cli2)
	ls = append(ls, &lockImpl{
		col: colRedislock, name: colRedislock, requests: ctr2.n.Load, dials: ctr2.dials.Load, server: e.redis.PID(),
		close: func() { cli2.Close() },
		held:  func(err error) bool { return errors.Is(err, redislock.ErrNotObtained) },
		worker: func(key string) (func(context.Context) error, func(), error) {
			return func(ctx context.Context) error {
				l, err := lc.Obtain(ctx, key, lockTTL, nil)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			}, noop, nil
		},
	})
	return ls, nil
}

// redsyncHeld reports whether a redsync error says the lock is taken.
func redsyncHeld(err error) bool {
	var taken *redsync.ErrTaken
	var nodeTaken *redsync.ErrNodeTaken
	return errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken) || errors.As(err, &nodeTaken)
}

// sovBackend returns a Sovereign backend of kind k with its own counted
// client (named name on Redis), a function returning the requests it has
// sent so far, and a function closing both.
func (e *env) sovBackend(k kind, name string) (backend.Backend, func() int64, func() int64, func(), error) {
	switch k {
	case kindRedis:
		cli, ctr := e.redisLockClient(name)
		rb, err := redisbackend.New(cli, nil)
		if err != nil {
			cli.Close()
			return nil, nil, nil, nil, err
		}
		return rb, ctr.n.Load, ctr.dials.Load, func() { rb.Close(); cli.Close() }, nil
	default:
		ctr := &rpcCounter{}
		cli, err := newEtcdClient(e.etcd, ctr)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		eb, err := etcdbackend.New(cli, nil)
		if err != nil {
			cli.Close()
			return nil, nil, nil, nil, err
		}
		return eb, ctr.requests, nil, func() { eb.Close(); cli.Close() }, nil
	}
}

// lockRun is the outcome of one timed run.
type lockRun struct {
	pairsPerSec      float64
	requestsPerPair  float64 // failed attempts included
	failedPerPair    float64 // attempts that found the key held, per pair
	cpuPerPair       time.Duration
	serverCPUPerPair time.Duration // redis-server; 0 for etcd
	dials            int64         // Redis connections dialled during the run (their commands count as requests)
}

// run makes acquire+release pairs with g goroutines for d, each on its own
// key, or all on one key when shared (then an attempt that finds the key
// held counts as failed and the goroutine tries again at once), and reports
// successful pairs per second and requests per pair.
func (l *lockImpl) run(prefix string, g int, shared bool, d time.Duration) (lockRun, error) {
	workers := make([]func(context.Context) error, g)
	for i := range g {
		key := prefix
		if !shared {
			key = fmt.Sprintf("%s:%d", prefix, i)
		}
		w, done, err := l.worker(key)
		if err != nil {
			return lockRun{}, fmt.Errorf("%s: %w", l.name, err)
		}
		defer done()
		workers[i] = w
	}
	ctx := context.Background()
	try := func(w func(context.Context) error) (bool, error) {
		err := w(ctx)
		if err != nil && shared && l.held(err) {
			return false, nil
		}
		return err == nil, err
	}
	// Warm up, all goroutines at once: scripts loaded, as many connections
	// dialled as the run uses (dialling sends commands of its own).
	warm := make([]error, g)
	var wwg sync.WaitGroup
	for i, w := range workers {
		wwg.Go(func() {
			for range 5 {
				if _, err := try(w); err != nil {
					warm[i] = err
					return
				}
			}
		})
	}
	wwg.Wait()
	if err := errors.Join(warm...); err != nil {
		return lockRun{}, fmt.Errorf("%s warm-up: %w", l.name, err)
	}
	var pairs, failed, errs atomic.Int64
	var firstErr atomic.Pointer[error]
	dialled := func() int64 {
		if l.dials == nil {
			return 0
		}
		return l.dials()
	}
	c0, cpu0, srv0, d0 := l.requests(), cpuTime(), l.serverCPU(), dialled()
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			for time.Now().Before(stop) {
				ok, err := try(w)
				switch {
				case err != nil:
					errs.Add(1)
					firstErr.CompareAndSwap(nil, &err)
				case ok:
					pairs.Add(1)
				default:
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	reqs := l.requests() - c0
	cpu, srv := cpuTime()-cpu0, l.serverCPU()-srv0
	if p := firstErr.Load(); p != nil {
		return lockRun{}, fmt.Errorf("%s: %d errors, first: %w", l.name, errs.Load(), *p)
	}
	n := pairs.Load()
	if n == 0 {
		return lockRun{}, fmt.Errorf("%s: no pair in %v", l.name, d)
	}
	return lockRun{
		pairsPerSec:      float64(n) / el.Seconds(),
		requestsPerPair:  float64(reqs) / float64(n),
		failedPerPair:    float64(failed.Load()) / float64(n),
		cpuPerPair:       cpu / time.Duration(n),
		serverCPUPerPair: srv / time.Duration(n),
		dials:            dialled() - d0,
	}, nil
}

// serverCPU returns the CPU time of the redis-server l talks to, or 0.
func (l *lockImpl) serverCPU() time.Duration {
	if l.server == 0 {
		return 0
	}
	return procCPUTime(l.server)
}

// lockMode is one configuration of the pairs scenario.
type lockMode struct {
	g      int
	shared bool
}

func (m lockMode) String() string {
	switch {
	case m.g == 1:
		return "1 goroutine"
	case m.shared:
		return fmt.Sprintf("%d goroutines, one shared key", m.g)
	}
	return fmt.Sprintf("%d goroutines, distinct keys", m.g)
}

var lockModes = []lockMode{{1, false}, {16, false}, {16, true}}

// Row names of the pairs scenario.
func pairsRow(m lockMode) string { return "Lock TryAcquire+Release pairs/s, " + m.String() }

func contractRow(m lockMode) string {
	return "Lock pairs/s, " + m.String() + ": Sovereign backend contract alone (no package lock)"
}

func ratioRow(m lockMode) string {
	return "Lock pairs/s, " + m.String() + ": Sovereign ÷ best peer on the same store"
}

func cpuRow(m lockMode) string {
	return "Lock: CPU per pair (µs), " + m.String() + ", this process (etcd: with the embedded server)"
}

func contractCPURow(m lockMode) string {
	return "Lock: CPU per pair (µs), " + m.String() + ", this process: Sovereign backend contract alone"
}

func serverCPURow(m lockMode) string {
	return "Lock: redis-server CPU per pair (µs), " + m.String()
}

const (
	rowReqsPerPair       = "Lock: store requests per pair, distinct keys (Redis commands; etcd RPCs)"
	rowReqsPerPairShared = "Lock: store requests per successful pair, one shared key (failed attempts included)"
	rowFailedPerPair     = "Lock: failed attempts per successful pair, one shared key"
)

// locks runs the pairs scenario: every implementation, every mode, in
// interleaved rounds.
func locks(e *env, cfg config, r *results) error {
	ls, err := e.lockImpls()
	if err != nil {
		return err
	}
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	// Rows in a fixed order, whatever runs first.
	for _, m := range lockModes {
		r.row(pairsRow(m), "%.0f")
	}
	r.row(rowReqsPerPair, "%.2f")
	r.row(rowReqsPerPairShared, "%.2f")
	r.row(rowFailedPerPair, "%.2f")
	for _, m := range lockModes {
		r.row(ratioRow(m), "%.2f")
	}
	for _, m := range lockModes[:2] {
		r.row(cpuRow(m), "%.0f")
		r.row(serverCPURow(m), "%.0f")
	}
	for _, m := range lockModes[:2] {
		r.row(contractRow(m), "%.0f")
	}
	for _, m := range lockModes[:2] {
		r.row(contractCPURow(m), "%.0f")
	}
	for round := range cfg.rounds {
		for i := range ls {
			l := ls[(i+round)%len(ls)]
			var reqs []float64
			for _, m := range lockModes {
				if l.contract && m.shared {
					continue
				}
				progress("round %d/%d: lock pairs, %s, %s", round+1, cfg.rounds, l.name, m)
				res, err := l.run(e.name("lock"), m.g, m.shared, cfg.lockDur)
				if err != nil {
					return err
				}
				switch {
				case l.contract:
					r.add(contractRow(m), l.col, "%.0f", res.pairsPerSec)
					r.add(contractCPURow(m), l.col, "%.0f", float64(res.cpuPerPair)/float64(time.Microsecond))
				case m.shared:
					r.add(pairsRow(m), l.col, "%.0f", res.pairsPerSec)
					r.add(rowReqsPerPairShared, l.col, "%.2f", res.requestsPerPair)
					r.add(rowFailedPerPair, l.col, "%.2f", res.failedPerPair)
				default:
					r.add(pairsRow(m), l.col, "%.0f", res.pairsPerSec)
					reqs = append(reqs, res.requestsPerPair)
					r.add(cpuRow(m), l.col, "%.0f", float64(res.cpuPerPair)/float64(time.Microsecond))
					if l.server != 0 {
						r.add(serverCPURow(m), l.col, "%.0f", float64(res.serverCPUPerPair)/float64(time.Microsecond))
					}
				}
			}
			if !l.contract {
				r.add(rowReqsPerPair, l.col, "%.2f", median(reqs))
			}
		}
	}
	for _, m := range lockModes {
		for col, peers := range map[string][]string{
			colSovRedis: {colRedsync, colRedislock},
			colSovEtcd:  {colMutex},
		} {
			sov, ok := r.get(pairsRow(m), col)
			best := 0.0
			for _, p := range peers {
				if v, ok := r.get(pairsRow(m), p); ok {
					best = max(best, v)
				}
			}
			if ok && best > 0 {
				r.add(ratioRow(m), col, "%.2f", sov/best)
			}
		}
	}
	return nil
}
