package sovereign_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var quiet = slog.New(slog.DiscardHandler)

// fastOpts are small, valid options: TTL 1s, deadline 700ms, renew 500ms,
// heartbeat 500ms (TTL 6s), no jitter.
func fastOpts() *sovereign.Options {
	return &sovereign.Options{TTL: time.Second, NoStartupJitter: true, Logger: quiet}
}

// cluster starts n electors named "n1".."nN" on clients of one memory store.
type cluster struct {
	store   *memorybackend.Store
	clients []*memorybackend.Backend
	es      []*sovereign.Elector
	rec     *electortest.Recorder
}

func newCluster(t *testing.T, n int, opts *sovereign.Options) *cluster {
	t.Helper()
	c := &cluster{store: memorybackend.NewStore(), rec: &electortest.Recorder{}}
	for i := range n {
		cl := c.store.Client()
		e, err := sovereign.New(cl, "election", "n"+string(rune('1'+i)), opts)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		c.rec.Attach(e)
		c.clients = append(c.clients, cl)
		c.es = append(c.es, e)
	}
	t.Cleanup(func() {
		for i, e := range c.es {
			e.Close()
			c.clients[i].Close()
		}
	})
	return c
}

func (c *cluster) start(t *testing.T) {
	t.Helper()
	for _, e := range c.es {
		if err := e.Start(t.Context()); err != nil {
			t.Fatalf("Start: %v", err)
		}
	}
}

// leader waits (virtually) until exactly one elector leads and returns its
// index; it fails t if none does within limit.
func (c *cluster) leader(t *testing.T, limit time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if ls := electortest.Leaders(c.es...); len(ls) == 1 {
			for i, e := range c.es {
				if e == ls[0] {
					return i
				}
			}
		} else if len(ls) > 1 {
			t.Fatalf("%d leaders at once", len(ls))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no leader within %v", limit)
		}
		time.Sleep(time.Millisecond) // virtual time: advances the bubble's clock
	}
}

// hooked wraps a backend and lets a test override single operations.
type hooked struct {
	backend.Backend
	mu        sync.Mutex
	onRenew   func(ctx context.Context, l backend.Lease) (error, bool)
	onGet     func(ctx context.Context, key string) (backend.Record, error, bool)
	onHB      func(ctx context.Context) (error, bool)
	onAcquire func(ctx context.Context, req backend.AcquireRequest)
}

func (h *hooked) Renew(ctx context.Context, l backend.Lease) error {
	h.mu.Lock()
	f := h.onRenew
	h.mu.Unlock()
	if f != nil {
		if err, done := f(ctx, l); done {
			return err
		}
	}
	return h.Backend.Renew(ctx, l)
}

func (h *hooked) Get(ctx context.Context, key string) (backend.Record, error) {
	h.mu.Lock()
	f := h.onGet
	h.mu.Unlock()
	if f != nil {
		if r, err, done := f(ctx, key); done {
			return r, err
		}
	}
	return h.Backend.Get(ctx, key)
}

func (h *hooked) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	h.mu.Lock()
	f := h.onHB
	h.mu.Unlock()
	if f != nil {
		if err, done := f(ctx); done {
			return err
		}
	}
	return h.Backend.Heartbeat(ctx, key, id, ttl)
}

func (h *hooked) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	h.mu.Lock()
	f := h.onAcquire
	h.mu.Unlock()
	if f != nil {
		f(ctx, req)
	}
	return h.Backend.Acquire(ctx, req)
}

func (h *hooked) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	return h.Backend.(backend.Watcher).Watch(ctx, key)
}

func (h *hooked) set(f func(h *hooked)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	f(h)
}
