package sovereign

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// Event is something that happened to an elector: one of StateChanged,
// LeadershipAcquired, LeadershipLost, LeaderChanged, LeaderStale,
// ElectionFailed and EventsDropped. Listeners switch on the concrete type.
type Event interface {
	event()
}

// StateChanged reports a transition of the elector's State.
type StateChanged struct {
	From, To State
}

// LeadershipAcquired reports that this elector became leader with a fresh
// lease of the given fencing term.
type LeadershipAcquired struct {
	Term uint64
}

// LeadershipLost reports that this elector stopped being leader. By the time
// a listener sees it, IsLeader already answers false and the leader context
// of that term is cancelled.
type LeadershipLost struct {
	// Term is the term that ended.
	Term uint64
	// Reason says why it ended.
	Reason LossReason
	// Err is the underlying error, if any (a backend error, or the leader
	// function's error when it returned one).
	Err error
}

// LeaderChanged reports a change of the leader this elector knows of: another
// instance, itself, or nobody (Leader.HolderID empty).
type LeaderChanged struct {
	Leader Record
}

// HasLeader reports whether the event names a leader.
func (e LeaderChanged) HasLeader() bool { return e.Leader.HolderID != "" }

// ElectionFailed reports a failed step of the campaign or of leadership: a
// backend error, a failed double verification, a failed renewal that will be
// retried. The elector carries on by itself.
type ElectionFailed struct {
	Err error
}

// LeaderStale reports that the leader's heartbeat record has been missing
// for longer than HeartbeatTTL (measured by this elector's monotonic clock
// from when it first saw it missing), while its lease is still held. It is a
// report for people and alerts, never acted on: only the lease's TTL ends a
// lease, because a record can vanish while its owner is alive (a store that
// lost data, an eviction, a delete by hand, a same-ID instance stopping).
// It is published once per leader and term each time the record goes
// missing; Status shows the current state.
type LeaderStale struct {
	Leader Record
	// Age is how long the heartbeat has been missing, by this elector's
	// clock.
	Age time.Duration
}

// EventsDropped is delivered to a listener that fell so far behind that its
// queue overflowed: Count of its oldest pending events were discarded. It
// stands where those events stood.
type EventsDropped struct {
	Count int
}

func (StateChanged) event()       {}
func (LeadershipAcquired) event() {}
func (LeadershipLost) event()     {}
func (LeaderChanged) event()      {}
func (ElectionFailed) event()     {}
func (EventsDropped) event()      {}
func (LeaderStale) event()        {}

// LossReason says why a term ended.
type LossReason int

const (
	// ReasonResigned: Resign was called.
	ReasonResigned LossReason = iota + 1
	// ReasonClosed: the elector was closed or its context ended.
	ReasonClosed
	// ReasonReturned: the leader function returned by itself.
	ReasonReturned
	// ReasonDeadline: no renewal (or heartbeat) succeeded within the renew
	// deadline, so leadership was no longer certain.
	ReasonDeadline
	// ReasonLeaseLost: the backend reported that the lease is no longer ours.
	ReasonLeaseLost
)

// String returns a short name of the reason.
func (r LossReason) String() string {
	switch r {
	case ReasonResigned:
		return "resigned"
	case ReasonClosed:
		return "closed"
	case ReasonReturned:
		return "leader function returned"
	case ReasonDeadline:
		return "renew deadline passed"
	case ReasonLeaseLost:
		return "lease lost"
	default:
		return fmt.Sprintf("LossReason(%d)", int(r))
	}
}

// maxPending is how many events a listener may have queued before the oldest
// are dropped.
const maxPending = 1024

// bus delivers events to listeners. Each listener has its own goroutine and
// queue, so a slow, blocking or panicking listener affects only itself.
type bus struct {
	log    *slog.Logger
	onDrop func() // called for every event dropped from a listener's queue

	mu     sync.Mutex // guards subs, nextID, closed
	subs   map[int]*listener
	nextID int
	closed bool

	wg sync.WaitGroup // listener goroutines
}

type listener struct {
	fn     func(Event)
	onExit func()

	mu      sync.Mutex // guards queue, dropped, stopped, draining
	queue   []Event
	dropped int
	stopped bool // unsubscribed: exit without delivering the rest
	drain   bool // bus closed: deliver the rest, then exit

	signal chan struct{} // capacity 1: something changed
}

func newBus(log *slog.Logger, onDrop func()) *bus {
	return &bus{log: log, subs: make(map[int]*listener), onDrop: onDrop}
}

// subscribe adds a listener. onExit, if not nil, runs on the listener's
// goroutine when it ends. It returns a no-op unsubscribe on a closed bus.
func (b *bus) subscribe(fn func(Event), onExit func()) (unsubscribe func()) {
	l := &listener{fn: fn, onExit: onExit, signal: make(chan struct{}, 1)}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		if onExit != nil {
			onExit()
		}
		return func() {}
	}
	id := b.nextID
	b.nextID++
	b.subs[id] = l
	b.wg.Add(1)
	go b.deliver(l)
	return func() {
		b.mu.Lock()
		delete(b.subs, id)
		b.mu.Unlock()
		l.mu.Lock()
		l.stopped = true
		l.mu.Unlock()
		l.wake()
	}
}

// publish queues ev for every listener. It never blocks on a listener.
func (b *bus) publish(ev Event) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.subs {
		l.mu.Lock()
		if len(l.queue) >= maxPending {
			l.queue = l.queue[1:]
			l.dropped++
			if b.onDrop != nil {
				b.onDrop()
			}
		}
		l.queue = append(l.queue, ev)
		l.mu.Unlock()
		l.wake()
	}
}

// close makes every listener deliver what it has queued and end, and waits
// for them.
func (b *bus) close() {
	b.mu.Lock()
	b.closed = true
	subs := b.subs
	b.subs = map[int]*listener{}
	b.mu.Unlock()
	for _, l := range subs {
		l.mu.Lock()
		l.drain = true
		l.mu.Unlock()
		l.wake()
	}
	b.wg.Wait()
}

func (l *listener) wake() {
	select {
	case l.signal <- struct{}{}:
	default:
	}
}

func (b *bus) deliver(l *listener) {
	defer b.wg.Done()
	if l.onExit != nil {
		defer l.onExit()
	}
	for range l.signal {
		for {
			l.mu.Lock()
			if l.stopped {
				l.mu.Unlock()
				return
			}
			if len(l.queue) == 0 {
				drain := l.drain
				l.mu.Unlock()
				if drain {
					return
				}
				break
			}
			var ev Event
			if l.dropped > 0 {
				ev = EventsDropped{Count: l.dropped}
				l.dropped = 0
			} else {
				ev = l.queue[0]
				l.queue[0] = nil
				l.queue = l.queue[1:]
			}
			l.mu.Unlock()
			b.call(l.fn, ev)
		}
	}
}

// call runs one listener call, recovering a panic so it cannot crash the
// process or stop later deliveries.
func (b *bus) call(fn func(Event), ev Event) {
	defer func() {
		if r := recover(); r != nil {
			b.log.Error("sovereign: event listener panicked", "event", fmt.Sprintf("%T", ev), "panic", r)
		}
	}()
	fn(ev)
}

// Subscribe registers fn to be called with every event from now on, and
// returns a function that unregisters it.
//
// Delivery contract: each listener has its own goroutine and receives events
// one at a time, in the order they happened, never concurrently with itself.
// Publishing never waits for a listener: events queue per listener, and a
// listener more than 1024 events behind loses the oldest ones, replaced by one
// EventsDropped. A panicking listener is logged and keeps receiving. A slow or
// blocked listener therefore never delays the state machine or a step-down.
// Unsubscribe returns at once (it may be called from the listener itself); at
// most the event being delivered is still delivered after it. Close delivers
// every queued event before it returns, so a listener that never returns
// blocks Close.
func (e *Elector) Subscribe(fn func(Event)) (unsubscribe func()) {
	return e.bus.subscribe(fn, nil)
}

// Observe returns a channel of the leader as this elector sees it: it always
// holds the most recent value (older values not yet received are replaced),
// starting with the leader known when Observe is called. A Record with an
// empty HolderID means no leader. The channel is closed when ctx ends or the
// elector is closed.
func (e *Elector) Observe(ctx context.Context) <-chan Record {
	ch := make(chan Record, 1)
	put := func(r Record) {
		for {
			select {
			case ch <- r:
				return
			default:
			}
			select {
			case <-ch:
			default:
			}
		}
	}
	// Snapshot and subscribe under one lock: LeaderChanged is published
	// under e.mu, so none can fall between the two.
	e.mu.Lock()
	put(e.leader)
	unsubscribe := e.bus.subscribe(func(ev Event) {
		if lc, ok := ev.(LeaderChanged); ok {
			put(lc.Leader)
		}
	}, func() { close(ch) })
	e.mu.Unlock()
	context.AfterFunc(ctx, unsubscribe) // harmless after Close: unsubscribe is idempotent
	return ch
}

// Record is the record of a lease holder, as stored by the backend.
type Record = backend.Record
