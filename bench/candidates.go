package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// errCrashed is returned by every call of a crashed backend.
var errCrashed = errors.New("bench: process crashed")

// crashable wraps a backend so that a benchmark can simulate a crash of the
// process using it: from the crash instant on, every call fails at once and
// nothing reaches the store, so the lease is neither renewed nor released.
// Armed, it crashes right after the next successful Renew (or RenewBatch
// renewing every lease it was given), so the lease has its full TTL left at
// the crash instant. Use it through compose, which gives it the inner
// backend's optional capabilities.
type crashable struct {
	inner   backend.Backend
	watcher backend.Watcher

	armed   atomic.Bool
	crashed atomic.Bool
	crashAt chan time.Time // capacity 1: the crash instant
}

var _ wrapper = (*crashable)(nil)

func newCrashable(b backend.Backend) *crashable {
	w, _ := b.(backend.Watcher)
	return &crashable{inner: b, watcher: w, crashAt: make(chan time.Time, 1)}
}

// arm makes the backend crash right after the next successful renewal.
func (c *crashable) arm() { c.armed.Store(true) }

func (c *crashable) check() error {
	if c.crashed.Load() {
		return errCrashed
	}
	return nil
}

func (c *crashable) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	if err := c.check(); err != nil {
		return backend.Lease{}, err
	}
	return c.inner.Acquire(ctx, req)
}

func (c *crashable) Renew(ctx context.Context, l backend.Lease) error {
	if err := c.check(); err != nil {
		return err
	}
	err := c.inner.Renew(ctx, l)
	if err == nil && c.armed.CompareAndSwap(true, false) {
		c.crashed.Store(true)
		c.crashAt <- time.Now()
	}
	return err
}

func (c *crashable) Release(ctx context.Context, l backend.Lease) error {
	if err := c.check(); err != nil {
		return err
	}
	return c.inner.Release(ctx, l)
}

func (c *crashable) Get(ctx context.Context, key string) (backend.Record, error) {
	if err := c.check(); err != nil {
		return backend.Record{}, err
	}
	return c.inner.Get(ctx, key)
}

func (c *crashable) SetMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	if err := c.check(); err != nil {
		return err
	}
	return c.inner.SetMetadata(ctx, l, md)
}

func (c *crashable) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return c.inner.List(ctx, prefix)
}

func (c *crashable) ValidateKey(key string) error { return c.inner.ValidateKey(key) }

func (c *crashable) MinTTL() time.Duration { return c.inner.MinTTL() }

func (c *crashable) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	if err := c.check(); err != nil {
		return err
	}
	return c.inner.Heartbeat(ctx, key, id, ttl)
}

func (c *crashable) Members(ctx context.Context, key string) ([]backend.Member, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return c.inner.Members(ctx, key)
}

func (c *crashable) RemoveMember(ctx context.Context, key, id string) error {
	if err := c.check(); err != nil {
		return err
	}
	return c.inner.RemoveMember(ctx, key, id)
}

func (c *crashable) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	if c.watcher == nil {
		return nil, errors.ErrUnsupported
	}
	return c.watcher.Watch(ctx, key)
}

func (c *crashable) watchRenewals(ctx context.Context, inner backend.RenewalWatcher, key string, notify func()) (<-chan backend.Event, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return inner.WatchRenewals(ctx, key, notify)
}

func (c *crashable) watchRenewalsMuted(ctx context.Context, inner backend.RenewalMuter, key string, notify func(), muted *backend.Mute) (<-chan backend.Event, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return inner.WatchRenewalsMuted(ctx, key, notify, muted)
}

func (c *crashable) Close() error { return c.inner.Close() }

func (c *crashable) renewBatch(ctx context.Context, inner backend.BatchRenewer, leases []backend.Lease) []error {
	errs := make([]error, len(leases))
	if err := c.check(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	errs = inner.RenewBatch(ctx, leases)
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	if len(leases) > 0 && c.armed.CompareAndSwap(true, false) {
		c.crashed.Store(true)
		c.crashAt <- time.Now()
	}
	return errs
}

func (c *crashable) heartbeatBatch(ctx context.Context, inner backend.BatchHeartbeater, reqs []backend.HeartbeatRequest) []error {
	if err := c.check(); err != nil {
		errs := make([]error, len(reqs))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	return inner.HeartbeatBatch(ctx, reqs)
}

func (c *crashable) acquireMode(ctx context.Context, inner backend.Modes, req backend.ModeRequest) (backend.Lease, error) {
	if err := c.check(); err != nil {
		return backend.Lease{}, err
	}
	return inner.AcquireMode(ctx, req)
}

func (c *crashable) holders(ctx context.Context, inner backend.Modes, key string) ([]backend.Record, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	return inner.Holders(ctx, key)
}

func (c *crashable) cancelWait(ctx context.Context, inner backend.Modes, key, waitID string) error {
	if err := c.check(); err != nil {
		return err
	}
	return inner.CancelWait(ctx, key, waitID)
}

// kind names a Sovereign backend.
type kind string

const (
	kindRedis   kind = "redis"
	kindCluster kind = "cluster" // the bench's 3-master Redis Cluster
	kindEtcd    kind = "etcd"
)

func (k kind) column() string {
	switch k {
	case kindEtcd:
		return colSovEtcd
	case kindCluster:
		return colSovCluster
	}
	return colSovRedis
}

// env holds the servers every scenario runs against.
type env struct {
	redis    *testredis.Server
	redisBin string // the redis-server binary, for the cluster
	etcd     *etcdServer
	log      *slog.Logger

	names atomic.Int64

	clusterMu sync.Mutex    // guards cluster
	cluster   *redisCluster // started by the first redisCluster call
}

// redisCluster returns the bench's Redis Cluster, starting it on first use.
func (e *env) redisCluster(bin string) (*redisCluster, error) {
	e.clusterMu.Lock()
	defer e.clusterMu.Unlock()
	if e.cluster == nil {
		c, err := startCluster(bin)
		if err != nil {
			return nil, err
		}
		progress("redis cluster on %s", strings.Join(c.Addrs(), ", "))
		e.cluster = c
	}
	return e.cluster, nil
}

// closeCluster stops the Redis Cluster, if it was started.
func (e *env) closeCluster() {
	e.clusterMu.Lock()
	defer e.clusterMu.Unlock()
	if e.cluster != nil {
		e.cluster.Close()
		e.cluster = nil
	}
}

// name returns a fresh election or key name.
func (e *env) name(what string) string {
	return fmt.Sprintf("bench-%s-%d-%d", what, time.Now().UnixNano(), e.names.Add(1))
}

// sovCandidate is one Sovereign instance with its own client (its own
// connections, as a separate process would have).
type sovCandidate struct {
	id       string
	e        *sovereign.Elector
	be       *crashable
	acquired chan time.Time // when this elector became leader
	redisCtr *cmdCounter    // Redis: commands sent
	etcdCtr  *rpcCounter    // etcd: requests sent
	closers  []func()
	once     sync.Once
}

// newSovCandidate starts an elector for election name as instance id.
func (e *env) newSovCandidate(k kind, name, id string, opts sovereign.Options) (*sovCandidate, error) {
	c := &sovCandidate{id: id, acquired: make(chan time.Time, 16)}
	var b backend.Backend
	switch k {
	case kindRedis, kindCluster:
		c.redisCtr = &cmdCounter{}
		var cli interface {
			redisbackend.Client
			Close() error
		}
		if k == kindRedis {
			cli = newRedisClient(e.redis.Addr(), id, c.redisCtr)
		} else {
			rc, err := e.redisCluster(e.redisBin)
			if err != nil {
				return nil, err
			}
			cli = newClusterClient(rc.Addrs(), id, c.redisCtr)
		}
		rb, err := redisbackend.New(cli, nil)
		if err != nil {
			cli.Close()
			return nil, err
		}
		c.closers = append(c.closers, func() { cli.Close() }, func() { rb.Close() })
		b = rb
	case kindEtcd:
		c.etcdCtr = &rpcCounter{}
		cli, err := newEtcdClient(e.etcd, c.etcdCtr)
		if err != nil {
			return nil, err
		}
		eb, err := etcdbackend.New(cli, nil)
		if err != nil {
			cli.Close()
			return nil, err
		}
		c.closers = append(c.closers, func() { cli.Close() }, func() { eb.Close() })
		b = eb
	}
	c.be = newCrashable(b)
	opts.Logger = e.log
	el, err := sovereign.New(compose(c.be, b), name, id, &opts)
	if err != nil {
		c.close()
		return nil, err
	}
	c.e = el
	el.Subscribe(func(ev sovereign.Event) {
		if _, ok := ev.(sovereign.LeadershipAcquired); ok {
			select {
			case c.acquired <- time.Now():
			default:
			}
		}
	})
	if err := el.Start(context.Background()); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// requests returns the number of requests c has sent to its store (for
// Redis not counting pub/sub commands).
func (c *sovCandidate) requests() int64 {
	if c.redisCtr != nil {
		return c.redisCtr.n.Load()
	}
	return c.etcdCtr.requests()
}

// close stops the elector (releasing its lease unless crashed), then closes
// its backend and client. It is idempotent.
func (c *sovCandidate) close() {
	c.once.Do(func() {
		if c.e != nil {
			c.e.Close()
		}
		for i := len(c.closers) - 1; i >= 0; i-- {
			c.closers[i]()
		}
	})
}

// waitSovLeader waits until one of cs leads and returns it and the others.
func waitSovLeader(cs []*sovCandidate, bound time.Duration) (*sovCandidate, error) {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		for _, c := range cs {
			if c.e.IsLeader() {
				return c, nil
			}
		}
		time.Sleep(5 * time.Millisecond) // polling an observable condition
	}
	return nil, fmt.Errorf("no leader among %d candidates within %v", len(cs), bound)
}

// waitFollower waits until c knows a leader and follows it (it has made at
// least one acquisition attempt).
func waitFollower(c *sovCandidate, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if c.e.State() == sovereign.Follower {
			return nil
		}
		time.Sleep(5 * time.Millisecond) // polling an observable condition
	}
	return fmt.Errorf("%s is not a follower within %v (state %v)", c.id, bound, c.e.State())
}

func drain(ch chan time.Time) {
	for {
		select {
		case <-ch:
		default:
			return
		}
	}
}

// elCandidate is one etcd concurrency.Election candidate with its own client
// and session: it campaigns, reports when it is elected, resigns on request
// and campaigns again.
type elCandidate struct {
	id      string
	cli     *clientv3.Client
	ctr     *rpcCounter
	sess    *concurrency.Session
	el      *concurrency.Election
	elected chan time.Time
	resign  chan chan error
	cancel  context.CancelFunc
	done    chan struct{}
}

// newElCandidate starts a candidate on election prefix pfx with a session of
// ttl seconds (0: the default, 60 s).
func (e *env) newElCandidate(pfx, id string, ttl int) (*elCandidate, error) {
	c := &elCandidate{id: id, ctr: &rpcCounter{}, elected: make(chan time.Time, 16),
		resign: make(chan chan error), done: make(chan struct{})}
	cli, err := newEtcdClient(e.etcd, c.ctr)
	if err != nil {
		return nil, err
	}
	c.cli = cli
	var opts []concurrency.SessionOption
	if ttl > 0 {
		opts = append(opts, concurrency.WithTTL(ttl))
	}
	s, err := concurrency.NewSession(cli, opts...)
	if err != nil {
		cli.Close()
		return nil, err
	}
	c.sess = s
	c.el = concurrency.NewElection(s, pfx)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.loop(ctx)
	return c, nil
}

func (c *elCandidate) loop(ctx context.Context) {
	defer close(c.done)
	for ctx.Err() == nil {
		if err := c.el.Campaign(ctx, c.id); err != nil {
			return
		}
		select {
		case c.elected <- time.Now():
		default:
		}
		select {
		case r := <-c.resign:
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			r <- c.el.Resign(rctx)
			cancel()
		case <-ctx.Done():
			return
		}
	}
}

// close ends the candidate gracefully: the session is closed, which revokes
// its lease.
func (c *elCandidate) close() {
	c.cancel()
	<-c.done
	c.sess.Close()
	c.cli.Close()
}

// crash ends the candidate as a crash would: the client is closed without
// revoking the session's lease, which then expires by its TTL.
func (c *elCandidate) crash() {
	c.cli.Close()
	c.cancel()
	<-c.done
}

// armCrash makes the next lease keep-alive response received by c report
// its arrival on the returned channel.
func (c *elCandidate) armCrash() <-chan time.Time {
	ch := make(chan time.Time, 1)
	var once sync.Once
	f := func() {
		once.Do(func() { ch <- time.Now() })
	}
	c.ctr.onKeepAlive.Store(&f)
	return ch
}

// waitCampaigners waits until n candidates have a key under pfx.
func waitCampaigners(cli *clientv3.Client, pfx string, n int64, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := cli.Get(ctx, pfx+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		if err == nil && r.Count >= n {
			return nil
		}
		time.Sleep(5 * time.Millisecond) // polling an observable condition
	}
	return fmt.Errorf("fewer than %d campaigners under %q within %v", n, pfx, bound)
}
