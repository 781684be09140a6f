// Command candidate is one contender of the chaos checker (package
// internal/chaos): it campaigns on one election through redisbackend or
// etcdbackend, reaching the server through the address it is given (its own
// fault proxy), and while it leads it writes to the checker's fenced store
// with its fencing term. With -mode lock it contends for one lock (package
// lock) instead: it loops on Locker.Do, and while it holds the lock it writes
// to the fenced store with the lock's term for a random while, then returns
// so that the lock moves between candidates. With -mode semaphore it does the
// same with a Shared lock of -limit permits (lock.AcquireOptions{Mode:
// lock.Shared, Limit: n}), so that up to n candidates hold the key at once,
// each writing with its own term. It logs every backend call that matters for the
// safety argument, every leadership event and every write as JSON lines
// (chaos.Line) on CLOCK_MONOTONIC, and exits 0 on SIGTERM after a clean
// shutdown with no goroutine left behind.
//
// With -backend cluster it uses a go-redis ClusterClient of a Redis Cluster,
// reaching every node through a proxy of its own (-addr node=proxy,...).
//
// It is built and started by the checker's tests; it is not a user tool.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/chaos"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// Exit codes other than 0.
const (
	exitUsage  = 2
	exitLeak   = 3
	exitFailed = 4
)

type config struct {
	mode          string
	backend       string
	addr          string
	store         string
	id            string
	instance      string
	election      string
	logPath       string
	ttl           time.Duration
	renewDeadline time.Duration
	renewInterval time.Duration
	reqTimeout    time.Duration
	work          time.Duration
	pause         time.Duration
	lockKey       string
	holdMin       time.Duration
	holdMax       time.Duration
	limit         int
	restartGuard  bool
	waitReplicas  int
	waitTimeout   time.Duration
}

func main() {
	var c config
	flag.StringVar(&c.mode, "mode", "elect", "elect (campaign with sovereign.Elector), lock (loop on lock.Locker.Do), trylock (loop on lock.Locker.TryDo: no waiting, so no data-loss wait) or semaphore (loop on Do with a Shared lock of -limit permits)")
	flag.BoolVar(&c.restartGuard, "restart-guard", false, "redis: redisbackend.Options.RestartGuard (the server refuses free keys for a TTL after it starts)")
	flag.StringVar(&c.backend, "backend", "redis", "redis, cluster (a Redis Cluster) or etcd")
	flag.StringVar(&c.addr, "addr", "", "host:port of the backend (the candidate's fault proxy); with -backend cluster, node=proxy,... : every node's address as the cluster announces it, and the candidate's fault proxy in front of it")
	flag.IntVar(&c.waitReplicas, "wait-replicas", 0, "redis, cluster: redisbackend.Options.WaitReplicas")
	flag.DurationVar(&c.waitTimeout, "wait-timeout", 0, "redis, cluster: redisbackend.Options.WaitTimeout (0: its default)")
	flag.StringVar(&c.store, "store", "", "base URL of the fenced store")
	flag.StringVar(&c.id, "id", "", "name of this process: in its log and in its writes to the fenced store; unique per process")
	flag.StringVar(&c.instance, "instance", "", "instance ID the elector campaigns as (default: -id); several processes may share one")
	flag.StringVar(&c.election, "election", "chaos", "election name")
	flag.StringVar(&c.logPath, "log", "", "file for the JSON-lines log (default stdout)")
	flag.DurationVar(&c.ttl, "ttl", 2*time.Second, "lease TTL")
	flag.DurationVar(&c.renewDeadline, "renew-deadline", 1400*time.Millisecond, "renew deadline")
	flag.DurationVar(&c.renewInterval, "renew-interval", 400*time.Millisecond, "renew interval")
	flag.DurationVar(&c.reqTimeout, "request-timeout", 400*time.Millisecond, "bound on every backend call")
	flag.DurationVar(&c.work, "work", 15*time.Millisecond, "time between the leadership check and the write it guards (the window a pause can hit)")
	flag.DurationVar(&c.pause, "pause", 25*time.Millisecond, "time between two writes")
	flag.StringVar(&c.lockKey, "lock-key", "chaos/job", "lock key (-mode lock)")
	flag.DurationVar(&c.holdMin, "hold-min", 500*time.Millisecond, "shortest time the lock is held before the function returns (-mode lock)")
	flag.DurationVar(&c.holdMax, "hold-max", 3*time.Second, "longest time the lock is held before the function returns (-mode lock, semaphore)")
	flag.IntVar(&c.limit, "limit", 2, "permits of the Shared lock (-mode semaphore)")
	flag.Parse()
	if c.addr == "" || c.store == "" || c.id == "" || (c.backend != "redis" && c.backend != "cluster" && c.backend != "etcd") ||
		(c.mode != "elect" && c.mode != "lock" && c.mode != "trylock" && c.mode != "semaphore") || c.holdMin <= 0 || c.holdMax < c.holdMin || c.limit < 1 {
		fmt.Fprintln(os.Stderr, "candidate: -addr, -store, -id, -backend redis|cluster|etcd and -mode elect|lock|trylock|semaphore are required, 0 < -hold-min <= -hold-max and -limit >= 1")
		os.Exit(exitUsage)
	}
	if c.instance == "" {
		c.instance = c.id
	}
	os.Exit(run(c))
}

func run(c config) int {
	var out io.Writer = os.Stdout
	if c.logPath != "" {
		f, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "candidate:", err)
			return exitFailed
		}
		defer f.Close()
		out = f
	}
	lg := chaos.NewLogger(out)
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	baseline := runtime.NumGoroutine()

	var code int
	switch c.mode {
	case "lock", "trylock", "semaphore":
		code = lockLoop(ctx, c, lg)
	default:
		code = campaign(ctx, c, lg)
	}
	stop()
	if code != 0 {
		return code
	}
	// Everything the candidate started must be gone: the elector, the
	// backend, the client, the store client. Give asynchronous teardown
	// (gRPC, closing sockets) a few seconds.
	left := runtime.NumGoroutine()
	for end := time.Now().Add(5 * time.Second); left > baseline && time.Now().Before(end); left = runtime.NumGoroutine() {
		time.Sleep(20 * time.Millisecond) // polling the goroutine count, nothing to synchronise with
	}
	lg.Log(chaos.Line{Ev: chaos.EvExit, T: chaos.Now(), Goroutines: left})
	if left > baseline {
		buf := make([]byte, 1<<20)
		fmt.Fprintf(os.Stderr, "candidate: %d goroutines left, %d at start:\n%s\n", left, baseline, buf[:runtime.Stack(buf, true)])
		return exitLeak
	}
	if err := lg.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "candidate: log:", err)
		return exitFailed
	}
	return 0
}

// campaign runs the elector until ctx ends and returns the exit code.
func campaign(ctx context.Context, c config, lg *chaos.Logger) int {
	inner, closeClient, err := newBackend(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		return exitFailed
	}
	defer closeClient()
	b := &recorder{inner: inner, w: inner.(backend.Watcher), lg: lg}
	defer b.Close()

	opts := &sovereign.Options{
		TTL:            c.ttl,
		RenewDeadline:  c.renewDeadline,
		RenewInterval:  c.renewInterval,
		RequestTimeout: c.reqTimeout,
		Metadata:       map[string]string{"pid": fmt.Sprint(os.Getpid())},
	}
	el, err := sovereign.New(b, c.election, c.instance, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		return exitFailed
	}
	o := el.Options()
	lg.Log(chaos.Line{
		Ev: chaos.EvStart, ID: c.id, Instance: c.instance, Pid: os.Getpid(), T: chaos.Now(),
		OptTTL: int64(o.TTL), OptRenewDeadline: int64(o.RenewDeadline),
		OptRenewInterval: int64(o.RenewInterval), OptHeartbeatTTL: int64(o.HeartbeatTTL),
	})
	unsubscribe := el.Subscribe(func(ev sovereign.Event) {
		switch ev := ev.(type) {
		case sovereign.LeadershipAcquired:
			lg.Log(chaos.Line{Ev: chaos.EvAcquired, Term: ev.Term, T: chaos.Now()})
		case sovereign.LeadershipLost:
			l := chaos.Line{Ev: chaos.EvLost, Term: ev.Term, T: chaos.Now(), Reason: ev.Reason.String()}
			if ev.Err != nil {
				l.Err = ev.Err.Error()
			}
			lg.Log(l)
		}
	})
	defer unsubscribe()

	sc := chaos.NewStoreClient(c.store)
	defer sc.Close()
	w := &writer{c: c, sc: sc, lg: lg}
	lead := func(ctx context.Context) error {
		term, ok := sovereign.TermFromContext(ctx)
		if !ok {
			return errors.New("candidate: leader context without a term")
		}
		return w.work(ctx, term, el.IsLeader, nil)
	}
	if err := el.Run(ctx, lead); err != nil {
		fmt.Fprintln(os.Stderr, "candidate: run:", err)
		return exitFailed
	}
	return 0
}

func newBackend(c config) (backend.Backend, func(), error) {
	switch c.backend {
	case "redis":
		cli := redis.NewClient(&redis.Options{
			Addr:                  c.addr,
			ContextTimeoutEnabled: true,
			DialTimeout:           c.renewInterval,
			PoolSize:              4,
		})
		b, err := redisbackend.New(cli, c.redisOptions())
		if err != nil {
			cli.Close()
			return nil, nil, err
		}
		return b, func() { cli.Close() }, nil
	case "cluster":
		// The cluster announces its nodes' real addresses; the dialer
		// sends every connection to a node through this candidate's
		// proxy for it, so that its faults apply to all of them.
		proxyOf, err := parseNodes(c.addr)
		if err != nil {
			return nil, nil, err
		}
		var d net.Dialer
		addrs := slices.Sorted(maps.Keys(proxyOf))
		cli := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 addrs,
			ContextTimeoutEnabled: true,
			DialTimeout:           c.renewInterval,
			PoolSize:              4,
			Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
				p, ok := proxyOf[addr]
				if !ok {
					return nil, fmt.Errorf("candidate: no proxy for cluster node %s", addr)
				}
				return d.DialContext(ctx, network, p)
			},
		})
		b, err := redisbackend.New(cli, c.redisOptions())
		if err != nil {
			cli.Close()
			return nil, nil, err
		}
		return b, func() { cli.Close() }, nil
	default:
		// The configuration etcdbackend documents for users, with only a
		// silent logger added: the checker tests what users run.
		cfg := etcdbackend.ClientConfig(c.addr)
		cfg.Logger = zap.NewNop()
		cli, err := clientv3.New(cfg)
		if err != nil {
			return nil, nil, err
		}
		b, err := etcdbackend.New(cli, nil)
		if err != nil {
			cli.Close()
			return nil, nil, err
		}
		return b, func() { cli.Close() }, nil
	}
}

func (c config) redisOptions() *redisbackend.Options {
	return &redisbackend.Options{RestartGuard: c.restartGuard, WaitReplicas: c.waitReplicas, WaitTimeout: c.waitTimeout}
}

// parseNodes parses -addr of -backend cluster: node=proxy pairs separated
// by commas.
func parseNodes(s string) (map[string]string, error) {
	m := make(map[string]string)
	for pair := range strings.SplitSeq(s, ",") {
		node, proxy, ok := strings.Cut(pair, "=")
		if !ok || node == "" || proxy == "" {
			return nil, fmt.Errorf("candidate: -addr %q: want node=proxy pairs separated by commas", s)
		}
		m[node] = proxy
	}
	return m, nil
}

// lockLoop contends for one lock until ctx ends and returns the exit code:
// it loops on Locker.Do, whose function does the same work as the leader
// function (writes guarded by Lock.Held, with the lock's term) for a random
// while between -hold-min and -hold-max, then returns so that the lock is
// released and moves on. After Do fails (the store is unreachable, the lock
// was lost), it backs off briefly and tries again. In the semaphore mode the
// lock is Shared with c.limit permits, and the backend is wrapped with its
// backend.Modes, which Shared locks need. (The lock mode's wrapper hides
// Modes, so its Exclusive locks take the plain Acquire path, as before
// the backends had Modes.)
func lockLoop(ctx context.Context, c config, lg *chaos.Logger) int {
	inner, closeClient, err := newBackend(c)
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		return exitFailed
	}
	defer closeClient()
	rec := &recorder{inner: inner, w: inner.(backend.Watcher), lg: lg}
	defer rec.Close()
	var b backend.Backend = rec
	var ao *lock.AcquireOptions
	if c.mode == "semaphore" {
		m, ok := inner.(backend.Modes)
		if !ok {
			fmt.Fprintf(os.Stderr, "candidate: the %s backend has no backend.Modes\n", c.backend)
			return exitFailed
		}
		b = &modesRecorder{recorder: rec, m: m}
		ao = &lock.AcquireOptions{Mode: lock.Shared, Limit: c.limit}
	}

	locker, err := lock.New(b, c.instance, &lock.Options{
		TTL:            c.ttl,
		RenewDeadline:  c.renewDeadline,
		RenewInterval:  c.renewInterval,
		RequestTimeout: c.reqTimeout,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "candidate:", err)
		return exitFailed
	}
	defer locker.Close()
	o := locker.Options()
	lg.Log(chaos.Line{
		Ev: chaos.EvStart, ID: c.id, Instance: c.instance, Pid: os.Getpid(), T: chaos.Now(),
		OptTTL: int64(o.TTL), OptRenewDeadline: int64(o.RenewDeadline),
		OptRenewInterval: int64(o.RenewInterval),
	})

	sc := chaos.NewStoreClient(c.store)
	defer sc.Close()
	w := &writer{c: c, sc: sc, lg: lg}
	fn := func(ctx context.Context, l *lock.Lock) error {
		hold := c.holdMin + rand.N(c.holdMax-c.holdMin+1)
		t := time.NewTimer(hold)
		defer t.Stop()
		return w.work(ctx, l.Term(), l.Held, t.C)
	}
	do := locker.Do
	if c.mode == "trylock" {
		// One attempt at a time, as a cron job's replicas make: TryDo
		// neither waits nor waits out a possible data loss.
		do = locker.TryDo
	}
	for ctx.Err() == nil {
		err := do(ctx, c.lockKey, ao, fn)
		if err == nil || ctx.Err() != nil {
			continue
		}
		// The lock is held, the store is unreachable or the lock was
		// lost: back off briefly (this is the candidate's loop, not a
		// synchronisation).
		select {
		case <-ctx.Done():
		case <-time.After(50*time.Millisecond + rand.N(100*time.Millisecond)):
		}
	}
	return 0
}

// writer is the holder's work: writes to the fenced store, each guarded by a
// check that the leadership (or the lock) is still held.
type writer struct {
	c  config
	sc *chaos.StoreClient
	lg *chaos.Logger
}

// work is the leader function (and the lock mode's function, with the
// lock's term and Lock.Held). Before each write it checks ctx and held, then
// spends c.work before sending the write (with a context that is NOT ctx):
// the gap between a check and the action it guards, which a stop-the-world
// pause can hit. Such a write arrives late with a stale term, and the fenced
// store must reject it. It returns when ctx ends, or when enough (closed or
// sent on) fires: the holder gives the lock up of its own accord.
func (w *writer) work(ctx context.Context, term uint64, held func() bool, enough <-chan time.Time) error {
	w.lg.Log(chaos.Line{Ev: chaos.EvLead, Term: term, T: chaos.Now()})
	defer func() { w.lg.Log(chaos.Line{Ev: chaos.EvFnEnd, Term: term, T: chaos.Now()}) }()
	for seq := uint64(1); ; seq++ {
		pre := chaos.Now()
		if ctx.Err() != nil {
			return nil
		}
		if !held() {
			// The deadline has passed but the context is not cancelled yet:
			// how late is it?
			<-ctx.Done()
			w.lg.Log(chaos.Line{Ev: chaos.EvCtxLag, Term: term, Pre: pre, T: chaos.Now()})
			return nil
		}
		post := chaos.Now()
		time.Sleep(w.c.work) // the guarded action's preparation: deliberately not cancellable
		wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sent := chaos.Now()
		accepted, err := w.sc.Write(wctx, w.c.id, term, seq)
		done := chaos.Now()
		cancel()
		l := chaos.Line{Ev: chaos.EvWrite, Term: term, Seq: seq, Pre: pre, Post: post, Sent: sent, Done: done, Status: chaos.StatusAccepted}
		switch {
		case err != nil:
			l.Status, l.Err = chaos.StatusError, err.Error()
		case !accepted:
			l.Status = chaos.StatusRejected
		}
		w.lg.Log(l)
		select {
		case <-ctx.Done():
			return nil
		case <-enough:
			return nil
		case <-time.After(w.c.pause):
		}
	}
}

// recorder is a backend.Backend (and backend.Watcher) that logs the send and
// completion times of the calls the leader's deadline is computed from.
type recorder struct {
	inner backend.Backend
	w     backend.Watcher
	lg    *chaos.Logger
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (r *recorder) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	sent := chaos.Now()
	l, err := r.inner.Acquire(ctx, req)
	done := chaos.Now()
	if err == nil {
		r.lg.Log(chaos.Line{Ev: chaos.EvAcquire, Term: l.Term, TTL: int64(l.TTL), Sent: sent, Done: done})
	}
	return l, err
}

// modesRecorder is a recorder with the backend's backend.Modes (the
// semaphore mode): AcquireMode is logged as an acquisition, like Acquire;
// the entry's Renew and Release go through the recorder's own methods.
type modesRecorder struct {
	*recorder
	m backend.Modes
}

func (r *modesRecorder) ModeSupport() backend.ModeSupport { return r.m.ModeSupport() }

func (r *modesRecorder) AcquireMode(ctx context.Context, req backend.ModeRequest) (backend.Lease, error) {
	sent := chaos.Now()
	l, err := r.m.AcquireMode(ctx, req)
	done := chaos.Now()
	if err == nil {
		r.lg.Log(chaos.Line{Ev: chaos.EvAcquire, Term: l.Term, TTL: int64(l.TTL), Sent: sent, Done: done})
	}
	return l, err
}

func (r *modesRecorder) Holders(ctx context.Context, key string) ([]backend.Record, error) {
	return r.m.Holders(ctx, key)
}

func (r *modesRecorder) CancelWait(ctx context.Context, key, waitID string) error {
	return r.m.CancelWait(ctx, key, waitID)
}

func (r *recorder) SetMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	return r.inner.SetMetadata(ctx, l, md)
}

func (r *recorder) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	return r.inner.List(ctx, prefix)
}

func (r *recorder) ValidateKey(key string) error { return r.inner.ValidateKey(key) }

func (r *recorder) MinTTL() time.Duration { return r.inner.MinTTL() }

func (r *recorder) Renew(ctx context.Context, l backend.Lease) error {
	sent := chaos.Now()
	err := r.inner.Renew(ctx, l)
	r.lg.Log(chaos.Line{Ev: chaos.EvRenew, Term: l.Term, Sent: sent, Done: chaos.Now(), Err: errString(err)})
	return err
}

func (r *recorder) Release(ctx context.Context, l backend.Lease) error {
	sent := chaos.Now()
	err := r.inner.Release(ctx, l)
	r.lg.Log(chaos.Line{Ev: chaos.EvRelease, Term: l.Term, Sent: sent, Done: chaos.Now(), Err: errString(err)})
	return err
}

func (r *recorder) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	sent := chaos.Now()
	err := r.inner.Heartbeat(ctx, key, id, ttl)
	r.lg.Log(chaos.Line{Ev: chaos.EvHeartbeat, Sent: sent, Done: chaos.Now(), Err: errString(err)})
	return err
}

func (r *recorder) Get(ctx context.Context, key string) (backend.Record, error) {
	return r.inner.Get(ctx, key)
}

func (r *recorder) Members(ctx context.Context, key string) ([]backend.Member, error) {
	return r.inner.Members(ctx, key)
}

func (r *recorder) RemoveMember(ctx context.Context, key, id string) error {
	return r.inner.RemoveMember(ctx, key, id)
}

func (r *recorder) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	return r.w.Watch(ctx, key)
}

func (r *recorder) Close() error { return r.inner.Close() }
