// Package keeper keeps one lease alive: the part of holding a lease that the
// elector (package sovereign) and the lock package share, so that what makes
// one safe makes the other safe.
//
// A Hold starts from a lease just acquired and the time its acquisition was
// sent. It renews the lease every RenewInterval and counts the holder's
// deadline from the send time of the last renewal that succeeded:
//
//	deadline = sent + min(RenewDeadline, lease.TTL - (TTL - RenewDeadline))
//
// The store keeps the lease for lease.TTL after it received that request, so
// the holder stops before anyone else can acquire; TTL - RenewDeadline absorbs
// clock-rate drift. A timer cancels the hold's context at the deadline even
// when a renewal hangs, and Held checks the monotonic clock on every call, so
// a paused process answers false as soon as it runs again.
//
// Ending a hold has two steps. Step-down (the deadline passes, the store says
// the lease is lost, MaxHold passes, or the owner calls Stop or Release)
// cancels the context at once; renewals go on, so the lease stays the
// holder's while its work winds down. Release, called once that work has
// returned, stops renewing and deletes the lease, owner-checked. A release
// that fails because the store is unreachable is retried in the background
// (owner-checked, so a late one is harmless) until it succeeds, the store
// reports the lease gone, or the parent context given to Start ends: a store
// that comes back with the lease (etcd restores leases with a full TTL after
// a restart) is not left holding it for a dead owner.
package keeper

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// Reason says why a hold stepped down.
type Reason int

const (
	// Deadline: no renewal succeeded in time.
	Deadline Reason = iota + 1
	// LeaseLost: the store reported the lease gone (expired, released or
	// replaced), or a verification did not find it.
	LeaseLost
	// MaxHold: the hold lasted Config.MaxHold; renewals stopped.
	MaxHold
	// Stopped: the owner called Stop.
	Stopped
	// Released: the owner called Release before stepping down.
	Released
)

// String returns the reason's name.
func (r Reason) String() string {
	switch r {
	case Deadline:
		return "deadline"
	case LeaseLost:
		return "lease lost"
	case MaxHold:
		return "max hold"
	case Stopped:
		return "stopped"
	case Released:
		return "released"
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Config configures a Hold. Every duration must be positive except MaxHold;
// the owner validates them.
type Config struct {
	Backend backend.Backend
	// TTL is the TTL requested at acquisition; TTL - RenewDeadline is the
	// drift margin kept back from the TTL the store granted.
	TTL            time.Duration
	RenewDeadline  time.Duration
	RenewInterval  time.Duration
	RequestTimeout time.Duration
	// NoRenew disables automatic renewal: the hold lasts one deadline
	// unless the owner calls Extend.
	NoRenew bool
	// MaxHold, when positive, steps down and stops renewing this long after
	// the acquisition was sent.
	MaxHold time.Duration
	// Cause returns the context cause for a step-down of reason r (err is
	// the error that caused it, if any). Nil: an error naming the reason.
	Cause func(r Reason, err error) error
	// OnError, if not nil, is called for every failed renewal or release
	// attempt (op is "renew" or "release"). It must not block.
	OnError func(op string, err error)
	// OnRenew, if not nil, is called after every successful renewal with its
	// send time and the new deadline. It must not block.
	OnRenew func(sent, deadline time.Time)
}

// Hold keeps one lease. Its methods are safe for concurrent use.
type Hold struct {
	cfg      Config
	lease    backend.Lease
	acquired time.Time // when the acquisition was sent
	parent   context.Context
	ctx      context.Context
	cancel   context.CancelCauseFunc

	kick     chan struct{}    // RenewNow; capacity 1
	release  chan releaseCall // Release
	finished chan struct{}    // closed when the goroutine has ended

	mu        sync.Mutex // guards the fields below
	deadline  time.Time
	lastSent  time.Time // send time of the last successful acquire or renewal
	failures  int       // consecutive failed renewals
	lastErr   error     // last renewal error
	stepped   bool
	reason    Reason
	cause     error
	lost      bool // the store said the lease is gone: nothing to renew or release
	timer     *time.Timer
	relDone   chan struct{} // closed when the first Release has its result
	relResult error
}

type releaseCall struct {
	ctx   context.Context
	reply chan error
}

// Start keeps lease, acquired by a request sent at sent, until Release. parent
// bounds only the background retries of a failed release; ending it does not
// step down (the owner calls Stop or Release for that).
func Start(parent context.Context, cfg Config, lease backend.Lease, sent time.Time) *Hold {
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &Hold{
		cfg:      cfg,
		lease:    lease,
		acquired: sent,
		parent:   parent,
		ctx:      ctx,
		cancel:   cancel,
		kick:     make(chan struct{}, 1),
		release:  make(chan releaseCall),
		finished: make(chan struct{}),
		lastSent: sent,
		relDone:  make(chan struct{}),
	}
	h.deadline = h.deadlineFor(sent)
	h.mu.Lock()
	h.timer = time.AfterFunc(time.Until(h.deadline), func() { h.stepDown(Deadline, nil, nil) })
	h.mu.Unlock()
	go h.run()
	return h
}

// Lease returns the lease kept.
func (h *Hold) Lease() backend.Lease { return h.lease }

// Context returns a context cancelled at step-down, with the step-down's
// cause (context.Cause).
func (h *Hold) Context() context.Context { return h.ctx }

// Done is closed at step-down.
func (h *Hold) Done() <-chan struct{} { return h.ctx.Done() }

// Finished is closed once the hold's goroutine has ended: after Release and
// any background release retries.
func (h *Hold) Finished() <-chan struct{} { return h.finished }

// Held reports whether the hold has not stepped down and its deadline has
// not passed, checking the clocks now: the monotonic clock, and the wall
// clock as well (see wallNow). A deadline found passed steps down at once,
// so that Held, Reason and the context always agree.
func (h *Hold) Held() bool {
	h.mu.Lock()
	if h.stepped {
		h.mu.Unlock()
		return false
	}
	var err error
	switch {
	case !time.Now().Before(h.deadline):
		// The deadline timer is due; step down now rather than wait for it.
	case !wallNow().Before(h.deadline.Round(0)):
		err = errWallClock
	default:
		h.mu.Unlock()
		return true
	}
	h.mu.Unlock()
	h.stepDown(Deadline, err, nil)
	return false
}

// wallNow reads the wall clock, stripped of its monotonic reading. The
// deadline is kept on both clocks: Linux's monotonic clock stops while the
// machine is suspended (a suspended VM, a laptop asleep), so after a resume
// only the wall clock, once corrected, shows that the lease's TTL has passed.
// A wall clock stepped forward therefore makes a holder step down early, the
// safe direction; one stepped back changes nothing (the monotonic deadline
// still holds). Tests replace it.
var wallNow = func() time.Time { return time.Now().Round(0) }

// errWallClock is the error of a step-down because the wall clock passed the
// deadline before the monotonic clock did.
var errWallClock = errors.New("keeper: the wall clock passed the deadline (machine suspended, or clock stepped forward)")

// Deadline returns when the hold steps down unless a renewal succeeds.
func (h *Hold) Deadline() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadline
}

// Status is a snapshot of a hold.
type Status struct {
	Held        bool
	Deadline    time.Time
	LastRenewal time.Time // send time of the last successful acquire or renewal
	Failures    int       // consecutive failed renewals
	LastError   error
	Reason      Reason // zero while held
	Cause       error  // the step-down's cause; nil while held
}

// Status returns a snapshot of the hold.
func (h *Hold) Status() Status {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Status{
		Held:        !h.stepped && time.Now().Before(h.deadline),
		Deadline:    h.deadline,
		LastRenewal: h.lastSent,
		Failures:    h.failures,
		LastError:   h.lastErr,
		Reason:      h.reason,
		Cause:       h.cause,
	}
}

// Reason returns why the hold stepped down, and the cause given to its
// context; zero and nil while it holds.
func (h *Hold) Reason() (Reason, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason, h.cause
}

// Stop steps down with cause (the context's cause) unless the hold already
// stepped down, and reports whether this call did it. Renewals go on until
// Release.
func (h *Hold) Stop(cause error) bool {
	return h.stepDown(Stopped, nil, cause)
}

// RenewNow asks for a renewal as soon as possible, for instance because the
// store may have restarted and lost the lease. It does not block.
func (h *Hold) RenewNow() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// Extend renews the lease now, in the caller's goroutine, bounded by ctx,
// RequestTimeout and the deadline. It returns an error wrapping
// backend.ErrLeaseLost (and steps down) when the store no longer holds the
// lease, and the step-down's cause when the hold has stepped down (also when
// this renewal succeeded only after the deadline had passed).
func (h *Hold) Extend(ctx context.Context) error {
	if !h.Held() {
		_, cause := h.Reason()
		return cause
	}
	err := h.renew(ctx)
	if !h.Held() { // cut at the deadline, or landed after it: too late
		_, cause := h.Reason()
		return cause
	}
	return err
}

// Verify reads the record back and checks it is this lease (holder, token
// and term): one round trip, for use before an irreversible step. When it is
// not, the hold steps down and the error wraps backend.ErrLeaseLost; when the
// hold had already stepped down, the error is the step-down's cause.
func (h *Hold) Verify(ctx context.Context) (backend.Record, error) {
	if !h.Held() {
		_, cause := h.Reason()
		return backend.Record{}, cause
	}
	ctx, cancel := context.WithTimeout(ctx, h.cfg.RequestTimeout)
	defer cancel()
	rec, err := h.cfg.Backend.Get(ctx, h.lease.Key)
	switch {
	case errors.Is(err, backend.ErrNotHeld):
		err = fmt.Errorf("%w: %w", backend.ErrLeaseLost, err)
	case err != nil:
		return rec, err
	case rec.HolderID != h.lease.HolderID || rec.Token != h.lease.Token || rec.Term != h.lease.Term:
		err = fmt.Errorf("%w: %q is held by %q (term %d), not this lease (term %d)",
			backend.ErrLeaseLost, h.lease.Key, rec.HolderID, rec.Term, h.lease.Term)
	default:
		if !h.Held() {
			_, cause := h.Reason()
			return rec, cause
		}
		return rec, nil
	}
	h.markLost(err)
	return rec, err
}

// SetMetadata replaces the lease's metadata, owner-checked. When the store no
// longer holds the lease the hold steps down and the error wraps
// backend.ErrLeaseLost.
func (h *Hold) SetMetadata(ctx context.Context, md map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.RequestTimeout)
	defer cancel()
	err := h.cfg.Backend.SetMetadata(ctx, h.lease, md)
	if errors.Is(err, backend.ErrLeaseLost) {
		h.markLost(err)
	}
	return err
}

// Release steps down (reason Released) unless the hold already stepped down,
// stops renewing and deletes the lease, owner-checked, bounded by ctx and
// RequestTimeout. It returns nil when the lease was deleted, an error
// wrapping backend.ErrLeaseLost when the store no longer held it (it had been
// lost), or the store's error; in that last case the release is retried in
// the background until it succeeds, the store reports the lease gone, or the
// parent context ends. Later calls return the first call's result.
func (h *Hold) Release(ctx context.Context) error {
	h.stepDown(Released, nil, nil)
	reply := make(chan error, 1)
	select {
	case h.release <- releaseCall{ctx: ctx, reply: reply}:
		err := <-reply
		h.mu.Lock()
		h.relResult = err
		close(h.relDone)
		h.mu.Unlock()
		return err
	case <-h.relDone:
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.relResult
	}
}

// run renews until Release, then releases.
func (h *Hold) run() {
	defer close(h.finished)
	o := &h.cfg
	renew := time.NewTimer(o.RenewInterval)
	if o.NoRenew {
		renew.Stop()
	}
	defer renew.Stop()
	var maxHold <-chan time.Time
	if o.MaxHold > 0 {
		t := time.NewTimer(time.Until(h.acquired.Add(o.MaxHold)))
		defer t.Stop()
		maxHold = t.C
	}
	renewing := !o.NoRenew
	for {
		select {
		case call := <-h.release:
			h.finish(call)
			return
		case <-maxHold:
			maxHold = nil
			renewing = false
			renew.Stop()
			h.stepDown(MaxHold, nil, nil)
		case <-h.kick:
			if !renewing || h.isLost() {
				break
			}
			renew.Stop()
			h.renewTick(renew)
		case <-renew.C:
			if !renewing || h.isLost() {
				break
			}
			h.renewTick(renew)
		}
	}
}

// renewTick renews once and re-arms t.
func (h *Hold) renewTick(t *time.Timer) {
	h.Held() // steps down first if the wall clock passed the deadline
	err := h.renew(context.Background())
	switch {
	case err == nil:
		t.Reset(h.cfg.RenewInterval)
	case errors.Is(err, backend.ErrLeaseLost):
		// Nothing left to renew.
	default:
		t.Reset(h.cfg.RenewInterval / 4)
	}
}

// renew sends one owner-checked renewal and updates the deadline.
func (h *Hold) renew(ctx context.Context) error {
	s := time.Now()
	dl := s.Add(h.cfg.RequestTimeout)
	h.mu.Lock()
	if !h.stepped {
		dl = minTime(dl, h.deadline)
	}
	h.mu.Unlock()
	cctx, cancel := context.WithDeadline(ctx, dl)
	err := h.cfg.Backend.Renew(cctx, h.lease)
	cancel()
	switch {
	case err == nil:
		h.renewed(s)
	case ctx.Err() != nil:
		// The caller's context ended (Extend): not a store failure.
	case errors.Is(err, backend.ErrLeaseLost):
		h.markLost(err)
	default:
		h.mu.Lock()
		h.failures++
		// A call cut at the deadline says only that time ran out; keep the
		// error that explains why the earlier ones failed.
		if h.lastErr == nil || !errors.Is(err, context.DeadlineExceeded) {
			h.lastErr = err
		}
		h.mu.Unlock()
		if h.cfg.OnError != nil {
			h.cfg.OnError("renew", err)
		}
	}
	return err
}

// renewed records a renewal sent at s and moves the deadline, unless the
// hold already stepped down or its deadline passed (then the deadline timer
// steps down: a late success never revives a hold).
func (h *Hold) renewed(s time.Time) {
	h.mu.Lock()
	h.failures, h.lastErr = 0, nil
	if s.After(h.lastSent) {
		h.lastSent = s
	}
	nd := h.deadlineFor(h.lastSent)
	extended := false
	if !h.stepped && time.Now().Before(h.deadline) && nd.After(h.deadline) && h.timer.Stop() {
		h.deadline = nd
		h.timer.Reset(time.Until(nd))
		extended = true
	}
	dl := h.deadline
	h.mu.Unlock()
	if extended && h.cfg.OnRenew != nil {
		h.cfg.OnRenew(s, dl)
	}
}

func (h *Hold) deadlineFor(sent time.Time) time.Time {
	o := &h.cfg
	margin := o.TTL - o.RenewDeadline
	return sent.Add(min(o.RenewDeadline, h.lease.TTL-margin))
}

func (h *Hold) isLost() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lost
}

// markLost records that the store no longer holds the lease and steps down.
func (h *Hold) markLost(err error) {
	h.mu.Lock()
	h.lost = true
	h.mu.Unlock()
	h.stepDown(LeaseLost, err, nil)
}

// stepDown ends the hold once: the deadline stops moving, Held turns false,
// then the context is cancelled. cause, when not nil, is the context's cause;
// otherwise Config.Cause builds it.
func (h *Hold) stepDown(r Reason, err, cause error) bool {
	h.mu.Lock()
	if h.stepped {
		h.mu.Unlock()
		return false
	}
	if r == Deadline && err == nil {
		err = h.lastErr
	}
	if cause == nil {
		if h.cfg.Cause != nil {
			cause = h.cfg.Cause(r, err)
		} else if err != nil {
			cause = fmt.Errorf("keeper: %s: %w", r, err)
		} else {
			cause = fmt.Errorf("keeper: %s", r)
		}
	}
	h.stepped, h.reason, h.cause = true, r, cause
	h.timer.Stop()
	if now := time.Now(); now.Before(h.deadline) {
		h.deadline = now
	}
	h.mu.Unlock()
	h.cancel(cause)
	return true
}

// finish releases the lease for call, then retries in the background while
// the store is unreachable.
func (h *Hold) finish(call releaseCall) {
	if h.isLost() {
		_, cause := h.Reason()
		call.reply <- fmt.Errorf("%w: %w", backend.ErrLeaseLost, cause)
		return
	}
	err := h.releaseOnce(call.ctx)
	if err == nil || errors.Is(err, backend.ErrLeaseLost) {
		call.reply <- err
		return
	}
	call.reply <- err
	for n := 1; ; n++ {
		if !sleep(h.parent, backoff(h.cfg.RenewInterval, n)) {
			return
		}
		err := h.releaseOnce(h.parent)
		if err == nil || errors.Is(err, backend.ErrLeaseLost) || h.parent.Err() != nil {
			return
		}
	}
}

func (h *Hold) releaseOnce(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, h.cfg.RequestTimeout)
	defer cancel()
	err := h.cfg.Backend.Release(ctx, h.lease)
	if err != nil && !errors.Is(err, backend.ErrLeaseLost) && h.cfg.OnError != nil {
		h.cfg.OnError("release", err)
	}
	return err
}

// backoff returns the delay before retry n (1-based): exponential from
// interval/8 up to interval, with jitter.
func backoff(interval time.Duration, n int) time.Duration {
	d := interval / 8
	for i := 1; i < n && d < interval; i++ {
		d *= 2
	}
	d = max(min(d, interval), time.Millisecond)
	return d/2 + rand.N(d/2+1)
}

// sleep waits for d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
