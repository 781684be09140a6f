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
// On a backend that renews in batches (backend.BatchRenewer), the periodic
// renewals of every hold with the same RenewInterval are scheduled on one
// grid of instants (multiples of the interval, never later than one
// interval after the previous renewal) and sent together, one batch call
// per instant (package internal/coalesce): an instance holding thousands of
// leases sends one request per interval (per slot, on Redis Cluster). Each
// lease is still checked on its own, and each hold's deadline counts from
// its own call, made before the batch was sent.
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
	"reflect"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/coalesce"
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
	// OnFinished, if not nil, is called once the hold has finished, as
	// Finished is closed, from the goroutine that closes it (Release's
	// caller, or the goroutine retrying a failed release). It must not
	// block.
	OnFinished func()
}

// Hold keeps one lease. Its methods are safe for concurrent use.
//
// A Hold has no goroutine of its own: its renewals, its deadline and MaxHold
// run in timer callbacks (a renewal's goroutine exists only while it runs),
// Release runs in the caller's goroutine, and only a release that failed
// starts a goroutine, to retry it.
type Hold struct {
	cfg      Config
	batch    backend.BatchRenewer // non-nil: periodic renewals go in batches, on the grid
	lease    backend.Lease
	acquired time.Time // when the acquisition was sent
	parent   context.Context
	ctx      context.Context
	cancel   context.CancelCauseFunc
	finished chan struct{} // closed once nothing of the hold runs any more

	mu        sync.Mutex // guards the fields below
	deadline  time.Time
	lastSent  time.Time // send time of the last successful acquire or renewal
	failures  int       // consecutive failed renewals
	lastErr   error     // last renewal error
	stepped   bool
	reason    Reason
	cause     error
	lost      bool          // the store said the lease is gone: nothing to renew or release
	timer     *time.Timer   // the deadline
	renewT    *time.Timer   // the next periodic renewal; nil with NoRenew
	maxT      *time.Timer   // MaxHold; nil without
	renewOn   bool          // renewals go on: not NoRenew, MaxHold not passed, not releasing
	renewing  bool          // a renewal callback runs
	kicked    bool          // RenewNow was called while a renewal ran: renew again after it
	renewDone chan struct{} // closed when the running renewal callback ends
	releasing bool          // Release has begun: no renewal starts any more
	relDone   chan struct{} // closed when the first Release has its result
	relResult error
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
		finished: make(chan struct{}),
		lastSent: sent,
		relDone:  make(chan struct{}),
		renewOn:  !cfg.NoRenew,
	}
	if br, ok := cfg.Backend.(backend.BatchRenewer); ok && reflect.TypeOf(cfg.Backend).Comparable() {
		h.batch = br
	}
	h.deadline = h.deadlineFor(sent)
	// The callbacks take h.mu first, so none of them runs before the timers
	// are all set.
	h.mu.Lock()
	h.timer = time.AfterFunc(time.Until(h.deadline), func() { h.stepDown(Deadline, nil, nil) })
	if !cfg.NoRenew {
		h.renewT = time.AfterFunc(h.nextRenewal(), h.tick)
	}
	if cfg.MaxHold > 0 {
		h.maxT = time.AfterFunc(time.Until(h.acquired.Add(cfg.MaxHold)), h.maxHold)
	}
	h.mu.Unlock()
	return h
}

// Lease returns the lease kept.
func (h *Hold) Lease() backend.Lease { return h.lease }

// Context returns a context cancelled at step-down, with the step-down's
// cause (context.Cause).
func (h *Hold) Context() context.Context { return h.ctx }

// Done is closed at step-down.
func (h *Hold) Done() <-chan struct{} { return h.ctx.Done() }

// Finished is closed once nothing of the hold runs any more: after Release
// has returned, any renewal in flight has ended, and any background release
// retries have ended.
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
// store may have restarted and lost the lease. It does not block: it starts
// the renewal in a goroutine, or, when one is running, has it renew once
// more when it ends. It does nothing once renewals have stopped (NoRenew,
// MaxHold, Release, or the store reported the lease gone).
func (h *Hold) RenewNow() {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case !h.renewOn || h.lost:
	case h.renewing:
		h.kicked = true
	default:
		h.renewT.Stop() // the renewal re-arms it
		h.startRenewing()
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
	err := h.renew(ctx, false)
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
// RequestTimeout. It runs in the caller's goroutine; a renewal in flight is
// waited for first (it is bounded by RequestTimeout), so no renewal is sent
// after the release. It returns nil when the lease was deleted, an error
// wrapping backend.ErrLeaseLost when the store no longer held it (it had been
// lost), or the store's error; in that last case the release is retried in
// the background until it succeeds, the store reports the lease gone, or the
// parent context ends. Later calls return the first call's result.
func (h *Hold) Release(ctx context.Context) error {
	h.stepDown(Released, nil, nil)
	h.mu.Lock()
	if h.releasing {
		h.mu.Unlock()
		<-h.relDone
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.relResult
	}
	h.releasing, h.renewOn, h.kicked = true, false, false
	if h.renewT != nil {
		h.renewT.Stop()
	}
	if h.maxT != nil {
		h.maxT.Stop()
	}
	var inFlight chan struct{}
	if h.renewing {
		inFlight = h.renewDone
	}
	lost := h.lost
	h.mu.Unlock()
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
	h.relResult = err
	close(h.relDone)
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
	close(h.finished)
	if h.cfg.OnFinished != nil {
		h.cfg.OnFinished()
	}
}

// startRenewing marks a renewal callback running. h.mu must be held.
func (h *Hold) startRenewing() {
	h.renewing = true
	h.renewDone = make(chan struct{})
}

// tick is the periodic renewal timer's callback.
func (h *Hold) tick() {
	h.mu.Lock()
	if !h.renewOn || h.lost || h.renewing {
		// Stopped, or a RenewNow renewal runs and re-arms the timer.
		h.mu.Unlock()
		return
	}
	h.startRenewing()
	h.mu.Unlock()
	h.renewLoop()
}

// maxHold is the MaxHold timer's callback: renewals stop, then the hold
// steps down.
func (h *Hold) maxHold() {
	h.mu.Lock()
	h.renewOn, h.kicked = false, false
	if h.renewT != nil {
		h.renewT.Stop()
	}
	h.mu.Unlock()
	h.stepDown(MaxHold, nil, nil)
}

// renewLoop renews once, again while RenewNow asked for more during the
// renewal, then re-arms the periodic timer and ends the renewal callback.
// The caller has called startRenewing.
func (h *Hold) renewLoop() {
	for {
		h.Held() // steps down first if the wall clock passed the deadline
		err := h.renew(context.Background(), true)
		h.mu.Lock()
		if h.kicked && h.renewOn && !h.lost {
			h.kicked = false
			h.mu.Unlock()
			continue
		}
		h.kicked = false
		if h.renewOn && !h.lost {
			switch {
			case err == nil:
				h.renewT.Reset(h.nextRenewal())
			case errors.Is(err, backend.ErrLeaseLost):
				// Nothing left to renew.
			default:
				h.renewT.Reset(h.cfg.RenewInterval / 4)
			}
		}
		h.renewing = false
		close(h.renewDone)
		h.mu.Unlock()
		return
	}
}

// renewals batches the periodic renewals of every hold of a process on one
// backend: holds that renew on the same grid (see nextRenewal) fall due
// together and go out in one BatchRenewer call.
var renewals coalesce.Registry[backend.Backend, backend.Lease]

// nextRenewal returns how long until the next periodic renewal: one
// RenewInterval, or, on a backend that renews in batches, until the next
// instant on the grid of RenewInterval, which is never later, so that the
// holds of one interval renew together.
func (h *Hold) nextRenewal() time.Duration {
	if h.batch == nil {
		return h.cfg.RenewInterval
	}
	return coalesce.Grid(time.Now(), h.cfg.RenewInterval)
}

// renew sends one owner-checked renewal and updates the deadline. A
// periodic renewal (batch) on a backend that renews in batches goes out
// with the others due at the same time; the send time that counts is still
// this call's, which is no later than the batch's.
func (h *Hold) renew(ctx context.Context, batch bool) error {
	s := time.Now()
	dl := s.Add(h.cfg.RequestTimeout)
	h.mu.Lock()
	if !h.stepped {
		dl = minTime(dl, h.deadline)
	}
	h.mu.Unlock()
	cctx, cancel := context.WithDeadline(ctx, dl)
	var err error
	if batch && h.batch != nil {
		err = renewals.Do(cctx, h.cfg.Backend, h.batch.RenewBatch, h.lease)
	} else {
		err = h.cfg.Backend.Renew(cctx, h.lease)
	}
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
