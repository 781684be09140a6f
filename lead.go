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

// lead holds leadership of one term, from a verified acquisition to the
// release of the lease, and returns why the term ended.
//
// Leadership ends (step-down) at the first of: ctx ends, Resign, fn returns,
// the backend reports the lease lost, or the renew deadline passes; the
// keeper decides which came first, once. At step-down IsLeader turns false,
// then the leader context is cancelled, then the events are published. The
// lease is still renewed until fn has returned; only then is it released.
func (e *Elector) lead(ctx context.Context, ls *loopState, lease backend.Lease, sent time.Time, rec Record, fn func(context.Context) error) LossReason {
	o := &e.opts
	e.wg.Add(1) // done when the hold has finished (release and any retries)
	t := &leaderTerm{n: lease.Term, wake: make(chan struct{})}
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
	var (
		fnDone     chan struct{}
		fnErr      error
		fnFinished = fn == nil
	)
	if fn != nil {
		fnDone = make(chan struct{})
		t.fnDone = fnDone
	}

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
		e.wg.Go(func() {
			defer close(fnDone)
			defer e.setFnRunning(false)
			fnErr = fn(leaderCtx)
		})
	}

	e.cleanupMembers(ctx)

	var (
		stepping bool
		reason   LossReason
		pending  []resignRequest
		ctxDone  = ctx.Done()
		wakeC    = t.wake
	)
	// stepDown ends the term once, as far as the loop is concerned: the
	// step-down itself may already have been done by Resign (see endTerm),
	// whose reason then stands.
	stepDown := func(r LossReason, err error) {
		if stepping {
			return
		}
		stepping = true
		ctxDone, wakeC = nil, nil
		reason = e.endTerm(t, r, err)
		for _, p := range pending {
			p.begun <- nil
		}
	}

	var hbC <-chan time.Time // the loop's own heartbeats, unless the scheduler sends them
	var hbTimer *time.Timer
	if !ls.hbScheduled {
		hbTimer = time.NewTimer(time.Until(ls.nextHB))
		defer hbTimer.Stop()
		hbC = hbTimer.C
	}
	for !stepping || !fnFinished {
		select {
		case <-ctxDone:
			stepDown(ReasonClosed, nil)
		case <-wakeC:
			stepDown(0, nil)
		case <-fnDone:
			fnDone, fnFinished = nil, true
			stepDown(ReasonReturned, fnErr)
		case req := <-e.cmds:
			pending = append(pending, req)
			if stepping {
				req.begun <- nil
			} else {
				stepDown(ReasonResigned, nil)
			}
		case wev, ok := <-e.w.ch:
			if ev, woke := e.watchReceived(ctx, wev, ok); woke {
				e.leaderWatchEvent(hold, ev)
				e.noteLateEvent(t, ls, ev)
			}
		case r := <-e.w.ready:
			if ev, woke := e.watchEstablished(ctx, r); woke {
				e.leaderWatchEvent(hold, ev)
				e.noteLateEvent(t, ls, ev)
			}
		case <-e.w.retryC:
			e.watchRetry(ctx)
		case <-hbC:
			// Heartbeats are information (members, the leader's last sign of
			// life); a failure is reported but never ends leadership.
			dl := time.Time{}
			if !stepping {
				dl = hold.Deadline()
			}
			_ = e.heartbeat(context.Background(), ls, dl)
			hbTimer.Reset(time.Until(ls.nextHB))
		}
	}

	// Resign may be releasing the lease already, on its caller's goroutine;
	// the keeper then waits for that release and returns its result.
	relErr := hold.Release(context.Background())
	e.mu.Lock()
	e.cur = nil
	e.mu.Unlock()
	switch {
	case relErr == nil:
		e.setLeader(Record{})
	case errors.Is(relErr, backend.ErrLeaseLost):
		relErr = nil // nothing was left to release
	default:
		e.log.Warn("sovereign: release failed; retrying in the background", "term", lease.Term, "err", relErr)
	}
	for _, p := range pending {
		p.released <- relErr
	}
	return reason
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

	// Guarded by Elector.mu.
	ended  bool       // the step-down is done: IsLeader false, events published
	reason LossReason // why the term ended, once ended
}

// wakeLoop closes t.wake once. It takes no lock: the keeper may call it from
// Held, under Elector.mu.
func (t *leaderTerm) wakeLoop() { t.wakeOnce.Do(func() { close(t.wake) }) }

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
// re-established watch (the store may have restarted and lost the lease) or
// someone else's acquisition (it may have), renew now, so a lost lease is
// noticed within a round trip.
func (e *Elector) leaderWatchEvent(hold *keeper.Hold, ev backend.Event) {
	if ev.Type == backend.EventReset || ev.Type == backend.EventChanged {
		hold.RenewNow()
	}
}
