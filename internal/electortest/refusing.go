package electortest

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// Refusing wraps a backend with a watch (and no backend.Modes) so that its
// Acquire refuses from the time From until the time Until, as
// redisbackend's Options.RestartGuard does after a restart: a
// *backend.HeldError with MayBeHeld, no holder, and the time the refusal
// still lasts as Holder.TTL. Its watch reports every expiry (it is a
// backend.ExpiryReporter), as the memory backend's does.
type Refusing struct {
	backend.Backend
	W           backend.Watcher
	From, Until time.Time
	Attempts    atomic.Int32 // calls of Acquire
}

// NewRefusing returns a Refusing around b, refusing from from until until.
func NewRefusing(b interface {
	backend.Backend
	backend.Watcher
}, from, until time.Time) *Refusing {
	return &Refusing{Backend: b, W: b, From: from, Until: until}
}

// Acquire implements backend.Backend.
func (r *Refusing) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	r.Attempts.Add(1)
	if d := time.Until(r.Until); d > 0 && !time.Now().Before(r.From) {
		return backend.Lease{}, &backend.HeldError{Holder: backend.Record{Key: req.Key, TTL: d}, MayBeHeld: true}
	}
	return r.Backend.Acquire(ctx, req)
}

// Watch implements backend.Watcher.
func (r *Refusing) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	return r.W.Watch(ctx, key)
}

// ReportsExpiry implements backend.ExpiryReporter.
func (r *Refusing) ReportsExpiry() bool { return true }
