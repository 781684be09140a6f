package main

import (
	"context"

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
	r, h, m := capBatchRenew{c}, capBatchHeartbeat{c}, capModes{c}
	switch {
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
