package sovereign

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// lead holds leadership of one term, from a verified acquisition to the
// release of the lease, and returns why the term ended.
//
// Leadership ends (step-down) at the first of: ctx ends, Resign, fn returns,
// the backend reports the lease lost, or the renew deadline passes. At
// step-down IsLeader turns false, then the leader context is cancelled, then
// the events are published. The lease is still renewed until fn has
// returned; only then is it released.
func (e *Elector) lead(ctx context.Context, ls *loopState, lease backend.Lease, sent time.Time, rec Record, fn func(context.Context) error) LossReason {
	o := &e.opts
	renewSent := sent
	deadline := e.deadlineFor(renewSent, ls.hbSent, lease)
	leaderCtx, cancelLeader := context.WithCancelCause(context.WithValue(ctx, leaderKey{}, &leaderInfo{e: e, term: lease.Term}))
	defer cancelLeader(nil)
	lostCause := fmt.Errorf("%w: %s", ErrLeadershipLost, ReasonDeadline)
	deadlineTimer := time.AfterFunc(time.Until(deadline), func() { cancelLeader(lostCause) })
	defer deadlineTimer.Stop()

	e.mu.Lock()
	from := e.state
	e.state, e.term, e.deadline, e.leader = Leader, lease.Term, deadline, rec
	e.bus.publish(StateChanged{From: from, To: Leader})
	e.bus.publish(LeadershipAcquired{Term: lease.Term})
	e.bus.publish(LeaderChanged{Leader: rec})
	e.mu.Unlock()
	e.log.Info("sovereign: became leader", "term", lease.Term)

	var (
		fnDone     chan struct{}
		fnErr      error
		fnFinished = fn == nil
	)
	if fn != nil {
		fnDone = make(chan struct{})
		e.wg.Go(func() {
			defer close(fnDone)
			fnErr = fn(leaderCtx)
		})
	}
	e.cleanupMembers(ctx)

	var (
		stepping   bool
		reason     LossReason
		lost       bool  // the backend said the lease is gone: nothing to renew or release
		lastErr    error // the last renewal or heartbeat error
		pending    []resignRequest
		ctxDone    = ctx.Done()
		leaderDone = leaderCtx.Done()
	)
	stepDown := func(r LossReason, err error) {
		if stepping {
			return
		}
		stepping, reason = true, r
		ctxDone, leaderDone = nil, nil
		e.mu.Lock()
		e.state, e.term, e.deadline = Follower, 0, time.Time{}
		e.mu.Unlock()
		cause := fmt.Errorf("%w: %s", ErrLeadershipLost, r)
		if err != nil {
			cause = fmt.Errorf("%w: %s: %w", ErrLeadershipLost, r, err)
		}
		cancelLeader(cause)
		e.mu.Lock()
		e.bus.publish(StateChanged{From: Leader, To: Follower})
		e.bus.publish(LeadershipLost{Term: lease.Term, Reason: r, Err: err})
		e.mu.Unlock()
		e.log.Info("sovereign: stepped down", "term", lease.Term, "reason", r, "err", err)
		for _, p := range pending {
			p.begun <- nil
		}
	}
	// extend moves the deadline after a successful renewal or heartbeat,
	// unless it has already passed (then the deadline timer steps down).
	extend := func() {
		nd := e.deadlineFor(renewSent, ls.hbSent, lease)
		e.mu.Lock()
		defer e.mu.Unlock()
		if !time.Now().Before(e.deadline) || !deadlineTimer.Stop() {
			return
		}
		e.deadline = nd
		deadlineTimer.Reset(time.Until(nd))
	}
	callDeadline := func() time.Time {
		if stepping {
			return time.Time{}
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		return e.deadline
	}

	renewTimer := time.NewTimer(time.Until(sent.Add(o.RenewInterval)))
	defer renewTimer.Stop()
	hbTimer := time.NewTimer(time.Until(ls.nextHB))
	defer hbTimer.Stop()
	for !stepping || !fnFinished {
		select {
		case <-ctxDone:
			stepDown(ReasonClosed, nil)
		case <-leaderDone:
			stepDown(ReasonDeadline, lastErr)
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
		case <-renewTimer.C:
			if lost {
				break
			}
			s := time.Now()
			err := e.renew(lease, s, callDeadline())
			switch {
			case err == nil:
				renewSent = s
				if !stepping {
					extend()
				}
				renewTimer.Reset(time.Until(s.Add(o.RenewInterval)))
			case errors.Is(err, backend.ErrLeaseLost):
				lost = true
				stepDown(ReasonLeaseLost, err)
			default:
				lastErr = err
				e.failed("renew", err)
				renewTimer.Reset(o.RenewInterval / 4)
			}
		case <-hbTimer.C:
			if err := e.heartbeat(context.Background(), ls, callDeadline()); err != nil {
				lastErr = err
			} else if !stepping {
				extend()
			}
			hbTimer.Reset(time.Until(ls.nextHB))
		}
	}

	var relErr error
	if !lost {
		if relErr = e.release(lease); relErr != nil {
			e.failed("release", relErr)
		} else {
			e.setLeader(Record{})
		}
	}
	for _, p := range pending {
		p.released <- relErr
	}
	return reason
}

// renew renews lease, bounding the call by RequestTimeout and by deadline
// when it is not zero.
func (e *Elector) renew(lease backend.Lease, sent, deadline time.Time) error {
	dl := sent.Add(e.opts.RequestTimeout)
	if !deadline.IsZero() {
		dl = minTime(dl, deadline)
	}
	ctx, cancel := context.WithDeadline(context.Background(), dl)
	defer cancel()
	return e.b.Renew(ctx, lease)
}
