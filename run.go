package sovereign

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// The elector's loop is a state machine (campaign, lead, campaign again)
// that runs on one goroutine at a time, the runner, and costs no goroutine
// while it waits with nothing to do.
//
// Whenever the machine has nothing to do before some time or some event, it
// asks block to wait. Everything it waits for is an input that can be looked
// at without blocking (a deadline passed, a closed channel, a buffered
// event, a queued request) and whose arrival calls Elector.wake: the runner's
// one timer (time.AfterFunc), the end of the loop's context
// (context.AfterFunc), the subscription's notify (backend.WatchNotifier),
// the establishing goroutine of a subscription, the keeper's step-down and
// Resign's release (leaderTerm.wakeLoop), the leader function's return, and
// Resign's requests (queued, then woken). So the runner can park: record
// that it waits and let its goroutine end. The next wake-up starts a new
// runner, which resumes the machine where it parked; a wake-up while a
// runner runs is remembered (woken) and makes it look again before it
// waits, so none is lost.
//
// The exception is a subscription established by a Backend that is not a
// backend.WatchNotifier: nothing tells the elector of its events, so the
// runner blocks, as the loop always did, on its channel and on wakeC (which
// every wake-up signals) until one of them has something.

// phase is where the machine stands.
type phase int

const (
	phaseInit     phase = iota // not yet started: subscribe, draw the startup jitter
	phaseJitter                // waiting out the startup jitter
	phaseCampaign              // campaigning (campaignStep)
	phaseLead                  // leading (leadStep)
	phaseEnd                   // stopping: clean up, close e.done
)

// runState is the machine's state. It belongs to the runner.
type runState struct {
	ctx         context.Context             // the loop's context: Start's, cancelled by Close
	fn          func(context.Context) error // the leader function; nil for Start
	phase       phase
	ls          loopState
	jitterUntil time.Time
	ld          *leadState  // the current term, in phaseLead
	timer       *time.Timer // the runner's timer: time.AfterFunc(e.wake); nil until first needed
	stopCtx     func() bool // unregisters context.AfterFunc(ctx, e.wake)
}

// inputKind says what poll found.
type inputKind int

const (
	inNone  inputKind = iota // nothing
	inCmd                    // a Resign request
	inReady                  // the end of a subscription's establishment
	inWatch                  // an event of the subscription, or its end
	inRetry                  // the time to establish the subscription again
)

// input is one thing the machine waited for.
type input struct {
	kind inputKind
	req  resignRequest
	r    watchResult
	ev   backend.Event
	ok   bool // inWatch: false when the subscription's channel was closed
}

// testHookBlock, when set by a test, is called by block after the machine
// has looked at its inputs and before it decides whether to wait or park.
var testHookBlock func(*Elector)

// startRunner starts the machine, from Start.
func (e *Elector) startRunner(ctx context.Context, fn func(context.Context) error) {
	e.rs = runState{ctx: ctx, fn: fn}
	e.rs.stopCtx = context.AfterFunc(ctx, e.wake)
	e.wg.Add(1)
	go e.resume()
}

// resume runs the machine on the calling goroutine (a runner) until it parks
// or ends.
func (e *Elector) resume() {
	defer e.wg.Done()
	e.run()
}

// wake tells the machine to look at its inputs: it starts a runner if the
// machine is parked, and otherwise makes the running one look again before
// it waits. It never blocks and takes no lock but e.wmu, so it may be called
// from anywhere, with any lock held (a backend's, the keeper's, e.mu).
func (e *Elector) wake() {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	e.woken = true
	if e.parked {
		e.parked = false
		e.wg.Add(1) // not after e.done is closed: the machine never parks again once ending
		go e.resume()
		return
	}
	select {
	case e.wakeC <- struct{}{}:
	default:
	}
}

// submit queues a Resign request for the machine and wakes it.
func (e *Elector) submit(req resignRequest) {
	e.wmu.Lock()
	e.queue = append(e.queue, req)
	e.wmu.Unlock()
	e.wake()
}

// withdraw removes req from the queue and reports whether it was still
// there (not taken by the machine, which answers every request it takes).
func (e *Elector) withdraw(req resignRequest) bool {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	for i, q := range e.queue {
		if q.begun == req.begun {
			e.queue = append(e.queue[:i], e.queue[i+1:]...)
			return true
		}
	}
	return false
}

// run runs the machine until it parks (the goroutine then ends; a wake-up
// starts another) or the loop has ended.
func (e *Elector) run() {
	rs := &e.rs
	for {
		var (
			until time.Time
			wait  bool
		)
		switch rs.phase {
		case phaseInit:
			e.joinLimit()
			e.startWatch(rs.ctx) // before the first attempt, so no release is missed
			if j := e.opts.StartupJitter; j > 0 {
				rs.jitterUntil = time.Now().Add(rand.N(j + 1))
			}
			rs.phase = phaseJitter
		case phaseJitter:
			until, wait = e.jitterStep()
		case phaseCampaign:
			until, wait = e.campaignStep()
		case phaseLead:
			until, wait = e.leadStep()
		case phaseEnd:
			e.finish()
			return
		}
		if wait && e.block(until) {
			return
		}
	}
}

// jitterStep waits out the startup jitter, then begins the campaign.
func (e *Elector) jitterStep() (until time.Time, wait bool) {
	rs := &e.rs
	for {
		if rs.ctx.Err() != nil {
			rs.phase = phaseEnd
			return
		}
		if !time.Now().Before(rs.jitterUntil) {
			break
		}
		in := e.poll()
		if in.kind == inNone {
			return rs.jitterUntil, true
		}
		e.idleInput(in) // nothing to act on yet
	}
	if hb := e.batchHeartbeater(); hb != nil {
		e.scheduleHeartbeats(hb)
		rs.ls.hbScheduled = true
	}
	e.setState(Candidate)
	rs.phase = phaseCampaign
	return
}

// idleInput handles an input while not leading, when only the subscription
// matters: it reports an event to act on (woke), as the subscription's
// handlers do; a Resign request is answered with ErrNotLeader.
func (e *Elector) idleInput(in input) (ev backend.Event, woke bool) {
	ctx := e.rs.ctx
	switch in.kind {
	case inCmd:
		in.req.reply(ErrNotLeader, ErrNotLeader)
	case inReady:
		return e.watchEstablished(ctx, in.r)
	case inWatch:
		return e.watchReceived(ctx, in.ev, in.ok)
	case inRetry:
		e.watchRetry(ctx)
	}
	return ev, false
}

// poll returns an input that is there, without blocking; inNone when there
// is none. Deadlines of the machine itself (its next attempt, its own
// heartbeat) and the state of the term are looked at by the steps.
func (e *Elector) poll() input {
	e.wmu.Lock()
	if len(e.queue) > 0 {
		req := e.queue[0]
		e.queue[0] = resignRequest{}
		e.queue = e.queue[1:]
		if len(e.queue) == 0 {
			e.queue = nil
		}
		e.wmu.Unlock()
		return input{kind: inCmd, req: req}
	}
	e.wmu.Unlock()
	w := &e.w
	if w.ready != nil {
		select {
		case r := <-w.ready:
			return input{kind: inReady, r: r}
		default:
		}
	}
	if len(w.stash) > 0 {
		s := w.stash[0]
		w.stash = w.stash[1:]
		if len(w.stash) == 0 {
			w.stash = nil
		}
		return input{kind: inWatch, ev: s.ev, ok: s.ok}
	}
	if w.ch != nil {
		select {
		case ev, ok := <-w.ch:
			return input{kind: inWatch, ev: ev, ok: ok}
		default:
		}
	}
	if !w.retryAt.IsZero() && !time.Now().Before(w.retryAt) {
		return input{kind: inRetry}
	}
	return input{}
}

// block waits until until (none when zero) or a wake-up, or parks, which
// it reports: the runner must then return at once. It returns false at once
// when a wake-up came since it last looked, or until has passed.
func (e *Elector) block(until time.Time) (parked bool) {
	rs := &e.rs
	if r := e.w.retryAt; !r.IsZero() && (until.IsZero() || r.Before(until)) {
		until = r
	}
	if until.IsZero() {
		if rs.timer != nil {
			rs.timer.Stop()
		}
	} else {
		d := time.Until(until)
		if d <= 0 {
			return false
		}
		if rs.timer == nil {
			rs.timer = time.AfterFunc(d, e.wake)
		} else {
			rs.timer.Reset(d)
		}
	}
	if testHookBlock != nil {
		testHookBlock(e)
	}
	e.wmu.Lock()
	if e.woken {
		e.woken = false
		e.wmu.Unlock()
		return false
	}
	if e.w.ch == nil || e.w.notified {
		// Every input wakes the machine: park.
		e.parked = true
		e.wmu.Unlock()
		return true
	}
	e.wmu.Unlock()
	select {
	case <-e.wakeC:
	case ev, ok := <-e.w.ch:
		e.w.stash = append(e.w.stash, stashed{ev, ok})
	}
	return false
}

// finish ends the loop: the elector is a follower again, its heartbeat
// record removed, its subscription ended, and e.done closed. It runs on
// the last runner, which never parks.
func (e *Elector) finish() {
	rs := &e.rs
	e.stopped()
	e.cancel() // ends the subscription
	e.w.stopRetry()
	e.w.wg.Wait() // a subscription being established
	rs.stopCtx()
	if rs.timer != nil {
		rs.timer.Stop()
	}
	close(e.done)
}
