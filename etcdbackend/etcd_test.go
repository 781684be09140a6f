package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
)

// testCtx returns a context that bounds a whole test.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestNewValidatesOptions(t *testing.T) {
	cli := newClient(t, nil, nil)
	if _, err := etcdbackend.New(nil, nil); err == nil {
		t.Error("New(nil client): got nil error, want one")
	}
	bad := map[string]*etcdbackend.Options{
		"prefix without trailing slash": {Prefix: "sovereign"},
		"prefix with NUL":               {Prefix: "a\x00/"},
		"negative request timeout":      {RequestTimeout: -time.Second},
	}
	for name, opts := range bad {
		t.Run(name, func(t *testing.T) {
			if b, err := etcdbackend.New(cli, opts); err == nil {
				b.Close()
				t.Errorf("New(%+v): got nil error, want one", *opts)
			}
		})
	}
	for _, tc := range []struct {
		name    string
		opts    *etcdbackend.Options
		timeout time.Duration
	}{
		{"nil", nil, 10 * time.Second}, // the README: RequestTimeout (10 s)
		{"zero", &etcdbackend.Options{}, 10 * time.Second},
		{"custom", &etcdbackend.Options{Prefix: "x/", RequestTimeout: time.Second}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := etcdbackend.New(cli, tc.opts)
			if err != nil {
				t.Fatalf("New: got %v, want nil", err)
			}
			if got := etcdbackend.RequestTimeout(b); got != tc.timeout {
				t.Errorf("RequestTimeout: got %v, want %v", got, tc.timeout)
			}
			b.Close()
		})
	}
}

func TestDefaultPrefix(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, nil)
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "default-prefix-" + newPrefix(), HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer b.Release(ctx, l)
	resp, err := cli.Get(ctx, etcdbackend.DefaultPrefix+l.Key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("raw Get of %q: got %v, %v; want one record", etcdbackend.DefaultPrefix+l.Key, resp, err)
	}
}

func TestKeysThatBreakTheLayoutAreRejected(t *testing.T) {
	ctx := testCtx(t)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
	for _, key := range []string{"a/heartbeat/b", "a/heartbeat", "/heartbeat/", "a\x00b"} {
		_, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Second})
		if !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("Acquire(%q): got %v, want ErrInvalid", key, err)
		}
		if err := b.Heartbeat(ctx, key, "a", time.Second); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("Heartbeat(%q): got %v, want ErrInvalid", key, err)
		}
		if _, err := b.Watch(ctx, key); !errors.Is(err, backend.ErrInvalid) {
			t.Errorf("Watch(%q): got %v, want ErrInvalid", key, err)
		}
	}
	// Keys that merely look similar are fine.
	for _, key := range []string{"a/heartbeats/b", "heartbeat", "a/heartbeat-b"} {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Errorf("Acquire(%q): got %v, want nil", key, err)
			continue
		}
		_ = b.Release(ctx, l)
	}
}

// TestElectorRefusesWhatEtcdCannotServe: MinTTL is 1 s, and sovereign.New
// refuses a TTL below it and a name with "/heartbeat/", as the README's API
// table says.
func TestElectorRefusesWhatEtcdCannotServe(t *testing.T) {
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
	if got := b.MinTTL(); got != time.Second {
		t.Errorf("MinTTL: got %v, want 1s", got)
	}
	for _, tc := range []struct {
		name string
		ttl  time.Duration
	}{
		{"e", 500 * time.Millisecond},
		{"jobs/heartbeat/x", 0},
	} {
		if _, err := sovereign.New(b, tc.name, "a", &sovereign.Options{TTL: tc.ttl}); !errors.Is(err, sovereign.ErrInvalidOptions) {
			t.Errorf("New(%q, TTL %v): got error %v, want ErrInvalidOptions", tc.name, tc.ttl, err)
		}
	}
	e, err := sovereign.New(b, "e", "a", &sovereign.Options{TTL: time.Second})
	if err != nil {
		t.Fatalf("New with TTL 1s: got %v, want nil", err)
	}
	e.Close()
}

func TestTTLRoundedUpToWholeSeconds(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	prefix := newPrefix()
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	tests := []struct {
		ttl  time.Duration
		want time.Duration
	}{
		{time.Nanosecond, time.Second},
		{time.Second, time.Second},
		{1200 * time.Millisecond, 2 * time.Second},
		{2 * time.Second, 2 * time.Second},
		{2*time.Second + time.Millisecond, 3 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.ttl.String(), func(t *testing.T) {
			key := "ttl-" + tt.ttl.String()
			// Detached: a lease of its own, granted for this acquisition
			// (a lease on a session reports what is left of the session's
			// TTL, at least the TTL asked for: TestSession).
			l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: tt.ttl, Detached: true})
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			defer b.Release(ctx, l)
			if l.TTL != tt.want {
				t.Errorf("Lease.TTL: got %v, want %v", l.TTL, tt.want)
			}
			// etcd itself granted that TTL.
			resp, err := cli.Get(ctx, prefix+key)
			if err != nil || len(resp.Kvs) != 1 {
				t.Fatalf("raw Get: got %v, %v", resp, err)
			}
			ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
			if err != nil {
				t.Fatalf("TimeToLive: %v", err)
			}
			if got := time.Duration(ttl.GrantedTTL) * time.Second; got != tt.want {
				t.Errorf("etcd's granted TTL: got %v, want %v", got, tt.want)
			}
			// Heartbeats round the same way.
			if err := b.Heartbeat(ctx, key, "a", tt.ttl); err != nil {
				t.Fatalf("Heartbeat: %v", err)
			}
			ms, err := b.Members(ctx, key)
			if err != nil || len(ms) != 1 {
				t.Fatalf("Members: got %v, %v; want one", ms, err)
			}
			if ms[0].TTL > tt.want || ms[0].TTL < tt.want-time.Second {
				t.Errorf("heartbeat TTL: got %v, want in [%v, %v]", ms[0].TTL, tt.want-time.Second, tt.want)
			}
		})
	}
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "too-long", HolderID: "a", TTL: math.MaxInt64}); !errors.Is(err, backend.ErrInvalid) {
		t.Errorf("Acquire with a TTL beyond etcd's maximum: got %v, want ErrInvalid", err)
	}
}

func TestTermIsCreateRevision(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	prefix := newPrefix()
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	var last uint64
	for i, key := range []string{"x", "y", "x", "y", "x"} {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		resp, err := cli.Get(ctx, prefix+key)
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("raw Get: got %v, %v", resp, err)
		}
		if got := uint64(resp.Kvs[0].CreateRevision); got != l.Term {
			t.Errorf("acquisition %d of %q: create revision %d, want the term %d", i, key, got, l.Term)
		}
		// Revisions are global, so terms increase across keys too.
		if l.Term <= last {
			t.Errorf("acquisition %d: got term %d, want > %d", i, l.Term, last)
		}
		last = l.Term
		if err := b.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
}

func TestCloseLeavesClientOpen(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	b, err := etcdbackend.New(cli, &etcdbackend.Options{Prefix: newPrefix()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Watch(ctx, "k"); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := cli.Get(ctx, "anything"); err != nil {
		t.Errorf("client after Backend.Close: got %v, want it still usable", err)
	}
}

// closedPort returns a loopback address nobody listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestUnreachableClusterFailsWithinContext(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: []string{"http://" + closedPort(t)},
		Logger:    zap.NewNop(),
		// No DialTimeout: the client is created at once and every call
		// waits for a connection that never comes.
	})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	lease := backend.Lease{Key: "k", HolderID: "a", Token: "0000000000000001-0000000000000001-00", Term: 1, TTL: time.Second}

	t.Run("caller's deadline", func(t *testing.T) {
		b := newBackend(t, cli, nil)
		const deadline = 300 * time.Millisecond
		for name, call := range calls(b, lease) {
			ctx, cancel := context.WithTimeout(t.Context(), deadline)
			start := time.Now()
			err := call(ctx)
			elapsed := time.Since(start)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: got %v, want an error that is context.DeadlineExceeded", name, err)
			}
			if elapsed > deadline+time.Second {
				t.Errorf("%s: returned after %v, want about %v", name, elapsed, deadline)
			}
		}
	})
	t.Run("request timeout", func(t *testing.T) {
		const timeout = 200 * time.Millisecond
		b := newBackend(t, cli, &etcdbackend.Options{RequestTimeout: timeout})
		// A caller's deadline later than the request timeout leaves the
		// request timeout in force.
		later, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		for name, call := range calls(b, lease) {
			start := time.Now()
			err := call(later)
			elapsed := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s with a later deadline: got %v, want an error that is context.DeadlineExceeded", name, err)
			}
			if elapsed > timeout+time.Second {
				t.Errorf("%s with a later deadline: returned after %v, want about %v", name, elapsed, timeout)
			}
		}
		for name, call := range calls(b, lease) {
			start := time.Now()
			err := call(context.Background())
			elapsed := time.Since(start)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: got %v, want an error that is context.DeadlineExceeded", name, err)
			}
			if elapsed > timeout+time.Second {
				t.Errorf("%s: returned after %v, want about %v", name, elapsed, timeout)
			}
		}
	})
}

// calls returns one call of every method of b on valid arguments.
func calls(b *etcdbackend.Backend, l backend.Lease) map[string]func(context.Context) error {
	return map[string]func(context.Context) error{
		"Acquire": func(ctx context.Context) error {
			_, err := b.Acquire(ctx, backend.AcquireRequest{Key: l.Key, HolderID: l.HolderID, TTL: l.TTL})
			return err
		},
		"Renew":        func(ctx context.Context) error { return b.Renew(ctx, l) },
		"Release":      func(ctx context.Context) error { return b.Release(ctx, l) },
		"Get":          func(ctx context.Context) error { _, err := b.Get(ctx, l.Key); return err },
		"Heartbeat":    func(ctx context.Context) error { return b.Heartbeat(ctx, l.Key, l.HolderID, l.TTL) },
		"Members":      func(ctx context.Context) error { _, err := b.Members(ctx, l.Key); return err },
		"RemoveMember": func(ctx context.Context) error { return b.RemoveMember(ctx, l.Key, l.HolderID) },
		"Watch":        func(ctx context.Context) error { _, err := b.Watch(ctx, l.Key); return err },
		"SetMetadata":  func(ctx context.Context) error { return b.SetMetadata(ctx, l, nil) },
		"List":         func(ctx context.Context) error { _, err := b.List(ctx, ""); return err },
	}
}

func TestWatchTellsReleaseFromExpiry(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	w := newBackend(t, newClient(t, nil, nil), opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	want := func(what string, typ backend.EventType) {
		t.Helper()
		// A reset may come at any time (the connection monitor sends
		// one when a new client's connection still reported Connecting
		// as the watch was created): it is not a change, so skip it.
		e := nextChange(t, events, what)
		if e.Type != typ || e.Key != "k" {
			t.Fatalf("%s: got %v on %q, want %v on %q", what, e.Type, e.Key, typ, "k")
		}
	}

	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	want("acquire", backend.EventChanged)
	if err := a.Renew(ctx, l); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	// The renewal wrote nothing, so the next event is the release.
	want("release", backend.EventReleased)

	if _, err = a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Second}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	want("acquire", backend.EventChanged)
	want("expiry", backend.EventExpired)
}

// TestWatchTellsReleaseFromExpiryByLeaseMark checks how watchers tell a
// release from an expiry without a write by the releaser: a Release on a
// session writes nothing but the deletion of its record, and the expiry of
// every etcd lease holding records (a session's, a Detached lease's, a
// Detached entry's) deletes that lease's mark in the same revision. It
// fails if a session (also one whose first transaction failed, or whose
// first key is an entry), a Detached lease or a Detached entry is without
// its mark (its expiry would be reported as a release), if RenewBatch's
// sweep of orphans deletes a session's mark, or if a Release on a session
// writes a marker again.
func TestWatchTellsReleaseFromExpiryByLeaseMark(t *testing.T) {
	ctx := testCtx(t)
	prefix := newPrefix()
	opts := &etcdbackend.Options{Prefix: prefix}
	w := newBackend(t, newClient(t, nil, nil), opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	raw := newClient(t, nil, nil)
	watch := func(key string) <-chan backend.Event {
		t.Helper()
		ch, err := w.Watch(ctx, key)
		if err != nil {
			t.Fatalf("Watch(%q): %v", key, err)
		}
		return ch
	}
	want := func(ch <-chan backend.Event, what string, typ backend.EventType) {
		t.Helper()
		if e := nextChange(t, ch, what); e.Type != typ {
			t.Fatalf("%s: got %v on %q, want %v", what, e.Type, e.Key, typ)
		}
	}
	keys := func() []string {
		t.Helper()
		resp, err := raw.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		var out []string
		for _, kv := range resp.Kvs {
			out = append(out, strings.ReplaceAll(string(kv.Key[len(prefix):]), "\x00", "\\0"))
		}
		return out
	}
	const ttl = 2 * time.Second

	t.Run("session", func(t *testing.T) {
		kCh, otherCh := watch("k"), watch("other")
		k, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: ttl})
		if err != nil {
			t.Fatalf("Acquire(k): %v", err)
		}
		other, err := a.Acquire(ctx, backend.AcquireRequest{Key: "other", HolderID: "a", TTL: ttl})
		if err != nil {
			t.Fatalf("Acquire(other): %v", err)
		}
		want(kCh, "acquire k", backend.EventChanged)
		want(otherCh, "acquire other", backend.EventChanged)
		// The sweep of orphans (keys on the session this Backend does
		// not hold) leaves the session's lease mark alone.
		for i, err := range a.RenewBatch(ctx, []backend.Lease{k, other}) {
			if err != nil {
				t.Fatalf("RenewBatch: lease %d: %v", i, err)
			}
		}
		if err := a.Release(ctx, other); err != nil {
			t.Fatalf("Release(other): %v", err)
		}
		want(otherCh, "release of other", backend.EventReleased)
		// The release wrote nothing: what is left is k's record and the
		// session's lease mark.
		got := keys()
		if len(got) != 2 || got[0] != "\\0lease/"+strconv.FormatInt(etcdbackend.LeaseOfToken(k.Token), 16) || got[1] != "k" {
			t.Fatalf("keys after the release: got %q, want the session's lease mark and k", got)
		}
		// Nothing renews k now: it expires with the session.
		want(kCh, "expiry of k", backend.EventExpired)
		if got := keys(); len(got) != 0 {
			t.Fatalf("keys after the expiry: got %q, want none", got)
		}
	})

	t.Run("detached", func(t *testing.T) {
		ch := watch("d")
		req := backend.AcquireRequest{Key: "d", HolderID: "a", TTL: ttl, Detached: true}
		l, err := a.Acquire(ctx, req)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		want(ch, "acquire", backend.EventChanged)
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
		want(ch, "release", backend.EventReleased)
		if _, err := a.Acquire(ctx, req); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		want(ch, "acquire", backend.EventChanged)
		want(ch, "expiry", backend.EventExpired)
	})

	t.Run("session whose first attempt found its key held", func(t *testing.T) {
		if _, err := a.Acquire(ctx, backend.AcquireRequest{Key: "held", HolderID: "a", TTL: time.Minute}); err != nil {
			t.Fatalf("Acquire(held): %v", err)
		}
		c := newBackend(t, newClient(t, nil, nil), opts)
		// The session's first transaction fails: it puts nothing, the
		// lease mark included, so the next one puts it.
		if _, err := c.Acquire(ctx, backend.AcquireRequest{Key: "held", HolderID: "c", TTL: ttl}); !errors.Is(err, backend.ErrHeld) {
			t.Fatalf("Acquire(held): got %v, want ErrHeld", err)
		}
		ch := watch("z")
		if _, err := c.Acquire(ctx, backend.AcquireRequest{Key: "z", HolderID: "c", TTL: ttl}); err != nil {
			t.Fatalf("Acquire(z): %v", err)
		}
		want(ch, "acquire", backend.EventChanged)
		want(ch, "expiry", backend.EventExpired)
	})

	t.Run("entry on a session", func(t *testing.T) {
		d := newBackend(t, newClient(t, nil, nil), opts)
		ch := watch("e")
		req := modeRequest("e", "d", backend.Exclusive)
		req.TTL = ttl
		if _, err := d.AcquireMode(ctx, req); err != nil {
			t.Fatalf("AcquireMode: %v", err)
		}
		want(ch, "acquire", backend.EventChanged)
		want(ch, "expiry", backend.EventExpired)
	})

	t.Run("detached entry", func(t *testing.T) {
		ch := watch("m")
		req := modeRequest("m", "a", backend.Exclusive)
		req.TTL, req.Detached = ttl, true
		if _, err := a.AcquireMode(ctx, req); err != nil {
			t.Fatalf("AcquireMode: %v", err)
		}
		want(ch, "acquire", backend.EventChanged)
		want(ch, "expiry", backend.EventExpired)
	})
}

func TestWatchSurvivesCompaction(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	p := startProxy(t, shared.Endpoint(0))
	watcherCli := newClient(t, nil, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.endpoint()} })
	w := newBackend(t, watcherCli, opts)
	writerCli := newClient(t, nil, nil)
	a := newBackend(t, writerCli, opts)

	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	// Cut the watcher off, change the key while it cannot hear, and
	// compact the history past the watch's revision.
	p.setCut(true)
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	rev, err := shared.Compact(ctx, writerCli)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("compacted to revision %d; acquired at %d", rev, l.Term)
	p.setCut(false)

	// The missed changes cannot be replayed; the watch is re-established
	// from the current revision and says the receiver must re-read.
	start := time.Now()
	if e := nextEvent(t, events, "reset after compaction", 20*time.Second); e.Type != backend.EventReset {
		t.Fatalf("first event after compaction: got %v, want %v", e.Type, backend.EventReset)
	}
	t.Logf("re-established after %v", time.Since(start))

	// And it is live again. The first reset may be the reconnection's,
	// sent before the watch found its revision compacted and started over
	// from the then current revision (with another reset): a change made
	// in between is seen only by the re-read that reset asks for. So
	// change the key until a change is delivered.
	for attempt := 1; ; attempt++ {
		l, err = a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		e, ok := nextNonResetWithin(events, 2*time.Second)
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if !ok {
			if attempt == 5 {
				t.Fatalf("no change delivered after %d acquisitions", attempt)
			}
			continue
		}
		if e.Type != backend.EventChanged {
			t.Fatalf("got %v, want %v", e.Type, backend.EventChanged)
		}
		break
	}
	if e := nextNonReset(t, events, "release after re-establishment"); e.Type != backend.EventReleased {
		t.Fatalf("got %v, want %v", e.Type, backend.EventReleased)
	}
}

// nextNonResetWithin returns the next event on ch that is not a reset, if
// one comes within d; releases and expiries of earlier acquisitions are
// skipped too.
func nextNonResetWithin(ch <-chan backend.Event, d time.Duration) (backend.Event, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return backend.Event{}, false
			}
			if e.Type == backend.EventChanged {
				return e, true
			}
		case <-timer.C:
			return backend.Event{}, false
		}
	}
}

// nextNonReset waits for the next event on ch that is not a reset.
func nextNonReset(t *testing.T, ch <-chan backend.Event, what string) backend.Event {
	t.Helper()
	for {
		if e := nextEvent(t, ch, what, 10*time.Second); e.Type != backend.EventReset {
			return e
		}
	}
}

func TestWatchResumesWithoutLoss(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	p := startProxy(t, shared.Endpoint(0))
	w := newBackend(t, newClient(t, nil, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.endpoint()} }), opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	p.setCut(true)
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	p.setCut(false)
	// Without compaction, the changes made while cut off are delivered
	// as they happened, and the reconnection is reported as a reset.
	var got []backend.EventType
	resets := 0
	for len(got) < 2 {
		e := nextEvent(t, events, "events missed while cut off", 20*time.Second)
		if e.Type == backend.EventReset {
			resets++
			continue
		}
		got = append(got, e.Type)
	}
	if want := []backend.EventType{backend.EventChanged, backend.EventReleased}; !slices.Equal(got, want) {
		t.Fatalf("events after the reconnection: got %v, want %v", got, want)
	}
	if resets == 0 {
		if e := nextEvent(t, events, "reset after the reconnection", 10*time.Second); e.Type != backend.EventReset {
			t.Fatalf("got %v, want %v", e.Type, backend.EventReset)
		}
	}
}

// TestWatchResetAfterRestart: the etcd client resumes its watches over a new
// connection silently, so without help a receiver would never learn that
// the store restarted. Stop the server, start it again on the same data: the
// watch sends backend.EventReset once the client is connected again, and is
// live afterwards.
func TestWatchResetAfterRestart(t *testing.T) {
	ctx := testCtx(t)
	ec := testetcd.Start(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	w := newBackend(t, newClient(t, ec, nil), opts)
	a := newBackend(t, newClient(t, ec, nil), opts)
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	ec.Stop(0)
	if err := ec.Restart(0); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	if e := nextEvent(t, events, "after the restart", 20*time.Second); e.Type != backend.EventReset {
		t.Fatalf("first event after the restart: got %v, want %v", e.Type, backend.EventReset)
	}
	t.Logf("reset %v after the server was ready again", time.Since(up))
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire after the restart: %v", err)
	}
	if e := nextNonReset(t, events, "acquire after the restart"); e.Type != backend.EventChanged {
		t.Fatalf("got %v, want %v", e.Type, backend.EventChanged)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if e := nextNonReset(t, events, "release after the restart"); e.Type != backend.EventReleased {
		t.Fatalf("got %v, want %v", e.Type, backend.EventReleased)
	}
}

// TestClientRecoversAfterRestartDespiteBackoff: a bare client configuration
// (the one in etcd's own examples) reconnects with gRPC's default backoff,
// whose pauses grow up to 2 minutes the longer etcd is down. The backend
// resets that backoff when a call finds the client disconnected, so the
// first call after the server is back succeeds within one connection
// attempt. The client here waits 30 s between attempts from the start, which
// stands for a default client after a long outage, deterministically.
func TestClientRecoversAfterRestartDespiteBackoff(t *testing.T) {
	ctx := testCtx(t)
	ec := testetcd.Start(t)
	cli := testetcd.NewClient(t, clientv3.Config{
		Endpoints:   ec.Endpoints(),
		DialTimeout: 3 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: 30 * time.Second, Multiplier: 1, MaxDelay: 30 * time.Second},
		})},
	})
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	if _, err := b.List(ctx, ""); err != nil {
		t.Fatalf("List: %v", err)
	}
	ec.Stop(0)
	// Wait until the client has failed to reconnect and waits out its
	// backoff.
	conn := cli.ActiveConnection()
	for s := conn.GetState(); s != connectivity.TransientFailure; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("client connection still %v, want %v", s, connectivity.TransientFailure)
		}
	}
	if err := ec.Restart(0); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := b.List(cctx, ""); err != nil {
		t.Fatalf("first call after the restart: got %v, want success within 5s (the client's own backoff is 30s)", err)
	}
	t.Logf("first call after the restart succeeded after %v", time.Since(up))
}

func TestWatchBufferNeverBlocks(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	w := newBackend(t, newClient(t, nil, nil), opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	// Nobody reads while 40 changes happen: the watch drops what does not
	// fit instead of blocking, and stays live.
	for range 20 {
		l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	// Wait until the last release was delivered or dropped: the buffer
	// fills up to its capacity.
	deadline := time.Now().Add(10 * time.Second)
	for len(events) < cap(events) {
		if time.Now().After(deadline) {
			t.Fatalf("buffered events: got %d, want %d", len(events), cap(events))
		}
		time.Sleep(10 * time.Millisecond) // polling an observable condition
	}
	for range cap(events) {
		<-events
	}
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	defer a.Release(ctx, l)
	// Events of the loop above that the watch had not delivered yet when
	// the buffer was drained may come first (a release is one request, so
	// the loop can run ahead of the watch); the acquisition's change comes
	// after them.
	for i := 0; ; i++ {
		e := nextEvent(t, events, "acquire after an overflow", 10*time.Second)
		if e.Type == backend.EventChanged {
			break
		}
		if e.Type != backend.EventReleased || i >= 40 {
			t.Fatalf("got %v (event %d after the overflow), want %v", e.Type, i, backend.EventChanged)
		}
	}
}

func TestWatchEndsWithoutLeaks(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	wctx, cancel := context.WithCancel(ctx)
	e1, err := b.Watch(wctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	cancel()
	waitClosed(t, e1, "context cancelled")

	// Closing the user's client ends the watch too.
	cli2 := newClient(t, nil, nil)
	b2 := newBackend(t, cli2, &etcdbackend.Options{Prefix: newPrefix()})
	e2, err := b2.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	cli2.Close()
	waitClosed(t, e2, "client closed")
	// goleak in TestMain checks that no goroutine is left.
}

func waitClosed(t *testing.T, ch <-chan backend.Event, what string) {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-timer.C:
			t.Fatalf("watch channel still open 10s after %s", what)
		}
	}
}

func TestHeartbeatKeepsItsLease(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	b := newBackend(t, newClient(t, nil, n.configure), opts)
	other := newBackend(t, newClient(t, nil, nil), opts)

	steps := []struct {
		name string
		do   func() error
		want int64 // requests
	}{
		{"first heartbeat: grant and put", func() error { return b.Heartbeat(ctx, "k", "a", 5*time.Second) }, 2},
		{"refresh: keep-alive and read", func() error { return b.Heartbeat(ctx, "k", "a", 5*time.Second) }, 2},
		{"refresh, TTL rounds the same: keep-alive and read", func() error { return b.Heartbeat(ctx, "k", "a", 4500*time.Millisecond) }, 2},
		{"new TTL: keep-alive skipped, grant, put, revoke the old lease", func() error { return b.Heartbeat(ctx, "k", "a", 7*time.Second) }, 3},
		{"removed by another instance: failed keep-alive, read, grant, put", func() error {
			if err := other.RemoveMember(ctx, "k", "a"); err != nil {
				return err
			}
			n.reset()
			return b.Heartbeat(ctx, "k", "a", 7*time.Second)
		}, 4},
	}
	for _, s := range steps {
		n.reset()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := n.total(); got != s.want {
			t.Errorf("%s: got %d requests %v, want %d", s.name, got, n.byMethod(), s.want)
		}
		ms, err := other.Members(ctx, "k")
		if err != nil || len(ms) != 1 || ms[0].ID != "a" {
			t.Fatalf("%s: Members: got %+v, %v; want a", s.name, ms, err)
		}
	}
}

func TestRoundTrips(t *testing.T) {
	ctx := testCtx(t)
	var n counter
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	b := newBackend(t, newClient(t, nil, n.configure), opts)
	other := newBackend(t, newClient(t, nil, nil), opts)
	if err := other.Heartbeat(ctx, "held", "holder", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Acquire(ctx, backend.AcquireRequest{Key: "held", HolderID: "holder", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// The session's headroom (15 s) outlasts any pause of a loaded machine
	// between two steps.
	const ttl = 2 * time.Minute
	var l backend.Lease
	steps := []struct {
		name string
		do   func() error
		want int64
	}{
		{"Acquire of a free key (grant of the session, txn putting its lease mark too)", func() (err error) {
			l, err = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: ttl})
			return err
		}, 2},
		{"Renew (txn, keep-alive of the session: sent together)", func() error { return b.Renew(ctx, l) }, 2},
		{"Get (txn, 2 lease look-ups)", func() error {
			_, err := b.Get(ctx, "held")
			return err
		}, 3},
		{"Acquire of a held key (txn, 2 lease look-ups)", func() error {
			_, err := b.Acquire(ctx, backend.AcquireRequest{Key: "held", HolderID: "a", TTL: ttl})
			if !errors.Is(err, backend.ErrHeld) {
				return err
			}
			return nil
		}, 3},
		{"Acquire of a key found held before (probe txn, 2 lease look-ups)", func() error {
			_, err := b.Acquire(ctx, backend.AcquireRequest{Key: "held", HolderID: "a", TTL: ttl})
			if !errors.Is(err, backend.ErrHeld) {
				return err
			}
			return nil
		}, 3},
		{"SetMetadata (txn)", func() error { return b.SetMetadata(ctx, l, map[string]string{"x": "y"}) }, 1},
		{"List of two held keys, one holder heartbeating (range, 2 lease look-ups)", func() error {
			recs, err := b.List(ctx, "")
			if err == nil && len(recs) != 2 {
				return fmt.Errorf("List: got %d records, want 2", len(recs))
			}
			return err
		}, 3},
		{"Release (txn)", func() error { return b.Release(ctx, l) }, 1},
		{"Renew of a lost lease (txn, keep-alive of the session: sent together)", func() error {
			if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
				return err
			}
			return nil
		}, 2},
		{"Acquire (txn; the session was kept alive within its headroom)", func() (err error) {
			l, err = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: ttl})
			return err
		}, 1},
		{"Release (txn)", func() error { return b.Release(ctx, l) }, 1},
		{"Detached Acquire (grant, txn)", func() (err error) {
			l, err = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: ttl, Detached: true})
			return err
		}, 2},
		{"Detached Renew (txn, keep-alive)", func() error { return b.Renew(ctx, l) }, 2},
		{"Detached Release (txn, revoke)", func() error { return b.Release(ctx, l) }, 2},
		{"Detached Renew of a lost lease (txn)", func() error {
			if err := b.Renew(ctx, l); !errors.Is(err, backend.ErrLeaseLost) {
				return err
			}
			return nil
		}, 1},
	}
	for _, s := range steps {
		n.reset()
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := n.total(); got != s.want {
			t.Errorf("%s: got %d requests, want %d", s.name, got, s.want)
		}
	}
}

func TestSetMetadataRewritesInPlace(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	prefix := newPrefix()
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	other := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: prefix})
	l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute, Metadata: map[string]string{"v": "1"}})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	raw := func() *mvccpb.KeyValue {
		t.Helper()
		resp, err := cli.Get(ctx, prefix+"k")
		if err != nil || len(resp.Kvs) != 1 {
			t.Fatalf("raw Get: got %v, %v; want one record", resp, err)
		}
		return resp.Kvs[0]
	}
	before := raw()
	recBefore, err := other.Get(ctx, "k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}

	if err := b.SetMetadata(ctx, l, map[string]string{"v": "2", "w": "x"}); err != nil {
		t.Fatalf("SetMetadata: %v", err)
	}
	after := raw()
	if after.CreateRevision != before.CreateRevision || after.Lease != before.Lease {
		t.Errorf("after SetMetadata: create revision %d, lease %x; want unchanged %d, %x",
			after.CreateRevision, after.Lease, before.CreateRevision, before.Lease)
	}
	rec, err := other.Get(ctx, "k")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if rec.Metadata["v"] != "2" || rec.Metadata["w"] != "x" || len(rec.Metadata) != 2 {
		t.Errorf("metadata: got %v, want v=2 w=x", rec.Metadata)
	}
	if rec.Term != l.Term || rec.Token != l.Token || rec.HolderID != "a" || !rec.AcquiredAt.Equal(recBefore.AcquiredAt) {
		t.Errorf("record after SetMetadata: got %+v, want term %d, token, holder and acquisition time %v unchanged", rec, l.Term, recBefore.AcquiredAt)
	}
	// The lease is still the owner's: it renews and releases as before.
	if err := b.Renew(ctx, l); err != nil {
		t.Errorf("Renew after SetMetadata: got %v, want nil", err)
	}

	// Wrong token, wrong holder, wrong term: ErrLeaseLost, nothing written.
	wrong := map[string]backend.Lease{
		"token":   {Key: l.Key, HolderID: l.HolderID, Token: l.Token[:len(l.Token)-1] + "0", Term: l.Term, TTL: l.TTL},
		"holder":  {Key: l.Key, HolderID: "b", Token: l.Token, Term: l.Term, TTL: l.TTL},
		"term":    {Key: l.Key, HolderID: l.HolderID, Token: l.Token, Term: l.Term + 1, TTL: l.TTL},
		"foreign": {Key: l.Key, HolderID: l.HolderID, Token: "not-ours", Term: l.Term, TTL: l.TTL},
	}
	if wrong["token"].Token == l.Token {
		w := wrong["token"]
		w.Token = l.Token[:len(l.Token)-1] + "1"
		wrong["token"] = w
	}
	for name, w := range wrong {
		if err := other.SetMetadata(ctx, w, map[string]string{"v": "evil"}); !errors.Is(err, backend.ErrLeaseLost) {
			t.Errorf("SetMetadata with the wrong %s: got %v, want ErrLeaseLost", name, err)
		}
	}
	if got := raw(); got.ModRevision != after.ModRevision {
		t.Errorf("record rewritten by a failed SetMetadata: mod revision %d, want %d", got.ModRevision, after.ModRevision)
	}

	if err := b.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := b.SetMetadata(ctx, l, nil); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("SetMetadata after Release: got %v, want ErrLeaseLost", err)
	}
	if resp, err := cli.Get(ctx, prefix+"k"); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("after a failed SetMetadata of a released lease: got %v, %v; want no record", resp, err)
	}
}

func TestListSkipsBookkeeping(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	prefix := newPrefix()
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	held := []string{"a", "a/b", "ab", "b/c:d"}
	leases := map[string]backend.Lease{}
	for _, key := range []string{"b/c:d", "ab", "a", "a/b"} {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "h-" + key, TTL: time.Minute, Metadata: map[string]string{"key": key}})
		if err != nil {
			t.Fatalf("Acquire(%q): %v", key, err)
		}
		leases[key] = l
	}
	// The holder of "a" heartbeats; "free" has members but no holder;
	// "gone" was released (its marker is revoked with its lease, but one
	// left behind must not show either); junk under the prefix is not a
	// record.
	if err := b.Heartbeat(ctx, "a", "h-a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, "a", "someone-else", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, "free", "x", time.Minute); err != nil {
		t.Fatal(err)
	}
	gone, err := b.Acquire(ctx, backend.AcquireRequest{Key: "gone", HolderID: "g", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, gone); err != nil {
		t.Fatal(err)
	}
	grant, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"gone\x00": "released", "a\x00": "released", "junk": "not a record"} {
		if _, err := cli.Put(ctx, prefix+k, v, clientv3.WithLease(grant.ID)); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(recs []backend.Record) []string {
		var ks []string
		for _, r := range recs {
			ks = append(ks, r.Key)
		}
		return ks
	}
	tests := []struct {
		prefix string
		want   []string
	}{
		{"", held},
		{"a", []string{"a", "a/b", "ab"}},
		{"a/", []string{"a/b"}},
		{"b/c:", []string{"b/c:d"}},
		{"free", nil},
		{"gone", nil},
		{"a/heartbeat/", nil},
		{"zzz", nil},
	}
	for _, tt := range tests {
		recs, err := b.List(ctx, tt.prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", tt.prefix, err)
		}
		if got := keys(recs); !slices.Equal(got, tt.want) {
			t.Errorf("List(%q): got keys %q, want %q", tt.prefix, got, tt.want)
		}
	}
	recs, err := b.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		l := leases[r.Key]
		if r.HolderID != l.HolderID || r.Token != l.Token || r.Term != l.Term || r.Metadata["key"] != r.Key {
			t.Errorf("List record %q: got %+v, want holder %q, token, term %d, metadata", r.Key, r, l.HolderID, l.Term)
		}
		// What the session has left: up to the TTL asked for plus the
		// session's headroom.
		if max := time.Minute + etcdbackend.SessionHeadroom(time.Minute); r.TTL <= 0 || r.TTL > max {
			t.Errorf("List record %q: TTL %v, want in (0, %v]", r.Key, r.TTL, max)
		}
		if r.HasHeartbeat() {
			t.Errorf("List record %q: has heartbeat fields, want none (List does not look them up)", r.Key)
		}
	}
}

// TestHeartbeatRewritesItsRecord: a keep-alive that succeeds proves only
// that the heartbeat's lease lives, not that the record does. A record
// deleted by hand, or put again attached to another lease, is written again
// by the next Heartbeat, on the lease the backend keeps.
func TestHeartbeatRewritesItsRecord(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	prefix := newPrefix()
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: prefix})
	hbKey := prefix + "k/heartbeat/a"
	attached := func(what string) clientv3.LeaseID {
		t.Helper()
		resp, err := cli.Get(ctx, hbKey)
		if err != nil {
			t.Fatalf("%s: raw Get: %v", what, err)
		}
		if len(resp.Kvs) != 1 {
			t.Fatalf("%s: got %d heartbeat records, want 1", what, len(resp.Kvs))
		}
		return clientv3.LeaseID(resp.Kvs[0].Lease)
	}
	if err := b.Heartbeat(ctx, "k", "a", time.Minute); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	own := attached("first heartbeat")

	if _, err := cli.Delete(ctx, hbKey); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, "k", "a", time.Minute); err != nil {
		t.Fatalf("Heartbeat after the record was deleted: %v", err)
	}
	if got := attached("heartbeat after a delete by hand"); got != own {
		t.Errorf("record rewritten on lease %x, want the kept lease %x", got, own)
	}
	ms, err := b.Members(ctx, "k")
	if err != nil || len(ms) != 1 || ms[0].ID != "a" {
		t.Errorf("Members after the rewrite: got %+v, %v; want a", ms, err)
	}

	foreign, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, hbKey, `{"id":"a"}`, clientv3.WithLease(foreign.ID)); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, "k", "a", time.Minute); err != nil {
		t.Fatalf("Heartbeat after the record moved to another lease: %v", err)
	}
	if got := attached("heartbeat after the record moved to another lease"); got != own {
		t.Errorf("record attached to lease %x, want the kept lease %x again", got, own)
	}

	if _, err := cli.Put(ctx, hbKey, `{"id":"a"}`); err != nil { // no lease at all: it would never expire
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, "k", "a", time.Minute); err != nil {
		t.Fatalf("Heartbeat after the record lost its lease: %v", err)
	}
	if got := attached("heartbeat after the record lost its lease"); got != own {
		t.Errorf("record attached to lease %x, want the kept lease %x again", got, own)
	}
}

// TestWatchFollowsAStoreThatLostItsData: after a restart on an empty data
// directory, revisions start again from 1, and the etcd client resumes its
// watches from their old, now future, revision: they would stay silent
// until the new revisions caught up. The watch sees the store's revision go
// back and starts over from the current one, so changes are delivered again.
func TestWatchFollowsAStoreThatLostItsData(t *testing.T) {
	ctx := testCtx(t)
	ec := testetcd.Start(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	w := newBackend(t, newClient(t, ec, nil), opts)
	a := newBackend(t, newClient(t, ec, nil), opts)
	// Push the revision up, so the old one stays ahead for a while.
	for range 50 {
		l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "other", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := ec.RestartWithoutData(0); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, events, "after the restart", 20*time.Second); e.Type != backend.EventReset {
		t.Fatalf("first event after the restart: got %v, want %v", e.Type, backend.EventReset)
	}
	// As in TestWatchSurvivesCompaction, a change made before the watch has
	// started over is seen only by the re-read the reset asks for.
	for attempt := 1; ; attempt++ {
		l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire after the restart: %v", err)
		}
		_, ok := nextNonResetWithin(events, 2*time.Second)
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if ok {
			break
		}
		if attempt == 5 {
			t.Fatalf("no change delivered after %d acquisitions since the restart", attempt)
		}
	}
	if e := nextNonReset(t, events, "release after the restart"); e.Type != backend.EventReleased {
		t.Fatalf("got %v, want %v", e.Type, backend.EventReleased)
	}
}

// TestDeadConnectionReplaced: a connection that stops carrying bytes without
// being closed (a crashed host, a partition) looks healthy to the client,
// and a call on it would hang until its deadline. ClientConfig's keep-alive
// pings find it dead (10 s of silence, then 3 s without an answer): the call
// fails, and the next one goes over a new connection.
func TestDeadConnectionReplaced(t *testing.T) {
	ctx := testCtx(t)
	p := startProxy(t, shared.Endpoint(0))
	cli := newClient(t, nil, func(cfg *clientv3.Config) { cfg.Endpoints = []string{p.endpoint()} })
	b := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix(), RequestTimeout: time.Minute})
	if _, err := b.List(ctx, ""); err != nil {
		t.Fatalf("List: %v", err)
	}
	p.stall()
	start := time.Now()
	// Without keep-alive pings this hangs for the whole 25 s.
	cctx, cancel := context.WithTimeout(ctx, 25*time.Second)
	defer cancel()
	_, err := b.Get(cctx, "k")
	took := time.Since(start)
	t.Logf("Get over a dead connection returned after %v: %v", took, err)
	if errors.Is(err, context.DeadlineExceeded) || took > 20*time.Second {
		t.Fatalf("Get over a dead connection: got %v after %v, want it ended by the keep-alive after about 13 s", err, took)
	}
	cctx2, cancel2 := context.WithTimeout(ctx, 5*time.Second)
	defer cancel2()
	if _, err := b.Get(cctx2, "k"); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Get after the dead connection was dropped: got %v, want ErrNotHeld", err)
	}
}
