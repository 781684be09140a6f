package electortest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// Renewals turns the clients of one memory store into a store that tells of
// renewals as Redis does, for tests of backend.RenewalWatcher's users that
// run in a testing/synctest bubble: each Renewing client's successful Renew
// is delivered to every renewal watch of the key (EventRenewed with the
// lease's TTL), expiries are not reported (the watches drop EventExpired,
// and ReportsExpiry is false), and Drop ends a lease with no event, as a
// step of the Redis server's clock forward does. The zero value is ready to
// use.
type Renewals struct {
	mu      sync.Mutex
	watches map[*renewalWatch]struct{}
}

// renewalWatch is one watch of a Renewing client: the memory store's
// channel, forwarded to ch with the renewals added.
type renewalWatch struct {
	key      string
	ch       chan backend.Event
	notify   func()
	renewals bool
	mute     int                // releases of key still to drop (see Drop)
	cancel   context.CancelFunc // ends the memory store's watch (see Break)
	closed   bool               // ch is closed
}

// Client returns b, a client of the memory store, as a client of r.
func (r *Renewals) Client(b *memorybackend.Backend) *Renewing {
	return &Renewing{Backend: b, r: r}
}

// Publish delivers ev to every watch of key (an EventRenewed only to
// renewal watches), without blocking, as the store's own events are.
func (r *Renewals) Publish(key string, ev backend.Event) {
	ev.Key = key
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.watches {
		if w.key == key && (w.renewals || ev.Type != backend.EventRenewed) {
			w.send(ev)
		}
	}
}

// Break closes every watch of key before it returns, as a broken
// connection to Redis does: the watcher subscribes again.
func (r *Renewals) Break(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for w := range r.watches {
		if w.key == key {
			w.cancel()
			w.close()
		}
	}
}

// close closes w's channel, once. r.mu must be held.
func (w *renewalWatch) close() {
	if w.closed {
		return
	}
	w.closed = true
	close(w.ch)
	if w.notify != nil {
		w.notify()
	}
}

// send sends ev on w's channel, unless it is closed. r.mu must be held.
func (w *renewalWatch) send(ev backend.Event) {
	if w.closed {
		return
	}
	select {
	case w.ch <- ev:
	default: // full: the pending events tell the receiver to look
	}
	if w.notify != nil {
		w.notify()
	}
}

// Renewing is one client of a Renewals store: the memory store's client,
// with the Renewals' renewal events and watches. Its optional hooks, set
// before the client is used, run in the calls of its user.
type Renewing struct {
	*memorybackend.Backend
	r *Renewals

	// BeforeAcquire, when set, runs before each Acquire; an error it
	// returns is Acquire's, and the store is not called.
	BeforeAcquire func(req backend.AcquireRequest) error
	// AfterAcquire, when set, runs after each Acquire with its error.
	AfterAcquire func(req backend.AcquireRequest, err error)
	// BeforeGet, when set, runs before each Get; an error it returns is
	// Get's, and the store is not called.
	BeforeGet func(key string) error

	Acquires atomic.Int32 // calls of Acquire
	Renews   atomic.Int32 // calls of Renew
}

var _ backend.RenewalWatcher = (*Renewing)(nil)

// Acquire implements backend.Backend, with the hooks.
func (c *Renewing) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	c.Acquires.Add(1)
	if c.BeforeAcquire != nil {
		if err := c.BeforeAcquire(req); err != nil {
			return backend.Lease{}, err
		}
	}
	l, err := c.Backend.Acquire(ctx, req)
	if c.AfterAcquire != nil {
		c.AfterAcquire(req, err)
	}
	return l, err
}

// Get implements backend.Backend, with the hook.
func (c *Renewing) Get(ctx context.Context, key string) (backend.Record, error) {
	if c.BeforeGet != nil {
		if err := c.BeforeGet(key); err != nil {
			return backend.Record{}, err
		}
	}
	return c.Backend.Get(ctx, key)
}

// Renew implements backend.Backend: a renewal the store made is told to
// the key's renewal watches.
func (c *Renewing) Renew(ctx context.Context, l backend.Lease) error {
	c.Renews.Add(1)
	err := c.Backend.Renew(ctx, l)
	if err == nil {
		c.r.Publish(l.Key, backend.Event{Type: backend.EventRenewed, TTL: l.TTL, Term: l.Term})
	}
	return err
}

// Release implements backend.Backend: a release the store made is told
// with its term, as Redis tells it, before Release returns (the memory
// store's own event, without the term, is dropped).
func (c *Renewing) Release(ctx context.Context, l backend.Lease) error {
	c.mute(l.Key, 1)
	err := c.Backend.Release(ctx, l)
	if err != nil {
		c.mute(l.Key, -1)
		return err
	}
	c.r.Publish(l.Key, backend.Event{Type: backend.EventReleased, Term: l.Term})
	return nil
}

// mute adds d to the releases of key that its watches are to drop.
func (c *Renewing) mute(key string, d int) {
	c.r.mu.Lock()
	defer c.r.mu.Unlock()
	for w := range c.r.watches {
		if w.key == key && w.mute+d >= 0 {
			w.mute += d
		}
	}
}

// Drop ends the lease of key with no event, as a step of the Redis
// server's clock forward does. It reports whether there was one.
func (c *Renewing) Drop(ctx context.Context, key string) bool {
	rec, err := c.Backend.Get(ctx, key)
	if err != nil {
		return false
	}
	c.mute(key, 1)
	// Release checks the owner by token; the TTL is only validated.
	err = c.Backend.Release(ctx, backend.Lease{Key: key, HolderID: rec.HolderID, Token: rec.Token, Term: rec.Term, TTL: time.Second})
	if err != nil {
		c.mute(key, -1)
	}
	return err == nil
}

// ReportsExpiry implements backend.ExpiryReporter: as on Redis, an expiry
// is not reported.
func (c *Renewing) ReportsExpiry() bool { return false }

// Watch implements backend.Watcher: no renewals.
func (c *Renewing) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	return c.watch(ctx, key, nil, false)
}

// WatchNotify implements backend.WatchNotifier: no renewals.
func (c *Renewing) WatchNotify(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	return c.watch(ctx, key, notify, false)
}

// WatchRenewals implements backend.RenewalWatcher.
func (c *Renewing) WatchRenewals(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	return c.watch(ctx, key, notify, true)
}

func (c *Renewing) watch(ctx context.Context, key string, notify func(), renewals bool) (<-chan backend.Event, error) {
	wctx, cancel := context.WithCancel(ctx)
	in, err := c.Backend.Watch(wctx, key)
	if err != nil {
		cancel()
		return nil, err
	}
	w := &renewalWatch{key: key, ch: make(chan backend.Event, 64), notify: notify, renewals: renewals, cancel: cancel}
	r := c.r
	r.mu.Lock()
	if r.watches == nil {
		r.watches = make(map[*renewalWatch]struct{})
	}
	r.watches[w] = struct{}{}
	r.mu.Unlock()
	go func() {
		for ev := range in {
			r.mu.Lock()
			switch {
			case ev.Type == backend.EventExpired:
			case ev.Type == backend.EventReleased && w.mute > 0:
				w.mute--
			default:
				w.send(ev)
			}
			r.mu.Unlock()
		}
		cancel()
		r.mu.Lock()
		delete(r.watches, w)
		w.close()
		r.mu.Unlock()
	}()
	return w.ch, nil
}
