package etcdbackend_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// TestWatchIndexHoldsOnlyWatchedBackends: the package's index of watched
// Backends holds a Backend from its first subscription to the end of its
// last, whether that end is the caller's context, a Close, or a Watch that
// failed, so that a Backend nobody watches is not kept alive by it.
func TestWatchIndexHoldsOnlyWatchedBackends(t *testing.T) {
	ctx := testCtx(t)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
	watched := func(want bool, what string) {
		t.Helper()
		waitUntil(t, what, func() bool { return etcdbackend.Watched(b) == want })
	}
	if etcdbackend.Watched(b) {
		t.Fatal("a Backend never watched is in the index")
	}
	ctx1, cancel1 := context.WithCancel(ctx)
	defer cancel1()
	ctx2, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	ch1, err := b.Watch(ctx1, "a")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	ch2, err := b.Watch(ctx2, "b")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if !etcdbackend.Watched(b) {
		t.Fatal("a watched Backend is not in the index")
	}
	cancel1()
	waitClosed(t, ch1, "context cancelled")
	if !etcdbackend.Watched(b) {
		t.Fatal("the Backend left the index with a subscription left")
	}
	cancel2()
	waitClosed(t, ch2, "context cancelled")
	watched(false, "Backend out of the index after its last subscription ended")

	// Ended by Close.
	ch3, err := b.Watch(ctx, "c")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitClosed(t, ch3, "Close")
	watched(false, "Backend out of the index after Close")

	// A Watch that fails: etcd cannot be reached.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	u := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix(), RequestTimeout: 100 * time.Millisecond})
	if _, err := u.Watch(ctx, "k"); err == nil {
		t.Fatal("Watch with etcd unreachable: got nil error")
	}
	if etcdbackend.Watched(u) {
		t.Error("a Backend whose only Watch failed is in the index")
	}
}

// afterFuncCounter is a context, never done, that keeps the functions
// registered with context.AfterFunc on it (and on contexts derived from
// it) until they are unregistered: each holds on to what it refers to for
// as long as the context lives.
type afterFuncCounter struct {
	done chan struct{} // never closed; nil would tell AfterFunc to register nothing

	mu    sync.Mutex // guards funcs, next
	funcs map[int]func()
	next  int
}

func (*afterFuncCounter) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *afterFuncCounter) Done() <-chan struct{}     { return c.done }
func (*afterFuncCounter) Err() error                  { return nil }
func (*afterFuncCounter) Value(any) any               { return nil }

func (c *afterFuncCounter) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.funcs == nil {
		c.funcs = make(map[int]func())
	}
	id := c.next
	c.next++
	c.funcs[id] = f
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.funcs[id]
		delete(c.funcs, id)
		return ok
	}
}

// count returns the number of functions registered and not unregistered.
func (c *afterFuncCounter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.funcs)
}

// TestWatchLetsGoOfTheCallersContext: a subscription follows the end of
// the caller's context with context.AfterFunc; when its channel is closed
// for another reason (here, Close), it unregisters that function, so a
// long-lived context (an application's) does not accumulate one per
// subscription ever made.
func TestWatchLetsGoOfTheCallersContext(t *testing.T) {
	ctx := &afterFuncCounter{done: make(chan struct{})}
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
	for _, k := range []string{"a", "b", "a"} {
		ch, err := b.Watch(ctx, k)
		if err != nil {
			t.Fatalf("Watch(%q): %v", k, err)
		}
		defer waitClosed(t, ch, "Close")
	}
	if got := ctx.count(); got != 3 {
		t.Fatalf("functions registered on the context with 3 subscriptions: got %d, want 3", got)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitUntil(t, "no function left registered on the context after Close", func() bool { return ctx.count() == 0 })
}

// TestWatchForgetsKeysNobodyWatches: a Backend whose watch lives on (one
// subscription stays) keeps no trace of the keys whose subscriptions have
// all ended, so watching ever new keys, a lock's for each job say, does not
// grow its state.
func TestWatchForgetsKeysNobodyWatches(t *testing.T) {
	ctx := testCtx(t)
	b := newBackend(t, newClient(t, nil, nil), &etcdbackend.Options{Prefix: newPrefix()})
	if _, err := b.Watch(ctx, "stays"); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	for i := range 100 {
		wctx, cancel := context.WithCancel(ctx)
		key := fmt.Sprintf("job/%d", i)
		ch, err := b.Watch(wctx, key)
		if err != nil {
			t.Fatalf("Watch(%q): %v", key, err)
		}
		cancel()
		waitClosed(t, ch, "context cancelled")
	}
	if got := etcdbackend.WatchedKeys(b); got != 1 {
		t.Errorf("keys with subscriptions: got %d, want 1", got)
	}
}

// TestWatchOneOfTwoSubscriptionsOfAKeyEnds: when one of two subscriptions
// of a key ends, the other goes on receiving the key's events, and the
// one that ended receives nothing more.
func TestWatchOneOfTwoSubscriptionsOfAKeyEnds(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	b := newBackend(t, newClient(t, nil, nil), opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	first, err := b.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	second, err := b.Watch(wctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	cancel()
	waitClosed(t, second, "context cancelled")
	if _, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if e := nextNonReset(t, first, "acquisition, on the subscription left"); e.Type != backend.EventChanged {
		t.Fatalf("acquisition, on the subscription left: got %v, want %v", e.Type, backend.EventChanged)
	}
}
