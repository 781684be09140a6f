package sovereign

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/keeper"
)

// lossError is the cause of a cancelled leader context: it matches
// ErrLeadershipLost and the underlying error, if any.
type lossError struct {
	reason LossReason
	err    error
}

func (l *lossError) Error() string {
	if l.err == nil {
		return fmt.Sprintf("%v: %s", ErrLeadershipLost, l.reason)
	}
	return fmt.Sprintf("%v: %s: %v", ErrLeadershipLost, l.reason, l.err)
}

func (l *lossError) Unwrap() []error {
	if l.err == nil {
		return []error{ErrLeadershipLost}
	}
	return []error{ErrLeadershipLost, l.err}
}

// keeperReason maps the keeper's reasons to the elector's.
func keeperReason(r keeper.Reason) LossReason {
	switch r {
	case keeper.Deadline:
		return ReasonDeadline
	case keeper.LeaseLost:
		return ReasonLeaseLost
	default:
		return ReasonClosed
	}
}

// leadState is the machine's state while it leads one term (phaseLead),
// from a verified acquisition to the release of the lease.
//
// Leadership ends (step-down) at the first of: ctx ends, Resign, fn returns,
// the backend reports the lease lost, or the renew deadline passes; the
// keeper decides which came first, once. At step-down IsLeader turns false,
// then the leader context is cancelled, then the events are published. The
// lease is still renewed until fn has returned; only then is it released.
type leadState struct {
	t          *leaderTerm
	hold       *keeper.Hold
	fnDone     chan struct{} // the leader function's; nil once seen closed, or without one
	fnErr      *error        // what it returned, once fnDone is closed
	fnFinished bool
	stepping   bool            // the loop has stepped down
	reason     LossReason      // why the term ended, once stepping
	pending    []resignRequest // Resign requests taken during the term
}

// leadBegin begins to lead the term of lease: it starts the keeper that
// renews it, publishes the leadership and starts the leader function.
func (e *Elector) leadBegin(lease backend.Lease, sent time.Time, rec Record) {
	o := &e.opts
	rs := &e.rs
	ctx, fn := rs.ctx, rs.fn
	e.wg.Add(1) // done when the hold has finished (release and any retries)
	// The renewals of its own lease tell a leader nothing and would wake
	// it, each one (endTerm and leadEnd turn them on again).
	e.renewalsMuted.Store(true)
	t := &leaderTerm{n: lease.Term, wake: make(chan struct{}), onWake: e.wake}
	hold := keeper.Start(ctx, keeper.Config{
		Backend:        e.b,
		TTL:            o.TTL,
		RenewDeadline:  o.RenewDeadline,
		RenewInterval:  o.RenewInterval,
		RequestTimeout: o.RequestTimeout,
		Cause: func(r keeper.Reason, err error) error {
			return &lossError{reason: keeperReason(r), err: err}
		},
		OnError:    func(op string, err error) { e.failed(op, err) },
		OnFinished: e.wg.Done,
		OnStepDown: func(r keeper.Reason) {
			// The keeper's own step-downs (deadline, lease lost) wake the
			// loop; a Stop is the loop's own or Resign's, which wakes it
			// once its release is done.
			if r != keeper.Stopped {
				t.wakeLoop()
			}
		},
		OnRenew: func(_, deadline time.Time) {
			e.backendOK()
			o.Metrics.LeaseRenewed(e.name, deadline)
		},
	}, lease, sent)
	leaderCtx := context.WithValue(hold.Context(), leaderKey{}, &leaderInfo{e: e, term: lease.Term})
	t.hold = hold
	ld := &leadState{t: t, hold: hold, fnFinished: fn == nil}
	if fn != nil {
		ld.fnDone = make(chan struct{})
		ld.fnErr = new(error)
		t.fnDone = ld.fnDone
	}
	rs.ld = ld

	e.mu.Lock()
	from := e.state
	e.state, e.term, e.hold, e.leader, e.cur = Leader, lease.Term, hold, rec, t
	e.stale = staleState{}
	e.bus.publish(StateChanged{From: from, To: Leader})
	e.bus.publish(LeadershipAcquired{Term: lease.Term})
	e.bus.publish(LeaderChanged{Leader: rec})
	e.mu.Unlock()
	o.Metrics.LeadershipAcquired(e.name, lease.Term, hold.Deadline())
	e.log.Info("sovereign: became leader", "term", lease.Term)

	if fn != nil {
		e.setFnRunning(true)
		fnDone, fnErr := ld.fnDone, ld.fnErr
		e.wg.Go(func() {
			defer e.wake() // the loop waits for the function without a goroutine of its own
			defer close(fnDone)
			defer e.setFnRunning(false)
			*fnErr = fn(leaderCtx)
		})
	}

	e.cleanupMembers(ctx)
}

// stepDown ends the term once, as far as the loop is concerned: the
// step-down itself may already have been done by Resign (see endTerm),
// whose reason then stands.
func (e *Elector) stepDown(ld *leadState, r LossReason, err error) {
	if ld.stepping {
		return
	}
	ld.stepping = true
	ld.reason = e.endTerm(ld.t, r, err)
	for _, p := range ld.pending {
		p.begun <- nil
	}
}

// leadStep leads until the term is over (stepped down and the leader
// function returned; it then ends the term: leadEnd) or it must wait
// (wait, until when).
func (e *Elector) leadStep() (until time.Time, wait bool) {
	rs := &e.rs
	ctx, ls, ld := rs.ctx, &rs.ls, rs.ld
	t, hold := ld.t, ld.hold
	for !ld.stepping || !ld.fnFinished {
		if !ld.stepping {
			if ctx.Err() != nil {
				e.stepDown(ld, ReasonClosed, nil)
				continue
			}
			if isClosed(t.wake) {
				e.stepDown(ld, 0, nil)
				continue
			}
		}
		if ld.fnDone != nil && isClosed(ld.fnDone) {
			ld.fnDone, ld.fnFinished = nil, true
			e.stepDown(ld, ReasonReturned, *ld.fnErr)
			continue
		}
		in := e.poll()
		switch in.kind {
		case inCmd:
			ld.pending = append(ld.pending, in.req)
			if ld.stepping {
				in.req.begun <- nil
			} else {
				e.stepDown(ld, ReasonResigned, nil)
			}
		case inWatch:
			if ev, woke := e.watchReceived(ctx, in.ev, in.ok); woke {
				e.leaderWatchEvent(hold, ev)
				e.noteLateEvent(t, ls, ev)
			}
		case inReady:
			if ev, woke := e.watchEstablished(ctx, in.r); woke {
				e.leaderWatchEvent(hold, ev)
				e.noteLateEvent(t, ls, ev)
			}
		case inRetry:
			e.watchRetry(ctx)
		case inNone:
			if ls.hbScheduled {
				return time.Time{}, true
			}
			if time.Now().Before(ls.nextHB) {
				return ls.nextHB, true
			}
			// Heartbeats are information (members, the leader's last sign
			// of life); a failure is reported but never ends leadership.
			dl := time.Time{}
			if !ld.stepping {
				dl = hold.Deadline()
			}
			_ = e.heartbeat(context.Background(), ls, dl)
		}
	}
	e.leadEnd()
	return time.Time{}, false
}

// leadEnd releases the lease of the term that has ended and answers the
// Resign requests of the term; the machine then campaigns again (after the
// sit-out when it resigned or its function returned) or ends.
func (e *Elector) leadEnd() {
	rs := &e.rs
	ld := rs.ld
	rs.ld = nil
	e.renewalsMuted.Store(false) // a follower again: the next leader's renewals bound its looks
	// Resign may be releasing the lease already, on its caller's goroutine;
	// the keeper then waits for that release and returns its result.
	relErr := ld.hold.Release(context.Background())
	e.mu.Lock()
	e.cur = nil
	e.mu.Unlock()
	switch {
	case relErr == nil:
		e.setLeader(Record{})
	case errors.Is(relErr, backend.ErrLeaseLost):
		relErr = nil // nothing was left to release
	default:
		e.log.Warn("sovereign: release failed; retrying in the background", "term", ld.t.n, "err", relErr)
	}
	for _, p := range ld.pending {
		p.released <- relErr
	}
	switch ld.reason {
	case ReasonResigned, ReasonReturned:
		rs.ls.sitOutUntil = time.Now().Add(e.opts.ResignSitOut)
	}
	if rs.ctx.Err() != nil {
		rs.phase = phaseEnd
		return
	}
	rs.ls.nextAttempt = time.Now()
	if ld.reason == ReasonLeaseLost {
		rs.ls.reclaimUntil = ld.hold.HeldUntil()
	}
	// Calls that failed while leading say nothing about other leases:
	// the old leader may take the key again at once (see suspect).
	e.mu.Lock()
	e.lostContact = false
	e.mu.Unlock()
	rs.phase = phaseCampaign
}

// isClosed reports whether ch is closed, without blocking. ch is never sent on.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// leaderTerm is one term of leadership, from a verified acquisition to the
// release of its lease: what the loop and Resign share to end it.
type leaderTerm struct {
	hold   *keeper.Hold
	n      uint64        // the fencing term
	fnDone chan struct{} // closed when the leader function has returned; nil without one
	// wake is closed when the loop must look at the term: the keeper
	// stepped down by itself, or Resign has released the lease (or given
	// up waiting to). Resign's step-down does not wake the loop before
	// that, so the loop does not compete with the release.
	wake     chan struct{}
	wakeOnce sync.Once
	onWake   func() // wakes the loop's machine (Elector.wake)

	// Guarded by Elector.mu.
	ended  bool       // the step-down is done: IsLeader false, events published
	reason LossReason // why the term ended, once ended
}

// wakeLoop closes t.wake once and wakes the loop's machine. It takes no
// lock but the machine's own (see Elector.wake): the keeper may call it
// from Held, under Elector.mu.
func (t *leaderTerm) wakeLoop() {
	t.wakeOnce.Do(func() { close(t.wake) })
	t.onWake()
}

// endTerm steps down from term t once, from the loop or from Resign: IsLeader
// turns false and the leader context is cancelled (by the keeper), then the
// state changes and the events are published, all before it returns. r is
// the caller's reason; zero means the keeper stepped down by itself
// (deadline, lease lost). Whichever came first is the reason, decided by the
// keeper under its lock; endTerm returns it.
func (e *Elector) endTerm(t *leaderTerm, r LossReason, err error) LossReason {
	e.mu.Lock()
	if t.ended {
		r = t.reason
		e.mu.Unlock()
		return r
	}
	// The keeper takes its own lock inside e.mu, as Held does from
	// IsLeader; cancelling the context runs no code of the elector.
	if r == 0 || !t.hold.Stop(&lossError{reason: r, err: err}) {
		_, cause := t.hold.Reason()
		var le *lossError
		if errors.As(cause, &le) {
			r, err = le.reason, le.err
		} else {
			r, err = ReasonClosed, cause
		}
	}
	t.ended, t.reason = true, r
	e.renewalsMuted.Store(false) // a follower now: see leadBegin
	e.state, e.term, e.hold = Follower, 0, nil
	e.bus.publish(StateChanged{From: Leader, To: Follower})
	e.bus.publish(LeadershipLost{Term: t.n, Reason: r, Err: err})
	if e.health.fnRunning && e.health.cancelledAt.IsZero() {
		e.health.cancelledAt = time.Now()
	}
	e.mu.Unlock()
	e.opts.Metrics.LeadershipLost(e.name, t.n, r)
	e.log.Info("sovereign: stepped down", "term", t.n, "reason", r, "err", err)
	return r
}

// noteLateEvent records, for the campaign that follows, an event that
// arrived after term t was stepped down (by Resign, on its caller's
// goroutine) while this loop still waited to end it: a successor's
// acquisition seen here would otherwise be lost to this elector's knowledge
// of who leads until its next look.
func (e *Elector) noteLateEvent(t *leaderTerm, ls *loopState, ev backend.Event) {
	if ev.Type != backend.EventChanged && ev.Type != backend.EventReset {
		return
	}
	e.mu.Lock()
	ended := t.ended
	e.mu.Unlock()
	if ended {
		ls.lookNow = true
	}
}

// leaderWatchEvent acts on a watch event while leading: after a
// re-established watch (the store may have restarted and lost the lease),
// someone else's acquisition (it may have), or a release or expiry of the
// key (a leader releases only after its lead ended: the key was deleted by
// hand, or the lease ended at the store), renew now, so a lost lease is
// noticed within a round trip rather than at the next renewal.
func (e *Elector) leaderWatchEvent(hold *keeper.Hold, ev backend.Event) {
	switch ev.Type {
	case backend.EventReset, backend.EventChanged, backend.EventReleased, backend.EventExpired:
		hold.RenewNow()
	}
}
