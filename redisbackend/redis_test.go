package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// bound is how long the tests wait for an observable condition on a real
// server before failing.
const bound = 15 * time.Second

func ctxBound(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds, failing after bound.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, bound)
		}
		time.Sleep(10 * time.Millisecond) // polling a real server's state
	}
}

func TestNewValidatesOptions(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	tests := []struct {
		name   string
		client redisbackend.Client
		opts   *redisbackend.Options
	}{
		{"nil client", nil, nil},
		{"prefix with {", c, &redisbackend.Options{Prefix: "a{b:"}},
		{"prefix with }", c, &redisbackend.Options{Prefix: "a}b:"}},
		{"negative WaitReplicas", c, &redisbackend.Options{WaitReplicas: -1}},
		{"negative WaitTimeout", c, &redisbackend.Options{WaitTimeout: -time.Second}},
		{"WaitTimeout below 1ms", c, &redisbackend.Options{WaitReplicas: 1, WaitTimeout: time.Microsecond}},
		{"negative HealthCheckInterval", c, &redisbackend.Options{HealthCheckInterval: -time.Second}},
		{"negative WatchBuffer", c, &redisbackend.Options{WatchBuffer: -1}},
		{"negative TermRetention", c, &redisbackend.Options{TermRetention: -time.Second}},
		{"unknown PubSub mode", c, &redisbackend.Options{PubSub: redisbackend.PubSubMode(42)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := redisbackend.New(tt.client, tt.opts)
			if !errors.Is(err, backend.ErrInvalid) {
				if b != nil {
					_ = b.Close()
				}
				t.Fatalf("New: got error %v, want one wrapping backend.ErrInvalid", err)
			}
		})
	}
	b, err := redisbackend.New(c, nil)
	if err != nil {
		t.Fatalf("New(client, nil): got error %v, want nil", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: got %v, want nil", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: got %v, want nil", err)
	}
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("the user's client after Close: got %v, want it still open", err)
	}
}

// TestKeyLayout checks the documented key names and fields with plain
// commands, as redis-cli would see them.
func TestKeyLayout(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	tests := []struct {
		name, prefix, key, wantBase string
	}{
		{"default prefix", "", "billing", "sovereign:{billing}"},
		{"own prefix", "app:", "billing", "app:{billing}"},
		{"lock key with : and %", "esc:", "lock/a:b%c", "esc:{lock/a:b%c}{}"},
		{"lock key below its root", "esc:", "lock/a:b/c/d:e", "esc:{lock/a:b}{/c/d:e}"},
		{"lock key with an empty root", "esc:", "lock//x", "esc:{lock/}{/x}"},
		{"election key with /", "esc:", "jobs/a/b", "esc:{jobs/a/b}"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBackend(t, c, &redisbackend.Options{Prefix: tt.prefix})
			l, err := b.Acquire(ctx, backend.AcquireRequest{Key: tt.key, HolderID: "node-1", TTL: 30 * time.Second,
				Metadata: map[string]string{"addr": "10.0.0.1"}})
			if err != nil {
				t.Fatalf("Acquire: got %v, want nil", err)
			}
			if err := b.Heartbeat(ctx, tt.key, "node-1", 20*time.Second); err != nil {
				t.Fatalf("Heartbeat: got %v, want nil", err)
			}
			h, err := c.HGetAll(ctx, tt.wantBase).Result()
			if err != nil {
				t.Fatalf("HGETALL %s: %v", tt.wantBase, err)
			}
			want := map[string]string{"holder": "node-1", "token": l.Token, "term": strconv.FormatUint(l.Term, 10),
				"ttl": "30000", "meta:addr": "10.0.0.1"}
			for k, v := range want {
				if h[k] != v {
					t.Errorf("HGETALL %s field %s: got %q, want %q", tt.wantBase, k, h[k], v)
				}
			}
			if ms, err := strconv.ParseInt(h["acquired_at"], 10, 64); err != nil || time.Since(time.UnixMilli(ms)).Abs() > time.Minute {
				t.Errorf("field acquired_at: got %q, want a unix time in ms near now", h["acquired_at"])
			}
			if v, ok := h["renewed_at"]; ok {
				t.Errorf("field renewed_at: got %q, want none (RenewedAt is derived from the expiry)", v)
			}
			if pttl := c.PTTL(ctx, tt.wantBase).Val(); pttl <= 0 || pttl > 30*time.Second {
				t.Errorf("PTTL %s: got %v, want in (0, 30s]", tt.wantBase, pttl)
			}
			if got := c.Get(ctx, tt.wantBase+":term").Val(); got != strconv.FormatUint(l.Term, 10) {
				t.Errorf("GET %s:term: got %q, want %d", tt.wantBase, got, l.Term)
			}
			if pttl := c.PTTL(ctx, tt.wantBase+":term").Val(); pttl <= 30*time.Second || pttl > time.Minute {
				t.Errorf("PTTL %s:term: got %v, want about 1m (the default TermRetention)", tt.wantBase, pttl)
			}
			hb := c.HGetAll(ctx, tt.wantBase+":heartbeat:node-1").Val()
			if hb["ttl"] != "20000" || hb["at"] == "" {
				t.Errorf("HGETALL %s:heartbeat:node-1: got %v, want at and ttl=20000", tt.wantBase, hb)
			}
			if got := c.SMembers(ctx, tt.wantBase+":members").Val(); !slices.Equal(got, []string{"node-1"}) {
				t.Errorf("SMEMBERS %s:members: got %v, want [node-1]", tt.wantBase, got)
			}
			if err := b.Release(ctx, l); err != nil {
				t.Fatalf("Release: %v", err)
			}
			if n := c.Exists(ctx, tt.wantBase).Val(); n != 0 {
				t.Errorf("EXISTS %s after Release: got %d, want 0", tt.wantBase, n)
			}
			if got := c.Get(ctx, tt.wantBase+":term").Val(); got != strconv.FormatUint(l.Term, 10) {
				t.Errorf("GET %s:term after Release: got %q, want %d (the counter survives)", tt.wantBase, got, l.Term)
			}
		})
	}
}

// TestWrongType puts foreign data at each of our paths and checks that the
// operations touching it fail with ErrWrongType and leave it as it was.
func TestWrongType(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	const key = "k"
	type op struct {
		name string
		call func(b *redisbackend.Backend) error
	}
	lease := backend.Lease{Key: key, HolderID: "a", Token: "t", Term: 1, TTL: time.Minute}
	acquire := op{"Acquire", func(b *redisbackend.Backend) error {
		_, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute})
		return err
	}}
	renew := op{"Renew", func(b *redisbackend.Backend) error { return b.Renew(ctx, lease) }}
	release := op{"Release", func(b *redisbackend.Backend) error { return b.Release(ctx, lease) }}
	setMetadata := op{"SetMetadata", func(b *redisbackend.Backend) error {
		return b.SetMetadata(ctx, lease, map[string]string{"x": "y"})
	}}
	get := op{"Get", func(b *redisbackend.Backend) error { _, err := b.Get(ctx, key); return err }}
	heartbeat := op{"Heartbeat", func(b *redisbackend.Backend) error { return b.Heartbeat(ctx, key, "a", time.Minute) }}
	members := op{"Members", func(b *redisbackend.Backend) error { _, err := b.Members(ctx, key); return err }}
	remove := op{"RemoveMember", func(b *redisbackend.Backend) error { return b.RemoveMember(ctx, key, "a") }}

	tests := []struct {
		name   string
		suffix string // after "<prefix>{k}"
		put    func(k string) error
		ops    []op
	}{
		{"string at lease", "", func(k string) error { return c.Set(ctx, k, "user data", 0).Err() },
			[]op{acquire, renew, release, setMetadata, get}},
		{"foreign hash at lease", "", func(k string) error { return c.HSet(ctx, k, "name", "user").Err() },
			[]op{acquire, renew, release, setMetadata, get}},
		{"list at term", ":term", func(k string) error { return c.RPush(ctx, k, "x").Err() }, []op{acquire}},
		{"non-integer string at term", ":term", func(k string) error { return c.Set(ctx, k, "abc", 0).Err() }, []op{acquire}},
		{"negative integer at term", ":term", func(k string) error { return c.Set(ctx, k, "-5", 0).Err() }, []op{acquire}},
		// Terms are Lua numbers in the scripts, exact only below 2^53.
		{"integer 2^53-1 at term", ":term", func(k string) error { return c.Set(ctx, k, "9007199254740991", 0).Err() }, []op{acquire}},
		{"string at heartbeat", ":heartbeat:a", func(k string) error { return c.Set(ctx, k, "user data", 0).Err() },
			[]op{heartbeat, remove}},
		{"foreign hash at heartbeat", ":heartbeat:a", func(k string) error { return c.HSet(ctx, k, "name", "user").Err() },
			[]op{heartbeat, remove}},
		{"string at members", ":members", func(k string) error { return c.Set(ctx, k, "user data", 0).Err() },
			[]op{heartbeat, members, remove}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := fmt.Sprintf("wt%d:", i)
			path := prefix + "{" + key + "}" + tt.suffix
			if err := tt.put(path); err != nil {
				t.Fatalf("putting user data at %s: %v", path, err)
			}
			before, err := c.Dump(ctx, path).Result()
			if err != nil {
				t.Fatalf("DUMP %s: %v", path, err)
			}
			b := newBackend(t, c, &redisbackend.Options{Prefix: prefix})
			if recs, err := b.List(ctx, ""); err != nil || len(recs) != 0 {
				t.Errorf("List: got %d records, error %v; want none (foreign data is not a lease)", len(recs), err)
			}
			for _, o := range tt.ops {
				err := o.call(b)
				if !errors.Is(err, redisbackend.ErrWrongType) {
					t.Errorf("%s: got error %v, want one wrapping ErrWrongType", o.name, err)
				} else if !strings.Contains(err.Error(), path) {
					t.Errorf("%s: got message %q, want it to name %s", o.name, err, path)
				}
			}
			after, err := c.Dump(ctx, path).Result()
			if err != nil || after != before {
				t.Fatalf("user data at %s after the calls: changed (err %v), want untouched", path, err)
			}
			if ttl := c.PTTL(ctx, path).Val(); ttl != -1*time.Nanosecond && ttl != -1*time.Millisecond {
				t.Fatalf("PTTL %s: got %v, want no expiry (untouched)", path, ttl)
			}
		})
	}
}

// closedPort returns a loopback address nobody listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// silentServer accepts connections and never answers, like a hung server.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestUnreachable checks that every call returns an error by its context's
// deadline when the server is down or hangs, whether or not the client
// applies context deadlines itself.
func TestUnreachable(t *testing.T) {
	const deadline = 300 * time.Millisecond
	const slack = 700 * time.Millisecond
	servers := []struct {
		name string
		addr func(t *testing.T) string
	}{
		{"closed port", closedPort},
		{"silent server", silentServer},
	}
	for _, srv := range servers {
		for _, ctxAware := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/ContextTimeoutEnabled=%v", srv.name, ctxAware), func(t *testing.T) {
				c := redis.NewClient(&redis.Options{Addr: srv.addr(t), ContextTimeoutEnabled: ctxAware,
					ReadTimeout: 2 * time.Second, DialTimeout: 2 * time.Second})
				t.Cleanup(func() { _ = c.Close() })
				b := newBackend(t, c, nil)
				lease := backend.Lease{Key: "k", HolderID: "a", Token: "t", Term: 1, TTL: time.Second}
				calls := map[string]func(ctx context.Context) error{
					"Acquire": func(ctx context.Context) error {
						_, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Second})
						return err
					},
					"Renew":     func(ctx context.Context) error { return b.Renew(ctx, lease) },
					"Release":   func(ctx context.Context) error { return b.Release(ctx, lease) },
					"Get":       func(ctx context.Context) error { _, err := b.Get(ctx, "k"); return err },
					"Heartbeat": func(ctx context.Context) error { return b.Heartbeat(ctx, "k", "a", time.Second) },
					"Members":   func(ctx context.Context) error { _, err := b.Members(ctx, "k"); return err },
					"Watch":     func(ctx context.Context) error { _, err := b.Watch(ctx, "k"); return err },
				}
				for name, call := range calls {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					start := time.Now()
					err := call(ctx)
					took := time.Since(start)
					cancel()
					if err == nil {
						t.Errorf("%s: got nil error, want one", name)
					}
					if took > deadline+slack {
						t.Errorf("%s: returned after %v, want by the deadline %v (+%v)", name, took, deadline, slack)
					}
					if !strings.HasPrefix(err.Error(), "redisbackend: ") {
						t.Errorf("%s: got error %q, want it wrapped with the package and operation", name, err)
					}
				}
			})
		}
	}
}

// TestWaitReplicas: WAIT for one replica fails clearly on a server without
// replicas, and succeeds with one.
func TestWaitReplicas(t *testing.T) {
	// No delay before the diskless full sync of a new replica (Redis 7: 5 s).
	primary := testredis.StartConfig(t, testredis.Config{Args: []string{"--repl-diskless-sync-delay", "0"}})
	c := primary.NewClient(t, nil)
	ctx := ctxBound(t)
	const waitTimeout = 200 * time.Millisecond

	t.Run("no replica", func(t *testing.T) {
		b := newBackend(t, c, &redisbackend.Options{Prefix: "w0:", WaitReplicas: 1, WaitTimeout: waitTimeout})
		start := time.Now()
		_, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
		if took := time.Since(start); took > waitTimeout+2*time.Second {
			t.Errorf("Acquire took %v, want about WaitTimeout %v", took, waitTimeout)
		}
		if !errors.Is(err, redisbackend.ErrNotReplicated) {
			t.Fatalf("Acquire: got %v, want an error wrapping ErrNotReplicated", err)
		}
		if !strings.Contains(err.Error(), "0 of 1 replicas") || !strings.Contains(err.Error(), "released") {
			t.Errorf("Acquire: got message %q, want it to say 0 of 1 replicas and that the lease was released", err)
		}
		// The lease the failed Acquire took on the primary was released, so
		// the key is free for the same candidate's next attempt.
		if n := c.Exists(ctx, "w0:{k}").Val(); n != 0 {
			t.Errorf("EXISTS w0:{k} after the failed Acquire: got %d, want 0", n)
		}
		if _, err := b.Get(ctx, "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("Get after the failed Acquire: got %v, want ErrNotHeld", err)
		}
		plain := newBackend(t, c, &redisbackend.Options{Prefix: "w0:"})
		if _, err := plain.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}); err != nil {
			t.Errorf("next Acquire of the same candidate (without WAIT): got %v, want nil", err)
		}
		// Renew of a lease acquired without WAIT fails the same way.
		l, err := plain.Acquire(ctx, backend.AcquireRequest{Key: "k2", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire without WAIT: %v", err)
		}
		if err := b.Renew(ctx, l); !errors.Is(err, redisbackend.ErrNotReplicated) {
			t.Fatalf("Renew: got %v, want an error wrapping ErrNotReplicated", err)
		}
	})

	t.Run("one replica", func(t *testing.T) {
		if primary.External() {
			t.Skip("REDIS_ADDR is set: cannot attach a replica")
		}
		host, port, _ := net.SplitHostPort(primary.Addr())
		replica := testredis.StartConfig(t, testredis.Config{Args: []string{"--replicaof", host, port}})
		rc := replica.NewClient(t, nil)
		eventually(t, "replica link up", func() bool {
			info, _ := rc.Info(ctx, "replication").Result()
			return strings.Contains(info, "master_link_status:up")
		})
		b := newBackend(t, c, &redisbackend.Options{Prefix: "w1:", WaitReplicas: 1, WaitTimeout: 5 * time.Second})
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire with a replica: got %v, want nil", err)
		}
		if err := b.Renew(ctx, l); err != nil {
			t.Fatalf("Renew with a replica: got %v, want nil", err)
		}
		// WAIT returned, so the replica has the lease already.
		if got := rc.HGet(ctx, "w1:{k}", "token").Val(); got != l.Token {
			t.Fatalf("token on the replica: got %q, want %q", got, l.Token)
		}
	})
}

// countHook counts the commands and pipelines a client sends.
type countHook struct {
	n atomic.Int64
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestOneRoundTrip checks that each operation is one round trip once its
// script is loaded, with and without WAIT. An Acquire whose WAIT fails takes
// a second one, to release the lease again.
func TestOneRoundTrip(t *testing.T) {
	srv := testredis.Start(t)
	ctx := ctxBound(t)
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("WaitReplicas=%d", wait), func(t *testing.T) {
			c := srv.NewClient(t, nil)
			hook := &countHook{}
			c.AddHook(hook)
			if err := c.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			prefix := fmt.Sprintf("rt%d:", wait)
			b := newBackend(t, c, &redisbackend.Options{Prefix: prefix, WaitReplicas: wait,
				WaitTimeout: time.Millisecond})
			plain := newBackend(t, c, &redisbackend.Options{Prefix: prefix})
			var l backend.Lease
			ops := []struct {
				name string
				call func() error
			}{
				{"Acquire", func() (err error) {
					l, err = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
					return err
				}},
				{"Renew", func() error { return b.Renew(ctx, l) }},
				{"SetMetadata", func() error { return b.SetMetadata(ctx, l, map[string]string{"a": "b"}) }},
				{"Get", func() error { _, err := b.Get(ctx, "k"); return err }},
				{"Heartbeat", func() error { return b.Heartbeat(ctx, "k", "a", time.Minute) }},
				{"Members", func() error { _, err := b.Members(ctx, "k"); return err }},
				{"RemoveMember", func() error { return b.RemoveMember(ctx, "k", "a") }},
				{"Release", func() error { return b.Release(ctx, l) }},
			}
			for round := range 2 { // round 0 loads the scripts (NOSCRIPT, then EVAL)
				for _, op := range ops {
					hook.n.Store(0)
					err := op.call()
					if err != nil && !errors.Is(err, redisbackend.ErrNotReplicated) {
						t.Fatalf("round %d %s: %v", round, op.name, err)
					}
					want := int64(1)
					if op.name == "Acquire" && wait > 0 {
						want = 2 // EVALSHA+WAIT, then the release after WAIT failed
					}
					if got := hook.n.Load(); round == 1 && got != want {
						t.Errorf("%s: got %d round trips, want %d", op.name, got, want)
					}
					if op.name == "Acquire" && err != nil { // WAIT failed and the lease was released: take it without WAIT to go on
						if l, err = plain.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}); err != nil {
							t.Fatalf("round %d Acquire without WAIT: %v", round, err)
						}
					}
				}
			}
		})
	}
}

// TestWatchAcrossClients: a release by one client reaches a watcher on
// another, and all watches of a Backend share one pub/sub connection.
func TestWatchAcrossClients(t *testing.T) {
	srv := testredis.Start(t)
	ctx := ctxBound(t)
	admin := srv.NewClient(t, nil)
	watcher := newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: "wx:"})
	actor := newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{Prefix: "wx:"})

	const keys = 20
	chans := make([]<-chan backend.Event, keys)
	for i := range keys {
		ch, err := watcher.Watch(ctx, fmt.Sprintf("key-%d", i))
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		chans[i] = ch
	}
	if n := pubsubClients(t, ctx, admin); n != 1 {
		t.Fatalf("pub/sub connections after %d watches: got %d, want 1", keys, n)
	}
	l, err := actor.Acquire(ctx, backend.AcquireRequest{Key: "key-7", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if got := next(t, chans[7]); got.Type != backend.EventChanged || got.Key != "key-7" {
		t.Fatalf("event after Acquire: got %+v, want changed on key-7", got)
	}
	if err := actor.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if got := next(t, chans[7]); got.Type != backend.EventReleased || got.Key != "key-7" {
		t.Fatalf("event after Release: got %+v, want released on key-7", got)
	}
	for i, ch := range chans {
		if i == 7 {
			continue
		}
		select {
		case e := <-ch:
			t.Fatalf("watch of key-%d: got %+v, want nothing", i, e)
		default:
		}
	}
}

func pubsubClients(t *testing.T, ctx context.Context, c *redis.Client) int {
	t.Helper()
	list, err := c.Do(ctx, "CLIENT", "LIST", "TYPE", "pubsub").Text()
	if err != nil {
		t.Fatalf("CLIENT LIST TYPE pubsub: %v", err)
	}
	return strings.Count(list, "\n")
}

// next returns the next event on ch, failing after bound or when ch closes.
func next(t *testing.T, ch <-chan backend.Event) backend.Event {
	t.Helper()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed, want an event")
		}
		return e
	case <-time.After(bound):
		t.Fatalf("no event within %v", bound)
	}
	return backend.Event{}
}

// closedWithin fails unless ch is closed within bound (events may come first).
func closedWithin(t *testing.T, ch <-chan backend.Event) {
	t.Helper()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatalf("watch channel not closed within %v", bound)
		}
	}
}

// TestWatchConnectionLoss: when the shared pub/sub connection breaks, or
// the server restarts (with or without persistence, cleanly or after a
// crash), every watch channel closes promptly, and a new Watch works again.
// The caller (the elector, the lock package) treats the closed channel as a
// reset: it re-reads and re-subscribes.
func TestWatchConnectionLoss(t *testing.T) {
	tests := []struct {
		name      string
		cfg       testredis.Config
		break_    func(t *testing.T, srv *testredis.Server, admin *redis.Client)
		leaseKept bool // the lease taken before the break is still there after it
	}{
		{"CLIENT KILL TYPE pubsub", testredis.Config{}, func(t *testing.T, _ *testredis.Server, admin *redis.Client) {
			if err := admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
				t.Fatalf("CLIENT KILL: %v", err)
			}
		}, true},
		// testredis's default: --save "" --appendonly no.
		{"restart without persistence", testredis.Config{}, func(t *testing.T, srv *testredis.Server, _ *redis.Client) {
			srv.Restart(t)
		}, false},
		{"restart with persistence", testredis.Config{Persistent: true}, func(t *testing.T, srv *testredis.Server, _ *redis.Client) {
			srv.Restart(t)
		}, true},
		{"crash (SIGKILL) with persistence, then start", testredis.Config{Persistent: true}, func(t *testing.T, srv *testredis.Server, _ *redis.Client) {
			srv.Kill(t)
			srv.Start(t)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := testredis.StartConfig(t, tt.cfg)
			ctx := ctxBound(t)
			admin := srv.NewClient(t, nil)
			b := newBackend(t, srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true}), nil)
			held, err := b.Acquire(ctx, backend.AcquireRequest{Key: "held", HolderID: "x", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			a, err := b.Watch(ctx, "a")
			if err != nil {
				t.Fatal(err)
			}
			bb, err := b.Watch(ctx, "b")
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			tt.break_(t, srv, admin)
			closedWithin(t, a)
			closedWithin(t, bb)
			t.Logf("watches closed %v after the break began", time.Since(start).Round(time.Millisecond))

			eventually(t, "client reconnected", func() bool { return admin.Ping(ctx).Err() == nil })
			err = b.Renew(ctx, held)
			if tt.leaseKept && err != nil {
				t.Errorf("Renew of the lease taken before: got %v, want nil (the data survived)", err)
			}
			if !tt.leaseKept && !errors.Is(err, backend.ErrLeaseLost) {
				t.Errorf("Renew of the lease taken before: got %v, want ErrLeaseLost (the data is gone)", err)
			}
			again, err := b.Watch(ctx, "a")
			if err != nil {
				t.Fatalf("Watch after the break: got %v, want nil", err)
			}
			if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "a", HolderID: "x", TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			if got := next(t, again); got.Type != backend.EventChanged {
				t.Fatalf("event on the new watch: got %+v, want changed", got)
			}
		})
	}
}

// TestWatchEndsWithContext: cancelling a watch's context closes its channel
// and, for the last watch of a key, unsubscribes; the other watches go on.
func TestWatchEndsWithContext(t *testing.T) {
	srv := testredis.Start(t)
	ctx := ctxBound(t)
	admin := srv.NewClient(t, nil)
	b := newBackend(t, srv.NewClient(t, nil), nil)
	wctx1, cancel1 := context.WithCancel(ctx)
	wctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	w1, err := b.Watch(wctx1, "k")
	if err != nil {
		t.Fatal(err)
	}
	w2, err := b.Watch(wctx2, "k")
	if err != nil {
		t.Fatal(err)
	}
	numsub := func() int64 { return numSub(t, admin, "sovereign:{k}:events") }
	if n := numsub(); n != 1 {
		t.Fatalf("subscribers of the channel with two watches: got %d, want 1 (shared)", n)
	}
	cancel1()
	closedWithin(t, w1)
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "x", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got := next(t, w2); got.Type != backend.EventChanged {
		t.Fatalf("event on the remaining watch: got %+v, want changed", got)
	}
	cancel2()
	closedWithin(t, w2)
	eventually(t, "unsubscribed after the last watch", func() bool { return numsub() == 0 })
}

// TestWatchNeverBlocks: a watcher that never reads does not stall the
// others; its channel holds the first events.
func TestWatchNeverBlocks(t *testing.T) {
	srv := testredis.Start(t)
	ctx := ctxBound(t)
	b := newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{WatchBuffer: 2})
	stuck, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	live, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "x", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if got := next(t, live); got.Type != backend.EventChanged {
			t.Fatalf("round %d: got %+v, want changed", i, got)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if got := next(t, live); got.Type != backend.EventReleased {
			t.Fatalf("round %d: got %+v, want released", i, got)
		}
	}
	if got := len(stuck); got != 2 {
		t.Fatalf("buffered events of the unread watch: got %d, want 2 (its buffer)", got)
	}
}

// TestCluster runs the conformance suite on a one-node Redis Cluster through
// a ClusterClient: every script's keys share one hash slot, and watches use
// sharded pub/sub.
func TestCluster(t *testing.T) {
	backendtest.Run(t, realEnvs(t, true))
	srv := testredis.StartConfig(t, testredis.Config{Cluster: true})
	t.Run("List on every master", func(t *testing.T) {
		ctx := ctxBound(t)
		b := newBackend(t, srv.NewClusterClient(t, nil), &redisbackend.Options{Prefix: "cl:"})
		var want []string
		for i := range 50 { // spread over many slots
			key := fmt.Sprintf("lock/%02d", i)
			want = append(want, key)
			if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "x", TTL: time.Minute}); err != nil {
				t.Fatal(err)
			}
			if err := b.Heartbeat(ctx, key, "x", time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		recs, err := b.List(ctx, "lock/")
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		if got := listedKeys(recs); !slices.Equal(got, want) {
			t.Fatalf("List: got %q, want %q", got, want)
		}
	})
	t.Run("WAIT routed to the key's node", func(t *testing.T) {
		ctx := ctxBound(t)
		b := newBackend(t, srv.NewClusterClient(t, nil),
			&redisbackend.Options{Prefix: "cw:", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
		_, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "x", TTL: time.Minute})
		if !errors.Is(err, redisbackend.ErrNotReplicated) {
			t.Fatalf("Acquire: got %v, want an error wrapping ErrNotReplicated", err)
		}
	})
	t.Run("sharded pub/sub", func(t *testing.T) {
		ctx := ctxBound(t)
		c := srv.NewClusterClient(t, nil)
		b := newBackend(t, c, &redisbackend.Options{Prefix: "sh:"})
		ch, err := b.Watch(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		admin := srv.NewClient(t, nil)
		m, err := admin.Do(ctx, "PUBSUB", "SHARDNUMSUB", "sh:{k}:events").Slice()
		if err != nil || len(m) != 2 || m[1] != int64(1) {
			t.Fatalf("PUBSUB SHARDNUMSUB: got %v, %v; want one sharded subscriber", m, err)
		}
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "x", TTL: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if got := next(t, ch); got.Type != backend.EventChanged {
			t.Fatalf("got %+v, want changed", got)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if got := next(t, ch); got.Type != backend.EventReleased {
			t.Fatalf("got %+v, want released", got)
		}
	})
}

// TestWatchHealthCheck: an idle watch survives many health-check pings, and
// a server that stops answering (SIGSTOP) breaks the watch within two
// intervals.
func TestWatchHealthCheck(t *testing.T) {
	srv := testredis.Start(t)
	ctx := ctxBound(t)
	const interval = 50 * time.Millisecond
	b := newBackend(t, srv.NewClient(t, nil), &redisbackend.Options{HealthCheckInterval: interval})
	ch, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.NewClient(t, nil)
	// Let several intervals pass, counted on the server: the idle watch
	// connection is pinged once per quiet interval.
	eventually(t, "five pings from the watch connection", func() bool {
		return redisbackend.CommandCalls(ctx, admin, "ping") >= 5
	})
	select {
	case e, ok := <-ch:
		t.Fatalf("watch while idle: got %+v (open %v), want nothing", e, ok)
	default:
	}
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "x", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got := next(t, ch); got.Type != backend.EventChanged {
		t.Fatalf("event after pings: got %+v, want changed", got)
	}
	srv.Pause(t)
	defer srv.Resume(t)
	start := time.Now()
	closedWithin(t, ch)
	if took := time.Since(start); took > 10*interval+time.Second {
		t.Errorf("watch closed %v after the server froze, want about 2 intervals (%v)", took, 2*interval)
	}
}

// TestTermsFromServerClock walks one key through the cases of the term rule
// on miniredis, whose clock the test sets: a new term is the larger of the
// counter plus one and the server's clock in microseconds, written back to the counter as a decimal string.
func TestTermsFromServerClock(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	b := newBackend(t, c, nil)
	ctx := ctxBound(t)
	t0 := time.Date(2025, 11, 22, 3, 13, 54, 567890000, time.UTC)
	us := uint64(t0.UnixMicro()) // 1763781234567890
	var l backend.Lease          // the current lease, zero when the key is free
	release := func(t *testing.T) {
		if l.Token != "" {
			if err := b.Release(ctx, l); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
		l = backend.Lease{}
	}
	steps := []struct {
		name     string
		before   func(t *testing.T) // prepares the step
		wantTerm func(prev uint64) uint64
	}{
		{"fresh key: the clock", func(t *testing.T) { mr.SetTime(t0) },
			func(uint64) uint64 { return us }},
		{"same microsecond: counter plus one", func(t *testing.T) { release(t) },
			func(prev uint64) uint64 { return prev + 1 }},
		{"clock stepped back, counter intact: counter plus one", func(t *testing.T) {
			release(t)
			mr.SetTime(t0.Add(-time.Hour))
		}, func(prev uint64) uint64 { return prev + 1 }},
		{"data lost, clock later: the clock", func(t *testing.T) {
			l = backend.Lease{}
			mr.FlushAll()
			mr.SetTime(t0.Add(time.Second + time.Microsecond))
		}, func(uint64) uint64 { return us + 1_000_001 }},
	}
	var prev uint64
	for _, st := range steps {
		ok := t.Run(st.name, func(t *testing.T) {
			st.before(t)
			var err error
			l, err = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
			if err != nil {
				t.Fatalf("Acquire: got %v, want nil", err)
			}
			if want := st.wantTerm(prev); l.Term != want {
				t.Fatalf("term: got %d, want %d", l.Term, want)
			}
			if l.Term <= prev {
				t.Fatalf("term: got %d, want > %d", l.Term, prev)
			}
			want := strconv.FormatUint(l.Term, 10)
			if got := c.Get(ctx, "sovereign:{k}:term").Val(); got != want {
				t.Errorf("GET sovereign:{k}:term: got %q, want %q", got, want)
			}
			if got := c.HGet(ctx, "sovereign:{k}", "term").Val(); got != want {
				t.Errorf("HGET sovereign:{k} term: got %q, want %q", got, want)
			}
			if rec, err := b.Get(ctx, "k"); err != nil || rec.Term != l.Term {
				t.Errorf("Get: got term %d (error %v), want %d", rec.Term, err, l.Term)
			}
			prev = l.Term
		})
		if !ok { // each step builds on the one before
			break
		}
	}
}

// TestTermsAcrossDataLoss: a redis-server without persistence is restarted,
// losing the term counter; the next term is still greater than every term
// handed out before, because terms follow the server's clock and never run
// ahead of it.
func TestTermsAcrossDataLoss(t *testing.T) {
	srv := testredis.Start(t) // no persistence
	c := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
	b := newBackend(t, c, nil)
	ctx := ctxBound(t)
	serverMicros := func() uint64 {
		t.Helper()
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		return uint64(tm.UnixMicro())
	}
	acquire := func() backend.Lease {
		t.Helper()
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire: got %v, want nil", err)
		}
		return l
	}
	// Acquire and release as fast as one client can: the terms stay within
	// the server's clock readings taken around them.
	from := serverMicros()
	var last backend.Lease
	for i := range 50 {
		l := acquire()
		if i > 0 && l.Term <= last.Term {
			t.Fatalf("term %d: got %d, want > %d", i, l.Term, last.Term)
		}
		last = l
		if i < 49 {
			if err := b.Release(ctx, l); err != nil {
				t.Fatalf("Release: %v", err)
			}
		}
	}
	if to := serverMicros(); last.Term < from || last.Term > to {
		t.Fatalf("last of 50 terms: got %d, want within the server clock's [%d, %d] µs", last.Term, from, to)
	}
	if got, want := c.Get(ctx, "sovereign:{k}:term").Val(), strconv.FormatUint(last.Term, 10); got != want {
		t.Fatalf("GET sovereign:{k}:term: got %q, want %q (decimal digits, no exponent)", got, want)
	}

	srv.Restart(t)
	eventually(t, "client reconnected after the restart", func() bool { return c.Ping(ctx).Err() == nil })
	if n := c.Exists(ctx, "sovereign:{k}", "sovereign:{k}:term").Val(); n != 0 {
		t.Fatalf("EXISTS lease and counter after the restart: got %d, want 0 (no persistence)", n)
	}
	next := acquire()
	if next.Term <= last.Term {
		t.Fatalf("term after the restart lost the counter: got %d, want > %d", next.Term, last.Term)
	}
	t.Logf("term before the restart %d, after %d", last.Term, next.Term)
}

// TestScriptCommands counts, on the server, the commands the hot scripts
// run: no TYPE and no EXISTS on the way to success, TIME and HSET once per
// Acquire and never in Renew or Heartbeat (which write only expiries when
// the TTL is unchanged) or Release, and one PUBLISH per Acquire, per Renew
// (for backend.RenewalWatcher) and per Release.
func TestScriptCommands(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	b := newBackend(t, c, &redisbackend.Options{Prefix: "cmds:"})
	if err := b.Heartbeat(ctx, "hb", "a", time.Minute); err != nil { // creates the record
		t.Fatal(err)
	}
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := range n {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: fmt.Sprintf("k%d", i%3), HolderID: "a", TTL: time.Minute,
			Metadata: map[string]string{"a": "1", "b": "2"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Renew(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := b.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
		if err := b.Heartbeat(ctx, "hb", "a", time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	calls := func(cmd string) int { return redisbackend.CommandCalls(ctx, c, cmd) }
	want := map[string]int{"type": 0, "exists": 0, "time": n, "publish": 3 * n, "hset": n, "hgetall": n, "hmget": 3 * n, "sadd": n}
	for cmd, w := range want {
		if got := calls(cmd); got != w {
			t.Errorf("%s calls for %d acquire+renew+release+heartbeat: got %d, want %d", strings.ToUpper(cmd), n, got, w)
		}
	}
}
