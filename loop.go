package sovereign

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// expiryMargin is added to a holder's remaining TTL when scheduling the next
// attempt, so the attempt lands just after the lease expires at the backend.
const expiryMargin = 5 * time.Millisecond

// quietRecheck is how many TTLs a follower whose watch reports every
// expiry waits before looking at a held key again on its own.
const quietRecheck = 10

// minRetry is the shortest wait between two attempts on a held key, so a
// lease reported with (almost) no TTL left does not spin the loop.
const minRetry = 20 * time.Millisecond

// loopState belongs to the machine's runner (see run.go).
type loopState struct {
	hbScheduled bool      // heartbeats are sent by the process's scheduler, not the loop
	nextHB      time.Time // when the next heartbeat is due, unless hbScheduled
	hbFailures  int       // consecutive failed heartbeats
	nextAttempt time.Time // when the next acquisition attempt is due
	failures    int       // consecutive failed acquisition attempts
	expiring    int       // consecutive attempts that found the lease held with no TTL left
	sitOutUntil time.Time // no attempt before this (after Resign)
	lookNow     bool      // read who leads at once (a change seen while stepping down)
	// suspectUntil is one TTL after this elector last lost contact with
	// the store (see suspect): until then the store may have restarted
	// without a lease whose holder still leads, so a free key is not
	// acquired (see lookAfterReset). Zero once a read found the lease
	// known before still there.
	suspectUntil time.Time
	knownAtReset Record // the holder known when the last reset came
	waitLogged   bool   // the wait for suspectUntil was logged
	// answered reports that the store has answered an attempt or a read:
	// an elector that never heard from it knows of no lease to wait for
	// (suspect), and one started while the store is down leads as soon as
	// it is back.
	answered bool
	// reclaimUntil is the renew deadline of the last term when a renewal
	// found its lease gone before it (ReasonLeaseLost): until then the
	// store can only have lost that lease, nobody else can have held the
	// key since, and attempts say so (AcquireRequest.Reclaim), which a
	// store refusing free keys after a restart (redisbackend's
	// RestartGuard) lets through. Cleared by an attempt the store answers.
	reclaimUntil time.Time
	// renewedUntil is how long the holder's lease lives at least, by this
	// elector's clock, from the last renewal its watch told of (see
	// renewedEvent); zero after any other event but a reset (a release,
	// an expiry, a change) and once this elector leads.
	renewedUntil time.Time
}

// stopped runs when the loop ends: the elector is a follower again and its
// heartbeat record is removed, so Members no longer lists it.
func (e *Elector) stopped() {
	e.setState(Follower)
	if e.batchHeartbeater() != nil {
		e.unscheduleHeartbeats()
	}
	e.leaveLimit()
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.RequestTimeout)
	defer cancel()
	if err := e.b.RemoveMember(ctx, e.name, e.id); err != nil && !errors.Is(err, backend.ErrClosed) {
		e.log.Warn("sovereign: removing own heartbeat record", "err", err)
	}
}

// campaignStep campaigns until this elector holds a verified lease (it
// then begins to lead: phaseLead), ctx ends (phaseEnd), or it must wait
// (wait, until when). Heartbeats go on meanwhile, on their own schedule;
// they never gate an attempt, and nothing about them can end another
// instance's lease.
func (e *Elector) campaignStep() (until time.Time, wait bool) {
	rs := &e.rs
	ctx, ls := rs.ctx, &rs.ls
	for ctx.Err() == nil {
		now := time.Now()
		if !ls.hbScheduled && !now.Before(ls.nextHB) {
			_ = e.heartbeat(ctx, ls, time.Time{})
			now = time.Now()
		}
		canAttempt := !now.Before(ls.sitOutUntil)
		if ls.lookNow {
			ls.lookNow = false
			if !canAttempt {
				e.refreshLeader(ctx) // an attempt would tell as much
			}
		}
		if canAttempt && !now.Before(ls.nextAttempt) {
			e.mu.Lock()
			lost, lostAt := e.lostContact, e.lostAt
			e.lostContact = false
			e.mu.Unlock()
			if lost && ls.answered && e.failureProlongs(ls, lostAt) {
				e.suspect(ls)
				now = time.Now()
			}
			if now.Before(ls.suspectUntil) {
				e.lookAfterReset(ctx, ls)
				continue
			}
			if now.Before(ls.renewedUntil) && !now.Before(ls.reclaimUntil) {
				// The lease renewed last lives until then (see
				// renewedEvent), whatever set this attempt earlier.
				ls.nextAttempt = ls.renewedUntil
				continue
			}
			if lease, sent, rec, ok := e.attempt(ctx, ls); ok {
				ls.renewedUntil = time.Time{}
				e.leadBegin(lease, sent, rec)
				rs.phase = phaseLead
				return until, false
			}
			continue
		}
		next := ls.nextAttempt
		if !canAttempt {
			next = ls.sitOutUntil
		}
		if !ls.hbScheduled {
			next = minTime(next, ls.nextHB)
		}
		in := e.poll()
		if in.kind == inNone {
			return next, true
		}
		if ev, woke := e.idleInput(in); woke {
			if ev.Type == backend.EventRenewed {
				e.renewedEvent(ls, ev)
				continue
			}
			if ev.Type == backend.EventReset && ls.answered {
				e.suspect(ls)
			}
			if ev.Type != backend.EventReset {
				// Released, expired, or changed (acquired anew, say): the
				// lease the renewals told of may be gone, and the look
				// below learns the holder's TTL.
				ls.renewedUntil = time.Time{}
			}
			gone := ev.Type == backend.EventReleased || ev.Type == backend.EventExpired
			if gone {
				e.setLeader(Record{})
				if canAttempt {
					e.setState(Candidate)
				}
			}
			// A release, an expiry, a change or a re-established watch: look
			// now rather than at the scheduled time.
			ls.nextAttempt = time.Now()
			if !canAttempt && !gone {
				// Sitting out: no attempt now, but keep knowing who leads.
				// After a release or an expiry nobody leads, and the next
				// acquisition comes as a change of its own: a read now
				// would tell nothing new, and after this elector's own
				// Resign it would load the store just as the successor
				// acquires.
				e.refreshLeader(ctx)
			}
		}
	}
	rs.phase = phaseEnd
	return until, false
}

// renewedEvent takes a renewal of the key's lease (backend.RenewalWatcher):
// the lease lives at least ev.TTL from now, so there is no look before then,
// even if the store would show the key free sooner (its clock stepped
// forward, the key evicted or deleted by hand): only the lease's TTL ends
// it. A holder that stops renewing is looked at when its last renewal's TTL
// is up, as after a read, and any other event but a reset clears the
// bound (see campaignStep).
// While this elector may reclaim a lease of its own that the store lost
// (reclaimUntil), a renewal can only be of that lease, told late: it is
// not taken, or the reclaim would wait a TTL.
func (e *Elector) renewedEvent(ls *loopState, ev backend.Event) {
	now := time.Now()
	if now.Before(ls.reclaimUntil) {
		return
	}
	ls.renewedUntil = maxTime(ls.renewedUntil, now.Add(ev.TTL+expiryMargin))
	ls.nextAttempt = maxTime(ls.nextAttempt, ls.renewedUntil)
}

// suspect starts (or prolongs) a wait after this elector lost contact with
// the store it had heard from: its watch broke (watchReceived), was
// re-established, or established after failing (EventReset), or broke
// while an acquisition was in flight (crossedReset), or an attempt, a read
// or a heartbeat failed while it campaigned (see failureProlongs). The
// store may have restarted in between,
// and a store that restarted may have lost a lease whose holder still
// leads until its own renew deadline. Only that lease's TTL ends it (the
// absence of a record is no proof that its holder stopped), and it was
// renewed at the latest when the store stopped answering, so for one TTL
// from now a free key is not acquired: Redlock's delayed restart, done by
// the candidates. A leader whose lease is lost to the restart acquires
// again at once (nobody else can have held the key since: it did not wait
// in this state), and a read that finds the lease known before still in
// the store ends the wait.
func (e *Elector) suspect(ls *loopState) {
	until := time.Now().Add(e.opts.TTL + expiryMargin)
	if until.After(ls.suspectUntil) {
		ls.suspectUntil = until
	}
	e.mu.Lock()
	if e.leader.Token != "" {
		ls.knownAtReset = e.leader
	}
	e.mu.Unlock()
	ls.waitLogged = false
}

// lookAfterReset stands for an attempt while ls.suspectUntil has not
// passed (see suspect): it reads the key instead of acquiring it. The lease
// known before the reset, still there: the store kept its data, and
// campaigning goes on as before. Another holder: followed, with no attempt
// before the wait ends. No holder: the next attempt is when the wait ends,
// when every lease the store could have lost has expired.
func (e *Elector) lookAfterReset(ctx context.Context, ls *loopState) {
	leave, ok := e.enter(ctx)
	if !ok {
		return
	}
	defer leave()
	cctx, cancel := context.WithTimeout(ctx, e.opts.RequestTimeout)
	rec, err := e.b.Get(cctx, e.name)
	cancel()
	if err == nil || errors.Is(err, backend.ErrNotHeld) {
		e.backendOK()
		ls.failures = 0
	}
	known := ls.knownAtReset
	switch {
	case err == nil && known.Token != "" && rec.Token == known.Token && rec.Term == known.Term:
		ls.suspectUntil, ls.knownAtReset = time.Time{}, Record{}
		ls.nextAttempt = time.Now() // the attempt learns the holder's TTL, as before the reset
	case err == nil:
		e.setLeader(rec)
		e.observeHolder(rec)
		e.setState(Follower)
		ls.nextAttempt = ls.suspectUntil
	case errors.Is(err, backend.ErrNotHeld):
		e.setLeader(Record{})
		e.setState(Candidate)
		if !ls.waitLogged {
			ls.waitLogged = true
			e.log.Info("sovereign: the key is free after a reset; waiting a TTL before acquiring, in case the store lost a live lease",
				"until", ls.suspectUntil.Format(time.RFC3339Nano))
		}
		ls.nextAttempt = ls.suspectUntil
	default:
		if ctx.Err() != nil {
			return
		}
		e.callFailed(ls)
		e.failed("read after a reset", err)
		ls.nextAttempt = time.Now().Add(e.backoff(ls.failures))
	}
}

// callFailed records a failed attempt or read: the first failure after the
// store answered starts a wait (see suspect). Other calls that fail while
// campaigning (heartbeats) start it before the next attempt.
func (e *Elector) callFailed(ls *loopState) {
	ls.failures++
	if ls.failures == 1 && ls.answered && e.failureProlongs(ls, time.Now()) {
		e.suspect(ls)
	}
}

// failureProlongs reports whether a call that failed at the time at starts
// a wait (see suspect). Not while a wait runs, unless no watch is
// established: a store that restarts breaks the watch, which starts a wait
// of its own (watchReceived, EventReset), so a failure adds nothing, and
// failures that come and go (a store that times out now and then) must not
// keep a candidate waiting for ever. Without a watch, failures are the only
// sign of a restart, and each first one of a run starts or prolongs a wait.
func (e *Elector) failureProlongs(ls *loopState, at time.Time) bool {
	return e.w.ch == nil || !at.Before(ls.suspectUntil)
}

// attempt makes one acquisition attempt, with double verification.
func (e *Elector) attempt(ctx context.Context, ls *loopState) (backend.Lease, time.Time, Record, bool) {
	o := &e.opts
	leave, ok := e.enter(ctx) // the acquisition and its verification count as one call in flight
	if !ok {
		return backend.Lease{}, time.Time{}, Record{}, false
	}
	defer leave()
	// A reclaim is decided once the call has its place: enter may wait
	// long after the old deadline (TestReclaimDecidedAfterThePlaceInFlight).
	req := backend.AcquireRequest{Key: e.name, HolderID: e.id, TTL: o.TTL, Metadata: o.Metadata,
		Reclaim: time.Now().Before(ls.reclaimUntil)}
	watched := e.w.ch != nil // a subscription was live when the attempt went out
	sent := time.Now()
	cctx, cancel := context.WithTimeout(ctx, o.RequestTimeout)
	lease, err := e.b.Acquire(cctx, req)
	cancel()
	var held *backend.HeldError
	if err == nil || errors.As(err, &held) {
		e.backendOK()
		ls.reclaimUntil = time.Time{}
	}
	switch {
	case err == nil:
		ls.answered = true
		e.setState(Candidate)
		rec, verr := e.verify(ctx, lease, sent)
		if ctx.Err() != nil {
			// Closing: an acquisition whose reply came after the end (all
			// replicas stopped at once, say) is given back at once; the
			// leader function never starts, and the subscription that
			// ended with ctx is no sign of a lost lease.
			if err := e.release(lease); err != nil {
				e.log.Warn("sovereign: releasing an acquisition that completed after Close; it expires by its TTL", "err", err)
			}
			return backend.Lease{}, time.Time{}, Record{}, false
		}
		if verr == nil && watched && e.watchBroke() {
			e.crossedReset(ls, lease)
			return backend.Lease{}, time.Time{}, Record{}, false
		}
		if verr == nil && watched && !req.Reclaim {
			if ttl, ok := e.renewalCrossed(lease.Term); ok {
				e.crossedRenewal(ls, lease, ttl)
				return backend.Lease{}, time.Time{}, Record{}, false
			}
		}
		if verr == nil {
			ls.failures = 0
			return lease, sent, rec, true
		}
		e.failed("double verification", verr)
		e.release(lease)
		ls.failures++
		ls.nextAttempt = time.Now().Add(e.backoff(ls.failures))
	case errors.As(err, &held):
		ls.failures = 0
		ls.answered = true
		rec := held.Holder
		e.setLeader(rec)
		e.observeHolder(rec)
		e.setState(Follower)
		wait := max(rec.TTL, 0) + expiryMargin
		if rec.TTL <= expiryMargin {
			// The lease should be gone but the store still holds it (etcd
			// expires leases in a periodic scan and reports whole seconds):
			// back off exponentially rather than hammer it; an expiry event
			// from a watch still wakes the elector at once.
			ls.expiring++
			wait = max(wait, min(minRetry<<min(ls.expiring-1, 10), o.RenewInterval/2))
		} else {
			ls.expiring = 0
			if e.watching.Load() {
				// The watch delivers the holder's release or expiry: no
				// need to poll for it. A rare look guards against the
				// unforeseen; a broken watch wakes the loop at once.
				wait = quietRecheck * o.TTL
			}
		}
		ls.nextAttempt = time.Now().Add(min(max(wait, minRetry), quietRecheck*o.TTL))
		if !e.watching.Load() {
			ls.nextAttempt = minTime(ls.nextAttempt, time.Now().Add(o.TTL))
		}
		if held.MayBeHeld {
			// No holder to hear from: the store refuses the free key for
			// rec.TTL more (it restarted, and may have lost a live
			// lease), and no release will come to wake the elector.
			ls.expiring = 0
			ls.nextAttempt = time.Now().Add(max(rec.TTL, minRetry))
		}
		// Not before the last renewal told of ends (see renewedEvent): the
		// TTL just read is shorter when the store's clock was stepped.
		ls.nextAttempt = maxTime(ls.nextAttempt, ls.renewedUntil)
	default:
		if ctx.Err() != nil {
			break
		}
		e.callFailed(ls)
		e.failed("acquire", err)
		ls.nextAttempt = time.Now().Add(e.backoff(ls.failures))
	}
	return backend.Lease{}, time.Time{}, Record{}, false
}

// crossedReset gives up an acquisition whose call crossed a break or a
// reset of the subscription (see watchBroke): the store may have restarted
// while the call was in flight (a client retries a command on a new
// connection), and have found the key free only because it lost a lease
// whose holder still leads. So the lease is released, and the wait of
// suspect begins, as for a reset seen before an attempt. Nobody else takes
// the key meanwhile unless it holds it already: the other candidates lost
// contact too, and the old leader, whose lease is gone, acquires again.
func (e *Elector) crossedReset(ls *loopState, lease backend.Lease) {
	e.giveUp(ls, lease, "sovereign: the watch broke while the acquisition was in flight; releasing it and waiting a TTL, in case the store lost a live lease")
}

// giveUp releases an acquisition that crossed a reset or a renewal (logging
// why), and starts suspect's wait, in which a read stands for each attempt.
func (e *Elector) giveUp(ls *loopState, lease backend.Lease, why string, args ...any) {
	e.log.Info(why, append([]any{"term", lease.Term}, args...)...)
	if err := e.release(lease); err != nil {
		// It expires by its TTL: no instance leads on it.
		e.log.Warn("sovereign: releasing an acquisition given up", "err", err)
	}
	e.suspect(ls)
	ls.nextAttempt = time.Now() // lookAfterReset: read who holds the key
}

// renewalCrossed reports whether the events waiting in the subscription's
// channel (gathered by watchBroke, which must have run) tell of a renewal of
// a lease other than term's that no later release or expiry ended, and
// returns the longest such renewal's TTL. After an acquisition of term, such
// a renewal crossed the call: the holder renewed (it was published before
// this acquisition ran, since a renewal is owner-checked) and the store
// found the key free anyway, which only a forward step of its clock, a
// deletion or a loss of data explains while the holder leads on.
func (e *Elector) renewalCrossed(term uint64) (time.Duration, bool) {
	live := map[uint64]time.Duration{}
	for _, s := range e.w.stash {
		switch {
		case !s.ok:
		case s.ev.Type == backend.EventRenewed && s.ev.Term != term:
			live[s.ev.Term] = max(live[s.ev.Term], s.ev.TTL)
		case s.ev.Type == backend.EventReleased && s.ev.Term != 0:
			delete(live, s.ev.Term)
		case s.ev.Type == backend.EventReleased || s.ev.Type == backend.EventExpired:
			clear(live)
		}
	}
	var ttl time.Duration
	for _, d := range live {
		ttl = max(ttl, d)
	}
	return ttl, len(live) > 0
}

// crossedRenewal gives up an acquisition that a renewal of the holder's
// lease crossed (see renewalCrossed): the lease is released, and no attempt
// follows before the renewal's TTL is up, counted from now, nor within the
// wait of suspect (a read then stands for each attempt, and finds who holds
// the key). The wait is suspect's, not renewedUntil, which the events of
// this very acquisition and release clear. A release of the holder's term
// told after the reply (its message late) cannot be told from a loss: the
// wait then costs a TTL that a plain hand-over did not need, a rare case
// (the holder renewed and released within the attempt's round trip).
func (e *Elector) crossedRenewal(ls *loopState, lease backend.Lease, ttl time.Duration) {
	e.giveUp(ls, lease, "sovereign: the holder's lease was renewed while the acquisition was in flight; releasing it and waiting out that renewal, in case the store's clock stepped forward",
		"renewal_ttl", ttl)
	ls.suspectUntil = maxTime(ls.suspectUntil, time.Now().Add(ttl+expiryMargin))
}

// refreshLeader reads the record to learn the current leader.
func (e *Elector) refreshLeader(ctx context.Context) {
	leave, ok := e.enter(ctx)
	if !ok {
		return
	}
	defer leave()
	cctx, cancel := context.WithTimeout(ctx, e.opts.RequestTimeout)
	defer cancel()
	rec, err := e.b.Get(cctx, e.name)
	switch {
	case err == nil:
		e.backendOK()
		e.setLeader(rec)
		e.observeHolder(rec)
	case errors.Is(err, backend.ErrNotHeld):
		e.backendOK()
		e.setLeader(Record{})
	}
}

// verify is the double verification after a successful acquisition: it
// checks that the store holds the lease just acquired (holder, token and
// term). On a backend whose Acquire reply is the store's own atomic record
// of the lease (backend.AcquireConfirmer), that reply is checked, which is
// what a read right after would return; otherwise the record is read back.
func (e *Elector) verify(ctx context.Context, lease backend.Lease, sent time.Time) (Record, error) {
	if c, ok := e.b.(backend.AcquireConfirmer); ok && c.AcquireConfirms() {
		if lease.Key != e.name || lease.HolderID != e.id || lease.Token == "" || lease.Term == 0 || lease.TTL <= 0 {
			return Record{}, fmt.Errorf("%w: the store confirmed %q for %q term %d TTL %v, want %q for %q with a token, a term and a TTL",
				ErrVerificationFailed, lease.Key, lease.HolderID, lease.Term, lease.TTL, e.name, e.id)
		}
		return Record{Key: lease.Key, HolderID: lease.HolderID, Token: lease.Token, Term: lease.Term,
			AcquiredAt: sent, RenewedAt: sent, TTL: lease.TTL, Metadata: e.opts.Metadata}, nil
	}
	cctx, cancel := context.WithTimeout(ctx, e.opts.RequestTimeout)
	defer cancel()
	rec, err := e.b.Get(cctx, e.name)
	if err != nil {
		return rec, fmt.Errorf("%w: %w", ErrVerificationFailed, err)
	}
	if rec.HolderID != lease.HolderID || rec.Token != lease.Token || rec.Term != lease.Term {
		return rec, fmt.Errorf("%w: read back holder %q term %d, want %q term %d",
			ErrVerificationFailed, rec.HolderID, rec.Term, lease.HolderID, lease.Term)
	}
	return rec, nil
}

// heartbeat refreshes this instance's heartbeat record. The call is cut at
// deadline when deadline is not zero.
func (e *Elector) heartbeat(ctx context.Context, ls *loopState, deadline time.Time) error {
	o := &e.opts
	s := time.Now()
	dl := s.Add(o.RequestTimeout)
	if !deadline.IsZero() {
		dl = minTime(dl, deadline)
	}
	cctx, cancel := context.WithDeadline(ctx, dl)
	err := e.b.Heartbeat(cctx, e.name, e.id, o.HeartbeatTTL)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			ls.hbFailures++
			e.heartbeatFailed(ls.hbFailures, err)
		}
		ls.nextHB = time.Now().Add(e.backoff(ls.hbFailures))
		return err
	}
	ls.hbFailures = 0
	e.backendOK()
	ls.nextHB = s.Add(o.HeartbeatInterval)
	return nil
}

// batchHeartbeater returns the backend as a BatchHeartbeater, or nil when
// it records heartbeats one by one (or its value cannot key a batch).
func (e *Elector) batchHeartbeater() backend.BatchHeartbeater {
	hb, ok := e.b.(backend.BatchHeartbeater)
	if !ok || !reflect.TypeOf(e.b).Comparable() {
		return nil
	}
	return hb
}

// release releases lease with a fresh bounded context and reports whether the
// lease is gone (released now, or already lost).
func (e *Elector) release(lease backend.Lease) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.opts.RequestTimeout)
	defer cancel()
	err := e.b.Release(ctx, lease)
	if errors.Is(err, backend.ErrLeaseLost) {
		return nil
	}
	return err
}

// cleanupMembers removes heartbeat records of other instances that are older
// than HeartbeatTTL, which their owners would have refreshed had they used
// this election's options (a record written with a longer TTL by a stopped
// instance, say). It is membership hygiene only: heartbeat records never
// decide who holds a lease.
func (e *Elector) cleanupMembers(ctx context.Context) {
	o := &e.opts
	leave, ok := e.enter(ctx)
	if !ok {
		return
	}
	defer leave()
	ctx, cancel := context.WithTimeout(ctx, o.RequestTimeout)
	defer cancel()
	members, err := e.b.Members(ctx, e.name)
	if err != nil {
		e.log.Warn("sovereign: listing heartbeat records", "err", err)
		return
	}
	for _, m := range members {
		if m.ID == e.id || m.Age <= o.HeartbeatTTL {
			continue
		}
		if err := e.b.RemoveMember(ctx, e.name, m.ID); err != nil {
			e.log.Warn("sovereign: removing stale heartbeat record", "member", m.ID, "err", err)
			return
		}
		e.log.Info("sovereign: removed stale heartbeat record", "member", m.ID, "age", m.Age)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
