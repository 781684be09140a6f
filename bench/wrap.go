package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// The bench wraps backends (to simulate a crash, to count calls). The
// elector and package lock look for optional capabilities with type
// assertions (backend.Watcher, AcquireConfirmer, ExpiryReporter,
// BatchRenewer, BatchHeartbeater, Modes), so a wrapper must have exactly the
// capabilities of what it wraps, or the bench would measure another code
// path than an application gets. compose builds such a wrapper.

// wrapper is what a bench wrapper does around each call: the methods of
// backend.Backend and backend.Watcher, and hooks for the optional methods
// that do I/O, each given the inner backend's capability.
type wrapper interface {
	backend.Backend
	backend.Watcher
	renewBatch(ctx context.Context, inner backend.BatchRenewer, leases []backend.Lease) []error
	heartbeatBatch(ctx context.Context, inner backend.BatchHeartbeater, reqs []backend.HeartbeatRequest) []error
	acquireMode(ctx context.Context, inner backend.Modes, req backend.ModeRequest) (backend.Lease, error)
	holders(ctx context.Context, inner backend.Modes, key string) ([]backend.Record, error)
	cancelWait(ctx context.Context, inner backend.Modes, key, waitID string) error
	watchRenewals(ctx context.Context, inner backend.RenewalWatcher, key string, notify func()) (<-chan backend.Event, error)
	watchRenewalsMuted(ctx context.Context, inner backend.RenewalMuter, key string, notify func(), muted *backend.Mute) (<-chan backend.Event, error)
}

// capBase forwards the Backend and Watcher methods to the wrapper and the
// capability queries that do no I/O to the inner backend.
type capBase struct {
	wrapper
	inner backend.Backend
}

// AcquireConfirms reports what the inner backend reports (false when it is
// not a backend.AcquireConfirmer, which the elector treats alike).
func (c *capBase) AcquireConfirms() bool {
	a, ok := c.inner.(backend.AcquireConfirmer)
	return ok && a.AcquireConfirms()
}

// ReportsExpiry reports what the inner backend reports (false when it is
// not a backend.ExpiryReporter, which the elector treats alike).
func (c *capBase) ReportsExpiry() bool {
	r, ok := c.inner.(backend.ExpiryReporter)
	return ok && r.ReportsExpiry()
}

type capBatchRenew struct{ c *capBase }

func (x capBatchRenew) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	return x.c.renewBatch(ctx, x.c.inner.(backend.BatchRenewer), leases)
}

type capBatchHeartbeat struct{ c *capBase }

func (x capBatchHeartbeat) HeartbeatBatch(ctx context.Context, reqs []backend.HeartbeatRequest) []error {
	return x.c.heartbeatBatch(ctx, x.c.inner.(backend.BatchHeartbeater), reqs)
}

type capRenewals struct{ c *capBase }

func (x capRenewals) WatchRenewals(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	return x.c.watchRenewals(ctx, x.c.inner.(backend.RenewalWatcher), key, notify)
}

func (x capRenewals) WatchRenewalsMuted(ctx context.Context, key string, notify func(), muted *backend.Mute) (<-chan backend.Event, error) {
	return x.c.watchRenewalsMuted(ctx, x.c.inner.(backend.RenewalMuter), key, notify, muted)
}

type capModes struct{ c *capBase }

func (x capModes) ModeSupport() backend.ModeSupport { return x.c.inner.(backend.Modes).ModeSupport() }

func (x capModes) AcquireMode(ctx context.Context, req backend.ModeRequest) (backend.Lease, error) {
	return x.c.acquireMode(ctx, x.c.inner.(backend.Modes), req)
}

func (x capModes) Holders(ctx context.Context, key string) ([]backend.Record, error) {
	return x.c.holders(ctx, x.c.inner.(backend.Modes), key)
}

func (x capModes) CancelWait(ctx context.Context, key, waitID string) error {
	return x.c.cancelWait(ctx, x.c.inner.(backend.Modes), key, waitID)
}

// compose returns w with the optional I/O capabilities inner has, and no
// others. inner must not be a Watcher unless w's Watch may be used (every
// backend of this repository is one).
func compose(w wrapper, inner backend.Backend) backend.Backend {
	c := &capBase{wrapper: w, inner: inner}
	_, br := inner.(backend.BatchRenewer)
	_, bh := inner.(backend.BatchHeartbeater)
	_, md := inner.(backend.Modes)
	_, rw := inner.(backend.RenewalWatcher)
	if _, rm := inner.(backend.RenewalMuter); rw != rm {
		panic("bench: compose: a backend.RenewalWatcher that is not a backend.RenewalMuter (or the reverse) has no wrapper")
	}
	r, h, m := capBatchRenew{c}, capBatchHeartbeat{c}, capModes{c}
	switch {
	case br && bh && md && rw: // Redis
		return &struct {
			*capBase
			capBatchRenew
			capBatchHeartbeat
			capModes
			capRenewals
		}{c, r, h, m, capRenewals{c}}
	case rw:
		panic("bench: compose: a backend.RenewalWatcher without BatchRenewer, BatchHeartbeater and Modes has no wrapper")
	case br && bh && md:
		return &struct {
			*capBase
			capBatchRenew
			capBatchHeartbeat
			capModes
		}{c, r, h, m}
	case br && bh:
		return &struct {
			*capBase
			capBatchRenew
			capBatchHeartbeat
		}{c, r, h}
	case br && md:
		return &struct {
			*capBase
			capBatchRenew
			capModes
		}{c, r, m}
	case bh && md:
		return &struct {
			*capBase
			capBatchHeartbeat
			capModes
		}{c, h, m}
	case br:
		return &struct {
			*capBase
			capBatchRenew
		}{c, r}
	case bh:
		return &struct {
			*capBase
			capBatchHeartbeat
		}{c, h}
	case md:
		return &struct {
			*capBase
			capModes
		}{c, m}
	}
	return c
}

// limiter is a wrapper that lets at most cap(sem) calls reach the inner
// backend at once; the others wait in this process, each until its context
// ends. It is the bench's experiment for "bound in-flight calls per
// backend" (-many-inflight): a call that times out while waiting costs the
// store nothing.
type limiter struct {
	inner   backend.Backend
	watcher backend.Watcher
	sem     chan struct{}
}

var _ wrapper = (*limiter)(nil)

func newLimiter(b backend.Backend, n int) *limiter {
	w, _ := b.(backend.Watcher)
	return &limiter{inner: b, watcher: w, sem: make(chan struct{}, n)}
}

// errLimitWait wraps the context's error of a call that ended while waiting
// for its turn.
var errLimitWait = errors.New("bench: waiting for an in-flight slot")

func (l *limiter) enter(ctx context.Context) error {
	select {
	case l.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %w", errLimitWait, ctx.Err())
	}
}

func (l *limiter) leave() { <-l.sem }

func (l *limiter) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	if err := l.enter(ctx); err != nil {
		return backend.Lease{}, err
	}
	defer l.leave()
	return l.inner.Acquire(ctx, req)
}

func (l *limiter) Renew(ctx context.Context, ls backend.Lease) error {
	if err := l.enter(ctx); err != nil {
		return err
	}
	defer l.leave()
	return l.inner.Renew(ctx, ls)
}

func (l *limiter) Release(ctx context.Context, ls backend.Lease) error {
	if err := l.enter(ctx); err != nil {
		return err
	}
	defer l.leave()
	return l.inner.Release(ctx, ls)
}

func (l *limiter) Get(ctx context.Context, key string) (backend.Record, error) {
	if err := l.enter(ctx); err != nil {
		return backend.Record{}, err
	}
	defer l.leave()
	return l.inner.Get(ctx, key)
}

func (l *limiter) SetMetadata(ctx context.Context, ls backend.Lease, md map[string]string) error {
	if err := l.enter(ctx); err != nil {
		return err
	}
	defer l.leave()
	return l.inner.SetMetadata(ctx, ls, md)
}

func (l *limiter) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	if err := l.enter(ctx); err != nil {
		return nil, err
	}
	defer l.leave()
	return l.inner.List(ctx, prefix)
}

func (l *limiter) ValidateKey(key string) error { return l.inner.ValidateKey(key) }

func (l *limiter) MinTTL() time.Duration { return l.inner.MinTTL() }

func (l *limiter) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	if err := l.enter(ctx); err != nil {
		return err
	}
	defer l.leave()
	return l.inner.Heartbeat(ctx, key, id, ttl)
}

func (l *limiter) Members(ctx context.Context, key string) ([]backend.Member, error) {
	if err := l.enter(ctx); err != nil {
		return nil, err
	}
	defer l.leave()
	return l.inner.Members(ctx, key)
}

func (l *limiter) RemoveMember(ctx context.Context, key, id string) error {
	if err := l.enter(ctx); err != nil {
		return err
	}
	defer l.leave()
	return l.inner.RemoveMember(ctx, key, id)
}

// watchRenewals limits the subscription call only, as Watch does.
func (l *limiter) watchRenewals(ctx context.Context, inner backend.RenewalWatcher, key string, notify func()) (<-chan backend.Event, error) {
	if err := l.enter(ctx); err != nil {
		return nil, err
	}
	defer l.leave()
	return inner.WatchRenewals(ctx, key, notify)
}

// watchRenewalsMuted limits the subscription call only, as Watch does.
func (l *limiter) watchRenewalsMuted(ctx context.Context, inner backend.RenewalMuter, key string, notify func(), muted *backend.Mute) (<-chan backend.Event, error) {
	if err := l.enter(ctx); err != nil {
		return nil, err
	}
	defer l.leave()
	return inner.WatchRenewalsMuted(ctx, key, notify, muted)
}

// Watch limits the subscription call only, not the watch's lifetime.
func (l *limiter) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	if l.watcher == nil {
		return nil, errors.ErrUnsupported
	}
	if err := l.enter(ctx); err != nil {
		return nil, err
	}
	defer l.leave()
	return l.watcher.Watch(ctx, key)
}

func (l *limiter) Close() error { return l.inner.Close() }

func (l *limiter) renewBatch(ctx context.Context, inner backend.BatchRenewer, leases []backend.Lease) []error {
	if err := l.enter(ctx); err != nil {
		errs := make([]error, len(leases))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	defer l.leave()
	return inner.RenewBatch(ctx, leases)
}

func (l *limiter) heartbeatBatch(ctx context.Context, inner backend.BatchHeartbeater, reqs []backend.HeartbeatRequest) []error {
	if err := l.enter(ctx); err != nil {
		errs := make([]error, len(reqs))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	defer l.leave()
	return inner.HeartbeatBatch(ctx, reqs)
}

func (l *limiter) acquireMode(ctx context.Context, inner backend.Modes, req backend.ModeRequest) (backend.Lease, error) {
	if err := l.enter(ctx); err != nil {
		return backend.Lease{}, err
	}
	defer l.leave()
	return inner.AcquireMode(ctx, req)
}

func (l *limiter) holders(ctx context.Context, inner backend.Modes, key string) ([]backend.Record, error) {
	if err := l.enter(ctx); err != nil {
		return nil, err
	}
	defer l.leave()
	return inner.Holders(ctx, key)
}

func (l *limiter) cancelWait(ctx context.Context, inner backend.Modes, key, waitID string) error {
	if err := l.enter(ctx); err != nil {
		return err
	}
	defer l.leave()
	return inner.CancelWait(ctx, key, waitID)
}
