package sovereign

import (
	"context"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// watchState is the elector's subscription to its key. It belongs to the
// loop goroutine, which selects on the subscription's channel itself: an
// established watch costs the elector no goroutine. Establishing one runs in
// a short-lived goroutine, so a slow store never holds up the loop (a
// leader's step-down, a Resign).
type watchState struct {
	ch         <-chan backend.Event // the established subscription; nil when none
	ready      chan watchResult     // the establishment in flight; nil when none
	retry      *time.Timer          // the next establishment after a failure; nil when none
	retryC     <-chan time.Time     // retry's channel; nil when none
	failures   int                  // consecutive failed establishments
	subscribed bool                 // a subscription was established before
	wg         sync.WaitGroup       // the establishing goroutine
}

type watchResult struct {
	ch  <-chan backend.Event
	err error
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
		ch, err := e.watcher.Watch(ctx, e.name)
		leave()
		ready <- watchResult{ch, err}
	})
}

// watchReceived handles what the subscription's channel gave: an event to
// act on (woke), or its end (a broken subscription, which is watched again
// at once; the new one is reported as a reset).
func (e *Elector) watchReceived(ctx context.Context, ev backend.Event, ok bool) (backend.Event, bool) {
	if ok {
		return ev, true
	}
	e.w.ch = nil
	e.watching.Store(false)
	e.startWatch(ctx)
	return backend.Event{}, false
}

// watchEstablished handles the end of an establishment. A new subscription
// is reported as an event (woke): changes may have been missed while
// unsubscribed, and after a broken subscription the store may also have
// restarted and lost data (EventReset). A failure is retried after a
// backoff.
func (e *Elector) watchEstablished(ctx context.Context, r watchResult) (backend.Event, bool) {
	w := &e.w
	w.ready = nil
	if r.err != nil {
		if ctx.Err() != nil {
			return backend.Event{}, false
		}
		w.failures++
		e.log.Warn("sovereign: watch failed", "err", r.err)
		w.retry = time.NewTimer(e.backoff(w.failures))
		w.retryC = w.retry.C
		return backend.Event{}, false
	}
	w.failures = 0
	w.ch = r.ch
	if er, ok := e.watcher.(backend.ExpiryReporter); ok && er.ReportsExpiry() {
		e.watching.Store(true)
	}
	typ := backend.EventChanged
	if w.subscribed {
		typ = backend.EventReset
	}
	w.subscribed = true
	return backend.Event{Key: e.name, Type: typ}, true
}

// watchRetry handles the retry timer.
func (e *Elector) watchRetry(ctx context.Context) {
	e.w.retry, e.w.retryC = nil, nil
	e.startWatch(ctx)
}

func (w *watchState) stopRetry() {
	if w.retry != nil {
		w.retry.Stop()
		w.retry, w.retryC = nil, nil
	}
}
