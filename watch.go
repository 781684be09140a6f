package sovereign

import (
	"context"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// watchState is the elector's subscription to its key. It belongs to the
// machine's runner (see run.go), which receives from the subscription's
// channel itself: an established watch costs the elector no goroutine, and,
// on a backend.WatchNotifier, whose notifications wake the machine, none
// while it waits either. Establishing one runs in a short-lived goroutine,
// so a slow store never holds up the loop (a leader's step-down, a Resign);
// it wakes the machine when it is done.
type watchState struct {
	ch         <-chan backend.Event // the established subscription; nil when none
	notified   bool                 // ch's events wake the machine (WatchNotify)
	stash      []stashed            // what block and watchBroke received from ch and poll has yet to return, oldest first
	ready      chan watchResult     // the establishment in flight; nil when none
	retryAt    time.Time            // the next establishment after a failure; zero when none
	failures   int                  // consecutive failed establishments
	subscribed bool                 // a subscription was established before
	wg         sync.WaitGroup       // the establishing goroutine
}

// stashed is one receive from a subscription's channel.
type stashed struct {
	ev backend.Event
	ok bool
}

type watchResult struct {
	ch       <-chan backend.Event
	notified bool
	err      error
}

// startWatch begins establishing a subscription, unless the backend cannot
// watch or one is established or on its way.
func (e *Elector) startWatch(ctx context.Context) {
	w := &e.w
	if e.watcher == nil || w.ch != nil || w.ready != nil || ctx.Err() != nil {
		return
	}
	w.stopRetry()
	ready := make(chan watchResult, 1) // the goroutine never waits for the loop
	w.ready = ready
	limit := e.limit
	w.wg.Go(func() {
		leave, ok := enterWatch(ctx, limit)
		if !ok {
			ready <- watchResult{err: ctx.Err()}
			return
		}
		var r watchResult
		switch {
		case e.muter != nil:
			r.ch, r.err = e.muter.WatchRenewalsMuted(ctx, e.name, e.wake, &e.renewalsMuted)
			r.notified = true
		case e.renewals != nil:
			r.ch, r.err = e.renewals.WatchRenewals(ctx, e.name, e.wake)
			r.notified = true
		case e.notifier != nil:
			r.ch, r.err = e.notifier.WatchNotify(ctx, e.name, e.wake)
			r.notified = true
		default:
			r.ch, r.err = e.watcher.Watch(ctx, e.name)
		}
		leave()
		ready <- r
		e.wake()
	})
}

// watchReceived handles what the subscription's channel gave: an event to
// act on (woke), or its end (a broken subscription, which is watched again
// at once; the new one is reported as a reset).
func (e *Elector) watchReceived(ctx context.Context, ev backend.Event, ok bool) (backend.Event, bool) {
	if ok {
		return ev, true
	}
	e.w.ch, e.w.notified = nil, false
	e.watching.Store(false)
	if rs := &e.rs; rs.phase == phaseCampaign {
		if rs.ls.answered {
			// The connection to the store broke: it may be restarting, so
			// the wait of suspect begins now rather than when the watch is
			// back (EventReset), and an attempt due meanwhile only reads.
			e.suspect(&rs.ls)
		}
		// The next look was scheduled counting on the watch to report the
		// holder's release or expiry (quietRecheck): until a watch is
		// back, look at least once a TTL, as without one.
		rs.ls.nextAttempt = minTime(rs.ls.nextAttempt, time.Now().Add(e.opts.TTL))
	}
	e.startWatch(ctx)
	return backend.Event{}, false
}

// watchBroke reports, without blocking, whether the subscription's channel
// has closed or holds an EventReset among the events waiting in it: the
// connection to the store broke since the runner last received from it.
// What it receives is kept, in order, for poll. The subscription must be
// established (w.ch not nil).
func (e *Elector) watchBroke() bool {
	w := &e.w
	// Bounded, in case events keep coming as fast as they are taken.
	for range 1024 {
		if n := len(w.stash); n > 0 && !w.stash[n-1].ok {
			break // closed
		}
		ev, ok, got := receiveNow(w.ch)
		if !got {
			break
		}
		w.stash = append(w.stash, stashed{ev, ok})
	}
	for _, s := range w.stash {
		if !s.ok || s.ev.Type == backend.EventReset {
			return true
		}
	}
	return false
}

// watchEstablished handles the end of an establishment. A new subscription
// is reported as an event (woke): changes may have been missed while
// unsubscribed, and after a broken subscription or a failed establishment
// the store may also have restarted and lost data (EventReset). A failure
// is retried after a backoff.
func (e *Elector) watchEstablished(ctx context.Context, r watchResult) (backend.Event, bool) {
	w := &e.w
	w.ready = nil
	if r.err != nil {
		if ctx.Err() != nil {
			return backend.Event{}, false
		}
		w.failures++
		e.log.Warn("sovereign: watch failed", "err", r.err)
		w.retryAt = time.Now().Add(e.backoff(w.failures))
		return backend.Event{}, false
	}
	failed := w.failures > 0
	w.failures = 0
	w.ch, w.notified = r.ch, r.notified
	if er, ok := e.watcher.(backend.ExpiryReporter); ok && er.ReportsExpiry() {
		e.watching.Store(true)
	}
	typ := backend.EventChanged
	if w.subscribed || failed {
		typ = backend.EventReset
	}
	w.subscribed = true
	return backend.Event{Key: e.name, Type: typ}, true
}

// watchRetry establishes the subscription again once w.retryAt has passed.
func (e *Elector) watchRetry(ctx context.Context) {
	e.w.retryAt = time.Time{}
	e.startWatch(ctx)
}

func (w *watchState) stopRetry() { w.retryAt = time.Time{} }

// receiveNow receives from ch if that does not block (got).
func receiveNow(ch <-chan backend.Event) (ev backend.Event, ok, got bool) {
	select {
	case ev, ok = <-ch:
		return ev, ok, true
	default:
		return backend.Event{}, false, false
	}
}
