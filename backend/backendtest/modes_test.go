package backendtest_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// modeMutations maps the name of each broken backend.Modes to the Modes
// subtests that must catch it; TestSuiteCatchesBrokenBackends runs them with
// the others.
var modeMutations = map[string][]string{
	"limit-plus-one":                 {"ModesLimit"},
	"exclusive-evicts-shared":        {"ModesManyShared", "ModesExclusiveVsShared"},
	"limit-mismatch-as-held":         {"ModesLimitMismatch"},
	"plain-acquire-evicts-entries":   {"ModesPlainAcquire"},
	"release-every-entry-of-holder":  {"ModesOwnerChecked"},
	"entry-renew-ignores-owner":      {"ModesOwnerChecked"},
	"entry-renew-resurrects":         {"ModesEntryExpires"},
	"mode-constant-term":             {"ModesTerms"},
	"holders-newest-first":           {"ModesManyShared", "ModesHoldersGetList"},
	"get-newest-holder":              {"ModesHoldersGetList"},
	"list-one-record-per-key":        {"ModesHoldersGetList"},
	"writer-wait-not-registered":     {"ModesWriterPreference"},
	"fair-not-fair":                  {"ModesFairOrder"},
	"cancel-wait-noop":               {"ModesWriterPreference", "ModesCancelWaitFair"},
	"hierarchy-without-intents":      {"ModesHierarchy", "ModesIntentExpires"},
	"ancestor-watch-silent":          {"ModesWatch"},
	"unsupported-silently-exclusive": {"ModesUnsupported"},
	"invalid-ancestor-dropped":       {"ModesInvalid"},
	"mode-ignores-cancel":            {"ModesCancelledAndClosed"},
	"keeps-wait-ids":                 {"ModesBoundedState"},
	"restart-keeps-entries":          {"ModesRestartLosingData"},
	"waiter-not-refreshed":           {"ModesWriterPreference"},
	"ancestor-waiters-ignored":       {"ModesAncestorWaiters"},
	"register-only-acquires":         {"ModesRegisterOnly"},
}

func init() {
	for name, subtests := range modeMutations {
		mutations[name] = subtests
	}
}

// brokenModes wraps a memory backend client, Modes included, and breaks
// one promise of Modes, the one its name says.
type brokenModes struct {
	*memorybackend.Backend
	name string
	sh   *shared
}

func (b *brokenModes) ModeSupport() backend.ModeSupport {
	ms := b.Backend.ModeSupport()
	switch b.name {
	case "unsupported-silently-exclusive":
		return backend.ModeSupport{}
	case "ancestor-waiters-ignored":
		// Claims the rule; the client below was told not to apply it.
		ms.AncestorWaiters = true
	}
	return ms
}

func (b *brokenModes) AcquireMode(ctx context.Context, req backend.ModeRequest) (backend.Lease, error) {
	asked := req
	switch b.name {
	case "limit-plus-one":
		if req.Limit > 0 {
			req.Limit++
		}
	case "writer-wait-not-registered":
		if !req.Fair {
			req.WaitID = ""
		}
	case "fair-not-fair":
		req.Fair = false
	case "hierarchy-without-intents":
		req.Ancestors = nil
	case "unsupported-silently-exclusive":
		req.Mode, req.Limit, req.Ancestors, req.Fair = backend.Exclusive, 0, nil, false
	case "invalid-ancestor-dropped":
		req.Ancestors = slices.DeleteFunc(slices.Clone(req.Ancestors), func(a string) bool {
			return a == "" || len(a) >= len(req.Key) || !strings.HasPrefix(req.Key, a)
		})
		if !slices.IsSortedFunc(req.Ancestors, func(x, y string) int { return len(x) - len(y) }) {
			req.Ancestors = nil
		}
	case "mode-ignores-cancel":
		ctx = context.WithoutCancel(ctx)
	case "register-only-acquires":
		req.RegisterOnly = false
	}
	if req.WaitID != "" {
		b.sh.mu.Lock()
		again := b.sh.waitIDs[req.Key+"/"+req.WaitID]
		b.sh.waitIDs[req.Key+"/"+req.WaitID] = true
		b.sh.mu.Unlock()
		if again && b.name == "waiter-not-refreshed" {
			// Registered once, never refreshed; a success still removes
			// the registration.
			l, err := b.Backend.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: req.AcquireRequest, Mode: req.Mode, Limit: req.Limit, Ancestors: req.Ancestors, Fair: req.Fair})
			if err == nil {
				_ = b.Backend.CancelWait(ctx, req.Key, req.WaitID)
			}
			return l, err
		}
	}
	b.sh.mu.Lock()
	for _, a := range req.Ancestors {
		b.sh.ancestors[a] = true
	}
	b.sh.mu.Unlock()
	l, err := b.Backend.AcquireMode(ctx, req)
	var held *backend.HeldError
	switch {
	case b.name == "exclusive-evicts-shared" && req.Mode == backend.Exclusive && errors.As(err, &held) &&
		!slices.ContainsFunc(held.Holders, func(r backend.Record) bool { return r.Mode == backend.Exclusive }):
		for _, r := range held.Holders {
			_ = b.Backend.Release(ctx, leaseOf(r))
		}
		l, err = b.Backend.AcquireMode(ctx, req)
	case b.name == "limit-plus-one" && errors.As(err, &held):
		held.Holders = b.fixLimits(held.Holders)
		held.Holder = b.fixLimits([]backend.Record{held.Holder})[0]
	case b.name == "limit-mismatch-as-held" && errors.Is(err, backend.ErrLimitMismatch):
		err = &backend.HeldError{Holder: backend.Record{Key: req.Key}}
	case b.name == "mode-constant-term" && err == nil:
		l.Term = 1
	}
	if err == nil && l.Entry != nil {
		// Report what was asked for, whatever the store was told.
		l.Entry = &backend.Entry{Mode: asked.Mode, Limit: asked.Limit, Ancestors: slices.Clone(asked.Ancestors)}
	}
	return l, err
}

// leaseOf returns the lease a record stands for.
func leaseOf(r backend.Record) backend.Lease {
	l := backend.Lease{Key: r.Key, HolderID: r.HolderID, Token: r.Token, Term: r.Term, TTL: max(r.TTL, 1)}
	if r.Mode == backend.Shared || r.Limit > 0 {
		l.Entry = &backend.Entry{Mode: r.Mode, Limit: r.Limit}
	}
	return l
}

// fixLimits rewrites the limits of records the way limit-plus-one reports
// them.
func (b *brokenModes) fixLimits(recs []backend.Record) []backend.Record {
	if b.name == "limit-plus-one" {
		for i := range recs {
			if recs[i].Limit > 0 {
				recs[i].Limit--
			}
		}
	}
	return recs
}

func (b *brokenModes) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	l, err := b.Backend.Acquire(ctx, req)
	var held *backend.HeldError
	if b.name == "plain-acquire-evicts-entries" && errors.As(err, &held) {
		for _, r := range b.holders(ctx, req.Key) {
			if r.Mode == backend.Shared {
				_ = b.Backend.Release(ctx, leaseOf(r))
			}
		}
		return b.Backend.Acquire(ctx, req)
	}
	return l, err
}

// holders returns the store's Holders of key, ignoring errors.
func (b *brokenModes) holders(ctx context.Context, key string) []backend.Record {
	recs, _ := b.Backend.Holders(ctx, key)
	return recs
}

func (b *brokenModes) Renew(ctx context.Context, l backend.Lease) error {
	err := b.Backend.Renew(ctx, l)
	switch {
	case l.Entry == nil || !errors.Is(err, backend.ErrLeaseLost):
	case b.name == "entry-renew-ignores-owner":
		return nil
	case b.name == "entry-renew-resurrects":
		req := backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: l.Key, HolderID: l.HolderID, TTL: l.TTL}, Mode: l.Entry.Mode, Limit: l.Entry.Limit}
		_, err := b.Backend.AcquireMode(ctx, req)
		return err
	}
	return err
}

func (b *brokenModes) Release(ctx context.Context, l backend.Lease) error {
	err := b.Backend.Release(ctx, l)
	if b.name == "release-every-entry-of-holder" && err == nil && l.Entry != nil {
		for _, r := range b.holders(ctx, l.Key) {
			if r.HolderID == l.HolderID {
				_ = b.Backend.Release(ctx, leaseOf(r))
			}
		}
	}
	return err
}

func (b *brokenModes) Holders(ctx context.Context, key string) ([]backend.Record, error) {
	recs, err := b.Backend.Holders(ctx, key)
	if b.name == "holders-newest-first" {
		slices.Reverse(recs)
	}
	return b.fixLimits(recs), err
}

func (b *brokenModes) Get(ctx context.Context, key string) (backend.Record, error) {
	rec, err := b.Backend.Get(ctx, key)
	if b.name == "get-newest-holder" && err == nil {
		if recs := b.holders(ctx, key); len(recs) > 0 {
			rec = recs[len(recs)-1]
		}
	}
	return b.fixLimits([]backend.Record{rec})[0], err
}

func (b *brokenModes) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	recs, err := b.Backend.List(ctx, prefix)
	if b.name == "list-one-record-per-key" {
		recs = slices.CompactFunc(recs, func(x, y backend.Record) bool { return x.Key == y.Key })
	}
	return b.fixLimits(recs), err
}

func (b *brokenModes) CancelWait(ctx context.Context, key, waitID string) error {
	if b.name == "cancel-wait-noop" {
		return nil
	}
	return b.Backend.CancelWait(ctx, key, waitID)
}

func (b *brokenModes) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	ch, err := b.Backend.Watch(ctx, key)
	if err != nil || b.name != "ancestor-watch-silent" {
		return ch, err
	}
	out := make(chan backend.Event, 16)
	go func() {
		defer close(out)
		for e := range ch {
			b.sh.mu.Lock()
			ancestor := b.sh.ancestors[e.Key]
			b.sh.mu.Unlock()
			if ancestor && e.Type != backend.EventChanged {
				continue
			}
			select {
			case out <- e:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// TestSuitePassesUnbrokenModesWrapper makes sure the Modes wrapper keeps the
// contract when nothing is broken, so the failures of the Modes mutations
// come from the mutation alone.
func TestSuitePassesUnbrokenModesWrapper(t *testing.T) {
	if testing.Short() {
		t.Skip("the full suite again; -short skips it")
	}
	backendtest.Run(t, func(t *testing.T) backendtest.Env { return brokenEnv(t, "modes-none") })
}
