package sovereign

import (
	"context"
	"reflect"
	"sync"

	"github.com/sovereign-go/sovereign/backend"
)

// maxInflight bounds the acquisitions, verifications and other one-off calls
// that the electors of a process have in flight on one backend at once; the
// others wait for a place before their request timeout starts. Ten thousand
// elections starting together would otherwise send ten thousand requests at
// once: on a loaded machine they time out together, are retried together,
// and the store serves nothing but timed-out work (renewals and heartbeats
// are batched and do not count here).
const maxInflight = 256

// callLimit is the shared bound of one backend, made on demand and dropped
// when its last elector stops. Subscriptions being established have a bound
// of their own (maxInflight too), so that slow ones never hold up
// acquisitions.
type callLimit struct {
	slots   chan struct{}
	watches chan struct{}
	users   int // guarded by limitsMu
}

var (
	limitsMu sync.Mutex
	limits   = map[backend.Backend]*callLimit{}
)

// joinLimit makes e one of the users of its backend's bound. A backend whose
// value cannot be a map key has no shared bound.
func (e *Elector) joinLimit() {
	if !reflect.TypeOf(e.b).Comparable() {
		return
	}
	limitsMu.Lock()
	defer limitsMu.Unlock()
	l := limits[e.b]
	if l == nil {
		l = &callLimit{slots: make(chan struct{}, maxInflight), watches: make(chan struct{}, maxInflight)}
		limits[e.b] = l
	}
	l.users++
	e.limit = l
}

// leaveLimit undoes joinLimit.
func (e *Elector) leaveLimit() {
	if e.limit == nil {
		return
	}
	limitsMu.Lock()
	defer limitsMu.Unlock()
	if e.limit.users--; e.limit.users == 0 {
		delete(limits, e.b)
	}
}

// enter waits for a place among the calls in flight on the backend and
// returns the function that gives it back; ok is false when ctx ended first.
func (e *Elector) enter(ctx context.Context) (leave func(), ok bool) {
	if e.limit == nil {
		return func() {}, ctx.Err() == nil
	}
	return take(ctx, e.limit.slots)
}

// enterWatch is enter for a subscription being established. l is the
// elector's limit, read by the loop before it started the establishing
// goroutine.
func enterWatch(ctx context.Context, l *callLimit) (leave func(), ok bool) {
	if l == nil {
		return func() {}, ctx.Err() == nil
	}
	return take(ctx, l.watches)
}

func take(ctx context.Context, slots chan struct{}) (leave func(), ok bool) {
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, true
	case <-ctx.Done():
		return nil, false
	}
}
