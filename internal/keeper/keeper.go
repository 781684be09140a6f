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
// A hold on a backend that renews one lease per call has one timer, armed for
// the earliest of its deadline, its next renewal and MaxHold, and no
// goroutine: the timer's callback renews, and a renewal's goroutine exists
// only while it runs.
//
// On a backend that renews in batches (backend.BatchRenewer), the periodic
// renewals of every hold with the same backend and RenewInterval are driven
// by one shared scheduler: one timer wakes it at each instant of a grid
// (multiples of the interval, never later than one interval after the
// previous renewal), and its one goroutine, which exists only while it runs,
// sends every hold due with one batch call: an instance holding thousands of
// leases sends one request per interval (per slot, on Redis Cluster) and
// keeps no timer, context or goroutine per lease. More holds due at once
// than one call carries (coalesce.MaxBatch) go in chunks, up to
// coalesce.MaxInFlight calls in flight at once (from as many goroutines,
// which exist only while the instant's calls do), so that a slow or hung
// call does not delay the chunks after it. Each lease is still checked on
// its own: one the store lost steps down alone, and each hold's deadline
// counts from the send time of the batch call that covered it. The
// deadlines live in buckets (one per batch call and deadline) watched by the
// scheduler's one deadline timer, which runs apart from the batch calls: a
// hold whose batch hangs steps down at its own deadline.
//
// Ending a hold has two steps. Step-down (the deadline passes, the store says
// the lease is lost, MaxHold passes, or the owner calls Stop or Release)
// cancels the context at once; renewals go on, so the lease stays the
// holder's while its work winds down. Release, called once that work has
// returned, stops renewing and deletes the lease, owner-checked; a renewal
// in flight, alone or in a batch, is waited for first, so none is sent after
// it. A release that fails because the store is unreachable is retried in
// the background (owner-checked, so a late one is harmless) until it
// succeeds, the store reports the lease gone, or the parent context given to
// Start ends: a store that comes back with the lease (etcd restores leases
// with a full TTL after a restart) is not left holding it for a dead owner.
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

// Owner receives a hold's events. It is an alternative to Config's callback
// fields that costs no closure per hold (a lock passes itself); when both
// are set, the callback fields are used. Its methods must not block.
type Owner interface {
	// Cause returns the context cause for a step-down of reason r (err is
	// the error that caused it, if any). It is called once, with the
	// hold's lock held, when the cause is first needed: at step-down when
	// the context was made, else by Reason, Status or Context.
	Cause(r Reason, err error) error
	// SteppedDown is called once, after the hold stepped down for reason r
	// and its context (if one was made) was cancelled, from the goroutine
	// that stepped it down. Reason returns the cause.
	SteppedDown(r Reason)
	// Failed is called for every failed renewal or release attempt (op is
	// "renew" or "release").
	Failed(op string, err error)
	// Finished is called once the hold has finished, as Config.OnFinished.
	Finished()
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
	// Owner, if not nil, receives the hold's events (see Owner).
	Owner Owner
	// Bounds, if not nil, bounds Release's call by RequestTimeout with a
	// context shared with other calls (see Bounds) when Release's context
	// is never cancelled, instead of a context.WithTimeout of its own.
	// Its parent must not end before the owner's releases are done.
	Bounds *Bounds
	// Cause returns the context cause for a step-down of reason r (err is
	// the error that caused it, if any). Nil: Owner.Cause, or an error
	// naming the reason.
	Cause func(r Reason, err error) error
	// OnError, if not nil, is called for every failed renewal or release
	// attempt (op is "renew" or "release"). It must not block.
	OnError func(op string, err error)
	// OnRenew, if not nil, is called after every successful renewal with its
	// send time and the new deadline. It must not block.
	OnRenew func(sent, deadline time.Time)
	// OnStepDown, if not nil, is called once, after the hold stepped down
	// for reason r and its context (if one was made) was cancelled, from the
	// goroutine that stepped it down (the caller of Stop, Release or Held, a
	// timer callback, a renewal). It must not block, nor take a lock held
	// around Held.
	OnStepDown func(r Reason)
	// OnFinished, if not nil, is called once the hold has finished, as
	// Finished is closed, from the goroutine that closes it (Release's
	// caller, or the goroutine retrying a failed release). It must not
	// block.
	OnFinished func()
}

// Hold keeps one lease. Its methods are safe for concurrent use.
//
// A Hold has no goroutine of its own: its renewals, its deadline and MaxHold
// run in timer callbacks (its own timer's, or its scheduler's), Release runs
// in the caller's goroutine, and only a release that failed starts a
// goroutine, to retry it. Its context and channels are made when first asked
// for.
type Hold struct {
	cfg      Config
	sch      *scheduler // non-nil: periodic renewals go through a shared scheduler, in batches
	lease    backend.Lease
	acquired time.Time // when the acquisition was sent
	parent   context.Context

	mu        sync.Mutex // guards the fields below
	ctx       context.Context
	cancel    context.CancelCauseFunc // nil until Context is first called
	deadline  time.Time
	lastSent  time.Time // send time of the last successful acquire or renewal
	failures  int       // consecutive failed renewals
	lastErr   error     // last renewal error
	stepped   bool
	reason    Reason
	stepErr   error         // the error that caused the step-down, if any
	cause     error         // built from reason and stepErr when first needed
	lost      bool          // the store said the lease is gone: nothing to renew or release
	timer     *time.Timer   // own timer: deadline, renewal and MaxHold; with a scheduler MaxHold only (nil without)
	nextRenew time.Time     // without a scheduler: when the next periodic renewal is due
	maxDone   bool          // MaxHold has passed
	renewOn   bool          // renewals go on: not NoRenew, MaxHold not passed, not releasing
	renewing  bool          // a renewal of this hold's own runs
	kicked    bool          // RenewNow was called while a renewal ran: renew again after it
	renewWait chan struct{} // made by Release waiting for a renewal of its own; closed when it ends
	releasing bool          // Release has begun: no renewal starts any more
	relOver   bool          // the first Release has its result
	relWait   chan struct{} // made by a second Release call; closed with relOver
	relResult error
	heldUntil time.Time     // the deadline when the hold stepped down (HeldUntil)
	done      bool          // the hold has finished
	finished  chan struct{} // made by Finished; closed once done

	m member // guarded by sch.mu
}

// Start keeps lease, acquired by a request sent at sent, until Release. parent
// bounds only the background retries of a failed release; ending it does not
// step down (the owner calls Stop or Release for that).
func Start(parent context.Context, cfg Config, lease backend.Lease, sent time.Time) *Hold {
	h := new(Hold)
	StartIn(h, parent, cfg, lease, sent)
	return h
}

// StartIn is Start keeping the hold in h, a zero Hold (inside the owner's
// own struct, say, to save an allocation), which must not be copied.
func StartIn(h *Hold, parent context.Context, cfg Config, lease backend.Lease, sent time.Time) {
	h.cfg, h.lease, h.acquired, h.parent = cfg, lease, sent, parent
	h.lastSent, h.renewOn, h.m.idx = sent, !cfg.NoRenew, -1
	h.deadline = h.deadlineFor(sent)
	now := time.Now()
	if !cfg.NoRenew {
		if s := schedulerFor(cfg.Backend, cfg.RenewInterval); s != nil {
			for !s.add(h, now) {
				// That scheduler went idle and was dropped: take the next.
				s = schedulerFor(cfg.Backend, cfg.RenewInterval)
			}
			if cfg.MaxHold > 0 {
				// The callback takes h.mu first, so it never runs before
				// the timer is set.
				h.mu.Lock()
				h.timer = time.AfterFunc(h.acquired.Add(cfg.MaxHold).Sub(now), h.fire)
				h.mu.Unlock()
			}
			return
		}
		h.nextRenew = now.Add(cfg.RenewInterval)
	}
	// The callback takes h.mu first, so it never runs before h is set.
	h.mu.Lock()
	h.timer = time.AfterFunc(h.nextEventLocked().Sub(now), h.fire)
	h.mu.Unlock()
}

// Lease returns the lease kept.
func (h *Hold) Lease() backend.Lease { return h.lease }

// Acquired returns when the lease's acquisition was sent, as given to Start.
func (h *Hold) Acquired() time.Time { return h.acquired }

// Context returns a context cancelled at step-down, with the step-down's
// cause (context.Cause). It is made on the first call; after step-down that
// call returns a context already cancelled with the cause.
func (h *Hold) Context() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx == nil {
		h.ctx, h.cancel = context.WithCancelCause(context.Background())
		if h.stepped {
			// No one else holds this context yet: cancelling it under h.mu
			// runs nothing.
			h.cancel(h.causeLocked())
		}
	}
	return h.ctx
}

// Done is closed at step-down.
func (h *Hold) Done() <-chan struct{} { return h.Context().Done() }

// Finished is closed once nothing of the hold runs any more: after Release
// has returned, any renewal in flight has ended, and any background release
// retries have ended.
func (h *Hold) Finished() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.finished == nil {
		h.finished = make(chan struct{})
		if h.done {
			close(h.finished)
		}
	}
	return h.finished
}

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

// HeldUntil returns the deadline the hold had when it stepped down (before
// the step-down moved it to that moment), or its deadline while it holds:
// until then, had the store kept the lease, nobody else could have taken
// it.
func (h *Hold) HeldUntil() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stepped {
		return h.heldUntil
	}
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
		Cause:       h.causeLocked(),
	}
}

// Reason returns why the hold stepped down, and the cause given to its
// context; zero and nil while it holds.
func (h *Hold) Reason() (Reason, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason, h.causeLocked()
}

// Stepped returns why the hold stepped down; zero while it holds. Unlike
// Reason it does not build the cause.
func (h *Hold) Stepped() Reason {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reason
}

// causeLocked returns the step-down's cause, building it on first use; nil
// while the hold holds. h.mu must be held.
func (h *Hold) causeLocked() error {
	if !h.stepped || h.cause != nil {
		return h.cause
	}
	r, err := h.reason, h.stepErr
	switch {
	case h.cfg.Cause != nil:
		h.cause = h.cfg.Cause(r, err)
	case h.cfg.Owner != nil:
		h.cause = h.cfg.Owner.Cause(r, err)
	case err != nil:
		h.cause = fmt.Errorf("keeper: %s: %w", r, err)
	default:
		h.cause = fmt.Errorf("keeper: %s", r)
	}
	return h.cause
}

// Stop steps down with cause (the context's cause) unless the hold already
// stepped down, and reports whether this call did it. Renewals go on until
// Release.
func (h *Hold) Stop(cause error) bool {
	return h.stepDown(Stopped, nil, cause)
}

// RenewNow asks for a renewal as soon as possible, for instance because the
// store may have restarted and lost the lease. It does not block: it starts
// the renewal in a goroutine (or, on a backend that renews in batches, wakes
// the scheduler, which renews every hold asked for in one batch), or, when
// one is running, has it renew once more when it ends. It does nothing once
// renewals have stopped (NoRenew, MaxHold, Release, or the store reported
// the lease gone).
func (h *Hold) RenewNow() {
	if h.sch != nil {
		h.sch.renewNow(h)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.renewOn || h.lost:
	case h.renewing:
		h.kicked = true
	default:
		h.renewing = true
		go h.renewLoop()
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
	_, err := h.renew(ctx, false)
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
// RequestTimeout. It runs in the caller's goroutine; a renewal in flight
// (alone, or in a batch) is waited for first (it is bounded by
// RequestTimeout), so no renewal is sent after the release. It returns nil
// when the lease was deleted, an error wrapping backend.ErrLeaseLost when the
// store no longer held it (it had been lost), or the store's error; in that
// last case the release is retried in the background until it succeeds, the
// store reports the lease gone, or the parent context ends. Later calls
// return the first call's result.
func (h *Hold) Release(ctx context.Context) error {
	h.stepDown(Released, nil, nil)
	h.mu.Lock()
	if h.releasing {
		if !h.relOver {
			if h.relWait == nil {
				h.relWait = make(chan struct{})
			}
			w := h.relWait
			h.mu.Unlock()
			<-w
			h.mu.Lock()
		}
		defer h.mu.Unlock()
		return h.relResult
	}
	h.releasing, h.renewOn, h.kicked = true, false, false
	var inFlight <-chan struct{}
	if h.renewing {
		if h.renewWait == nil {
			h.renewWait = make(chan struct{})
		}
		inFlight = h.renewWait
	}
	if h.timer != nil { // spares reading the clock for nothing
		h.armLocked(time.Now())
	}
	lost := h.lost
	h.mu.Unlock()
	if h.sch != nil {
		if f := h.sch.remove(h); f != nil {
			inFlight = f
		}
	}
	if inFlight != nil {
		<-inFlight
		lost = h.isLost()
	}

	var err error
	if lost {
		_, cause := h.Reason()
		err = fmt.Errorf("%w: %w", backend.ErrLeaseLost, cause)
	} else {
		err = h.releaseOnce(ctx)
	}
	retry := err != nil && !errors.Is(err, backend.ErrLeaseLost)
	h.mu.Lock()
	h.relResult, h.relOver = err, true
	if h.relWait != nil {
		close(h.relWait)
	}
	h.mu.Unlock()
	if retry {
		go h.retryRelease()
	} else {
		h.finish()
	}
	return err
}

// retryRelease retries a failed release in the background while the store is
// unreachable, until it succeeds, the store reports the lease gone, or the
// parent context ends; then the hold has finished.
func (h *Hold) retryRelease() {
	defer h.finish()
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

// finish closes Finished and calls OnFinished.
func (h *Hold) finish() {
	h.mu.Lock()
	h.done = true
	if h.finished != nil {
		close(h.finished)
	}
	h.mu.Unlock()
	switch {
	case h.cfg.OnFinished != nil:
		h.cfg.OnFinished()
	case h.cfg.Owner != nil:
		h.cfg.Owner.Finished()
	}
}

// fire is the callback of the hold's own timer: it steps down at the
// deadline or at MaxHold, starts a periodic renewal when one is due (and
// runs it in this goroutine), and re-arms the timer for what comes next.
// Every decision is taken under h.mu against the clock, so a callback that
// runs early or twice does no harm.
func (h *Hold) fire() {
	h.mu.Lock()
	now := time.Now()
	var (
		deadline = !h.stepped && !now.Before(h.deadline) && h.sch == nil
		maxHold  = h.cfg.MaxHold > 0 && !h.maxDone && !now.Before(h.acquired.Add(h.cfg.MaxHold))
		leave    = false // the hold leaves its scheduler: MaxHold stops renewals
		renew    = false
	)
	if maxHold {
		h.maxDone = true
		leave = h.sch != nil && h.renewOn
		h.renewOn, h.kicked = false, false
	}
	if h.sch == nil && h.renewOn && !h.lost && !h.renewing && !now.Before(h.nextRenew) {
		h.renewing, renew = true, true
	}
	h.armLocked(now)
	h.mu.Unlock()
	if leave {
		h.sch.remove(h)
	}
	// The deadline comes first when both are due: the hold is no longer
	// certain of its lease, whatever MaxHold says.
	if deadline {
		h.stepDown(Deadline, nil, nil)
	}
	if maxHold {
		h.stepDown(MaxHold, nil, nil)
	}
	if renew {
		h.renewLoop()
	}
}

// armLocked sets the hold's own timer for the earliest event still to come:
// the deadline (until step-down), the next periodic renewal (while none
// runs) and MaxHold; on a hold with a scheduler, MaxHold only. h.mu must be
// held.
func (h *Hold) armLocked(now time.Time) {
	if h.timer == nil {
		return
	}
	next := h.nextEventLocked()
	if next.IsZero() {
		h.timer.Stop()
		return
	}
	h.timer.Reset(next.Sub(now))
}

// nextEventLocked returns when the hold's own timer must fire next (see
// armLocked), or the zero time when never. h.mu must be held.
func (h *Hold) nextEventLocked() time.Time {
	var next time.Time
	at := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if h.cfg.MaxHold > 0 && !h.maxDone && (h.renewOn || !h.stepped) {
		at(h.acquired.Add(h.cfg.MaxHold))
	}
	if h.sch == nil {
		if !h.stepped {
			at(h.deadline)
		}
		if h.renewOn && !h.lost && !h.renewing {
			at(h.nextRenew)
		}
	}
	return next
}

// renewLoop renews once, again while RenewNow asked for more during the
// renewal, then schedules the next periodic renewal. The caller has set
// h.renewing.
func (h *Hold) renewLoop() {
	for {
		h.Held() // steps down first if the wall clock passed the deadline
		sent, err := h.renew(context.Background(), true)
		h.mu.Lock()
		if h.kicked && h.renewOn && !h.lost {
			h.kicked = false
			h.mu.Unlock()
			continue
		}
		h.kicked = false
		now := time.Now()
		switch {
		case err == nil:
			h.nextRenew = now.Add(h.cfg.RenewInterval)
		case errors.Is(err, backend.ErrLeaseLost):
			// Nothing left to renew.
		default:
			// A quarter interval after the failed attempt was sent, or at
			// once when it failed later than that (it timed out): see
			// NoRetryBudget.
			h.nextRenew = maxTime(now, sent.Add(h.cfg.RenewInterval/4))
		}
		h.renewing = false
		if h.renewWait != nil {
			close(h.renewWait)
			h.renewWait = nil
		}
		h.armLocked(now)
		h.mu.Unlock()
		return
	}
}

// renew sends one owner-checked renewal of this lease alone, bounded by
// RequestTimeout and the deadline (and, when periodic, by AttemptBound),
// and updates the deadline. It returns when it was sent.
func (h *Hold) renew(ctx context.Context, periodic bool) (time.Time, error) {
	s := time.Now()
	dl := s.Add(h.cfg.RequestTimeout)
	h.mu.Lock()
	if !h.stepped {
		if periodic {
			dl = s.Add(AttemptBound(h.cfg.RenewInterval, h.cfg.RequestTimeout, h.deadline.Sub(s)))
		}
		dl = minTime(dl, h.deadline)
	}
	h.mu.Unlock()
	cctx, cancel := context.WithDeadline(ctx, dl)
	err := h.cfg.Backend.Renew(cctx, h.lease)
	cancel()
	switch {
	case err == nil:
		h.renewed(s, time.Now())
	case ctx.Err() != nil:
		// The caller's context ended (Extend): not a store failure.
	case errors.Is(err, backend.ErrLeaseLost):
		h.markLost(err)
	default:
		h.failed(err)
	}
	return s, err
}

// failed records a renewal that failed for a reason other than the lease
// being gone.
func (h *Hold) failed(err error) {
	h.mu.Lock()
	h.failures++
	// A call cut at the deadline says only that time ran out; keep the
	// error that explains why the earlier ones failed.
	if h.lastErr == nil || !errors.Is(err, context.DeadlineExceeded) {
		h.lastErr = err
	}
	h.mu.Unlock()
	h.onError("renew", err)
}

func (h *Hold) onError(op string, err error) {
	switch {
	case h.cfg.OnError != nil:
		h.cfg.OnError(op, err)
	case h.cfg.Owner != nil:
		h.cfg.Owner.Failed(op, err)
	}
}

// renewed records a renewal sent at s whose answer arrived by now, and
// moves the deadline, unless the hold already stepped down or its deadline
// had passed by now (then the deadline timer steps down: a late success
// never revives a hold). It returns the new deadline, or the zero time when
// the deadline did not move.
func (h *Hold) renewed(s, now time.Time) time.Time {
	h.mu.Lock()
	h.failures, h.lastErr = 0, nil
	if s.After(h.lastSent) {
		h.lastSent = s
	}
	nd := h.deadlineFor(h.lastSent)
	var moved time.Time
	if !h.stepped && now.Before(h.deadline) && nd.After(h.deadline) {
		h.deadline, moved = nd, nd
		if h.sch == nil {
			h.armLocked(now)
		}
	}
	h.mu.Unlock()
	if !moved.IsZero() && h.cfg.OnRenew != nil {
		h.cfg.OnRenew(s, moved)
	}
	return moved
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
	h.armLocked(time.Now())
	h.mu.Unlock()
	if h.sch != nil {
		h.sch.remove(h)
	}
	h.stepDown(LeaseLost, err, nil)
}

// stepDown ends the hold once: the deadline stops moving, Held turns false,
// then the context is cancelled. cause, when not nil, is the context's cause;
// otherwise Config.Cause (or Owner.Cause) builds it, when first needed.
func (h *Hold) stepDown(r Reason, err, cause error) bool {
	h.mu.Lock()
	if h.stepped {
		h.mu.Unlock()
		return false
	}
	if r == Deadline && err == nil {
		err = h.lastErr
	}
	h.stepped, h.reason, h.stepErr, h.cause = true, r, err, cause
	h.heldUntil = h.deadline
	if now := time.Now(); now.Before(h.deadline) {
		h.deadline = now
	}
	// The own timer is left as it is: armed for the deadline, it fires
	// for nothing and re-arms for what is left.
	cancel := h.cancel
	if cancel != nil {
		cause = h.causeLocked()
	}
	h.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
	switch {
	case h.cfg.OnStepDown != nil:
		h.cfg.OnStepDown(r)
	case h.cfg.Owner != nil:
		h.cfg.Owner.SteppedDown(r)
	}
	return true
}

func (h *Hold) releaseOnce(ctx context.Context) error {
	ctx, cancel := h.cfg.Bounds.Bound(ctx, h.cfg.RequestTimeout)
	defer cancel()
	err := h.cfg.Backend.Release(ctx, h.lease)
	if err != nil && !errors.Is(err, backend.ErrLeaseLost) {
		h.onError("release", err)
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

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
