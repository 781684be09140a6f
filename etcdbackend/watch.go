package etcdbackend

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/sovereign-go/sovereign/backend"
)

// watchBuffer is the capacity of each watch channel.
const watchBuffer = 16

// Backoff between attempts to re-establish a broken watch.
const (
	minWatchBackoff = 10 * time.Millisecond
	maxWatchBackoff = time.Second
)

var _ backend.WatchNotifier = (*Backend)(nil)

// errCompacted reports that a watch could not start at the wanted revision
// because it has been compacted away.
var errCompacted = errors.New("etcdbackend: watch revision compacted")

// errClientClosed reports that the etcd client was closed.
var errClientClosed = errors.New("etcdbackend: etcd client closed")

// Watch subscribes to acquisitions, releases and expiries of key (see the
// package doc for what each event means on etcd). It returns once the
// Backend's etcd watch is established, so any change after Watch returns is
// delivered.
//
// Every Watch of a Backend is served by one etcd watch over the Backend's
// whole prefix, started by the first Watch and stopped when the last
// subscription ends or the Backend is closed, and by one goroutine that
// dispatches its events to the subscriptions of each key: a subscription
// costs no goroutine of its own, here or in the etcd client (the end of ctx
// is followed with context.AfterFunc, which needs no goroutine for a context
// of package context). A Watch made while that etcd watch is established
// returns at once, without a request; one made while it is being
// re-established waits for it. Records that no subscription asks about
// (heartbeats, waiter registrations, other keys) are dropped after one map
// look-up.
//
// Events never block the watch, nor one subscription another: when the
// receiver falls behind and the channel's buffer of 16 is full, further
// events are dropped, since the buffered ones already tell the receiver to
// look; but a backend.EventReset, sent to every subscription when the etcd
// watch or the client's connection was re-established, is never dropped:
// when it does not fit, the channel is closed instead. The etcd watch is
// re-established when etcd cancels it; otherwise the channel is closed when
// ctx ends, the Backend is closed or the etcd client is closed.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	return b.WatchNotify(ctx, key, nil)
}

// WatchNotify implements backend.WatchNotifier: it is Watch, and the
// Backend's dispatching goroutine calls notify after every event it sends
// (or drops) on the channel, and whoever closes the channel calls it after
// closing it.
func (b *Backend) WatchNotify(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("etcdbackend: watch: %w", err)
	}
	// The establishment is bounded like any call; the subscription lives
	// until ctx ends or the backend closes.
	startCtx, cancelStart, err := b.begin(ctx, "watch")
	if err != nil {
		return nil, err
	}
	defer cancelStart()

	s := &subscription{key: key, out: make(chan backend.Event, watchBuffer), notify: notify}
	h, r, err := b.subscribe(s)
	if err != nil {
		return nil, fmt.Errorf("etcdbackend: watch %q: %w", key, err)
	}
	// No goroutine waits for ctx: its end runs the unsubscription.
	stop := context.AfterFunc(ctx, func() { h.unsubscribe(s) })
	h.mu.Lock()
	live := r.live
	if s.closed {
		h.mu.Unlock()
		stop()
	} else {
		s.stop = stop
		h.mu.Unlock()
	}

	select {
	case <-live:
		select {
		case <-r.ended:
		default:
			return s.out, nil
		}
	case <-r.ended:
	case <-startCtx.Done():
	}
	h.unsubscribe(s)
	switch {
	case ctx.Err() == nil && b.life.Err() != nil:
		return nil, fmt.Errorf("etcdbackend: watch %q: %w", key, backend.ErrClosed)
	case startCtx.Err() != nil:
		h.mu.Lock()
		cause := r.lastErr
		h.mu.Unlock()
		if cause == nil {
			cause = startCtx.Err()
		}
		return nil, fail(startCtx, fmt.Sprintf("watch %q", key), cause)
	default:
		h.mu.Lock()
		cause := r.lastErr
		h.mu.Unlock()
		if cause == nil {
			cause = errClientClosed
		}
		return nil, fmt.Errorf("etcdbackend: watch %q: %w", key, cause)
	}
}

// hubs holds the watchHub of every Backend that has subscriptions (see
// watchHub). It is only an index: the hub lives in here from the first
// subscription to the end of the last, so a Backend that nobody watches is
// not referenced from it.
var hubs = struct {
	mu sync.Mutex // guards m; taken before any watchHub.mu
	m  map[*Backend]*watchHub
}{m: make(map[*Backend]*watchHub)}

// watchHub serves every Watch of one Backend from one etcd watch over the
// Backend's prefix (see Watch). Lock order: hubs.mu, then mu, then the
// Backend's mu.
type watchHub struct {
	b *Backend

	mu   sync.Mutex                 // guards the fields below and those of subscription
	subs map[string][]*subscription // the open subscriptions, by key
	n    int                        // number of open subscriptions
	run  *hubRun                    // the etcd watch serving them; nil when none
	gone bool                       // removed from hubs: Watch takes a new hub
	// cover changes (to a new value of coverSeq) whenever the watch may
	// have missed a change: it is established, breaks or resets (see
	// watchCover).
	cover uint64
}

// coverSeq gives watchHub.cover its values, unique across hubs, so that a
// hub made after another has gone never repeats one of its values.
var coverSeq atomic.Uint64

// watchCover returns the cover of b's hub and whether its etcd watch is
// established now: while it stays established with the same cover, every
// change under b's prefix since cover was read is delivered to dispatch,
// in order, with no gap (see coveredRenewal).
func (b *Backend) watchCover() (cover uint64, live bool) {
	hubs.mu.Lock()
	h := hubs.m[b]
	hubs.mu.Unlock()
	if h == nil {
		return 0, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.cover, !h.gone && h.run != nil && h.run.isLive
}

// newCoverLocked marks a change of h's cover. h.mu is held.
func (h *watchHub) newCoverLocked() { h.cover = coverSeq.Add(1) }

// subscription is one Watch call.
type subscription struct {
	key    string
	out    chan backend.Event
	closed bool        // out is closed (guarded by watchHub.mu)
	stop   func() bool // unregisters the unsubscription from the caller's context
	notify func()      // called after each send on out and after its close; nil for none
}

// close closes s's channel, once the caller has marked it closed, and
// tells its receiver. watchHub.mu is held.
func (s *subscription) close() {
	close(s.out)
	s.notified()
	if s.stop != nil {
		s.stop()
	}
}

// notified calls s.notify, if any.
func (s *subscription) notified() {
	if s.notify != nil {
		s.notify()
	}
}

// hubRun is one life of a hub's etcd watch, from the first subscription to
// the end of the last, a Close, or the close of the etcd client; it goes
// through as many etcd watches as breaks require, without a gap (or with a
// backend.EventReset).
type hubRun struct {
	ctx    context.Context // ends the run
	cancel context.CancelFunc
	ended  chan struct{} // closed when the run's goroutine has stopped dispatching

	// Guarded by watchHub.mu.
	live    chan struct{} // closed once an etcd watch is established; replaced when it breaks
	isLive  bool          // live is closed
	lastErr error         // why the last establishment failed, or why the run ended

	// rev is the last revision whose events have been dispatched. Only
	// the run's goroutine uses it.
	rev int64
}

// watchHub returns b's hub, creating it if b has none.
func (b *Backend) watchHub() *watchHub {
	hubs.mu.Lock()
	defer hubs.mu.Unlock()
	h := hubs.m[b]
	if h == nil {
		h = &watchHub{b: b, subs: make(map[string][]*subscription)}
		hubs.m[b] = h
	}
	return h
}

// subscribe registers s with b's hub, starting the hub's etcd watch if
// none runs, and returns the hub and the run that serves s.
func (b *Backend) subscribe(s *subscription) (*watchHub, *hubRun, error) {
	for {
		h := b.watchHub()
		h.mu.Lock()
		if h.gone {
			h.mu.Unlock()
			continue
		}
		if h.run == nil {
			if err := h.startLocked(); err != nil {
				h.mu.Unlock()
				h.retireIfIdle()
				return nil, nil, err
			}
		}
		h.subs[s.key] = append(h.subs[s.key], s)
		h.n++
		r := h.run
		h.mu.Unlock()
		return h, r, nil
	}
}

// startLocked starts a run of the hub's etcd watch. h.mu is held.
func (h *watchHub) startLocked() error {
	b := h.b
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backend.ErrClosed
	}
	b.watches.Add(1)
	b.mu.Unlock()
	ctx, cancel := context.WithCancel(b.life)
	r := &hubRun{ctx: ctx, cancel: cancel, ended: make(chan struct{}), live: make(chan struct{})}
	h.run = r
	go h.loop(r)
	return nil
}

// unsubscribe closes s's channel and forgets it, stopping the etcd watch if
// s was the last subscription. It does nothing if s is already closed.
func (h *watchHub) unsubscribe(s *subscription) {
	h.mu.Lock()
	if s.closed {
		h.mu.Unlock()
		return
	}
	h.removeLocked(s)
	idle := h.n == 0
	h.mu.Unlock()
	if idle {
		h.retireIfIdle()
	}
}

// removeLocked closes s's channel and forgets it; the last subscription
// stops the run. h.mu is held.
func (h *watchHub) removeLocked(s *subscription) {
	subs := h.subs[s.key]
	for i, o := range subs {
		if o == s {
			subs[i] = subs[len(subs)-1]
			subs[len(subs)-1] = nil
			subs = subs[:len(subs)-1]
			break
		}
	}
	if len(subs) == 0 {
		delete(h.subs, s.key)
	} else {
		h.subs[s.key] = subs
	}
	s.closed = true
	s.close()
	h.n--
	if h.n == 0 && h.run != nil {
		h.run.cancel()
		h.run = nil
	}
}

// retireIfIdle removes h from hubs when it has no subscription left, so
// that the index holds only Backends being watched.
func (h *watchHub) retireIfIdle() {
	hubs.mu.Lock()
	defer hubs.mu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 && !h.gone {
		h.gone = true
		if hubs.m[h.b] == h {
			delete(hubs.m, h.b)
		}
	}
}

// setLive records whether r's etcd watch is established.
func (h *watchHub) setLive(r *hubRun, live bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case live && !r.isLive:
		close(r.live)
	case !live && r.isLive:
		r.live = make(chan struct{})
	}
	r.isLive = live
	if live {
		r.lastErr = nil
	}
	h.newCoverLocked()
}

// end is the last thing r's goroutine does. When r ended by itself (the
// Backend or the etcd client was closed) rather than by the end of its last
// subscription, it closes every subscription's channel.
func (h *watchHub) end(r *hubRun, why error) {
	h.mu.Lock()
	r.lastErr = why
	close(r.ended)
	if h.run == r {
		for _, subs := range h.subs {
			for _, s := range subs {
				s.closed = true
				s.close()
			}
		}
		h.subs = make(map[string][]*subscription)
		h.n = 0
		h.run = nil
	}
	h.mu.Unlock()
	r.cancel()
	h.retireIfIdle()
}

// signalReset tells every watch of the backend that the connection is back
// after a break.
func (b *Backend) signalReset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.reset)
	b.reset = make(chan struct{})
}

// resetSignal returns the channel that is closed when the client's
// connection comes back after its next break.
func (b *Backend) resetSignal() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reset
}

// startMonitor starts the connection monitor, once per Backend, after its
// first etcd watch is established (so with the connection ready: the
// connection's start is no reconnection). The connection may still report
// Connecting once a watch over it has been created (seen in about 1 of 40
// new clients under the race detector); the monitor then takes its first
// Ready for a reconnection and sends every subscription a backend.EventReset
// that may be spurious. That is deliberate: a break in that window would be
// resumed by the etcd client without a word, and a missed reset is worse
// than a spurious one (waiting for a first Ready instead made the
// conformance test RestartLosingData miss the reset of a restart that lost
// the data).
func (b *Backend) startMonitor() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.monitoring {
		return
	}
	b.monitoring = true
	b.watches.Add(1)
	go b.monitor()
}

// monitor follows the state of the client's gRPC connection, from the
// backend's first Watch until the backend or the client is closed, and
// closes (and replaces) b.reset each time the connection is ready again
// after it was not. The etcd client resumes its watches over the new
// connection without telling anyone, so this is how the watches learn that
// the store may have restarted.
func (b *Backend) monitor() {
	defer b.watches.Done()
	conn := b.cli.ActiveConnection()
	state := conn.GetState()
	broken := state != connectivity.Ready
	for conn.WaitForStateChange(b.life, state) {
		state = conn.GetState()
		switch state {
		case connectivity.Ready:
			if broken {
				broken = false
				b.signalReset()
			}
		case connectivity.Shutdown:
			return // the client was closed
		default:
			broken = true
		}
	}
}

// stream is one established etcd watch.
type stream struct {
	ch     clientv3.WatchChan
	cancel context.CancelFunc
}

// loop runs r: it establishes the etcd watch, dispatches its events, and
// re-establishes it from the next revision when it breaks (from the current
// one when that has been compacted or the store lost its data), sending a
// backend.EventReset to every subscription after each re-establishment, until
// r.ctx ends or the etcd client is closed.
func (h *watchHub) loop(r *hubRun) {
	b := h.b
	defer b.watches.Done()
	// Taken before the watch is established, so that a reconnection
	// during the establishment is reported too.
	reset := b.resetSignal()
	var from int64 // 0: the current revision
	wasLive := false
	backoff := minWatchBackoff
	for {
		s, err := h.establish(r, from)
		switch {
		case err == nil:
			backoff = minWatchBackoff
			if wasLive {
				// Whatever broke the watch (no leader, a compaction, a
				// connection the client gave up on) may have come with
				// a restart of the store, or, after a compaction, with
				// changes the watch can no longer replay.
				h.resetAll(r)
			}
			b.startMonitor()
			h.setLive(r, true)
			wasLive = true
			why := h.drain(r, s, &reset)
			s.cancel()
			h.setLive(r, false)
			from = r.rev + 1
			if why == compacted || why == rewound {
				from = 0
			}
		case errors.Is(err, errCompacted):
			from = 0
			continue
		default:
			h.mu.Lock()
			r.lastErr = err
			h.mu.Unlock()
			backoff = min(2*backoff, maxWatchBackoff)
		}
		if r.ctx.Err() != nil {
			h.end(r, backend.ErrClosed)
			return
		}
		if b.cli.Ctx().Err() != nil {
			h.end(r, errClientClosed)
			return
		}
		timer := time.NewTimer(backoff)
		select {
		case <-r.ctx.Done():
			timer.Stop()
			h.end(r, backend.ErrClosed)
			return
		case <-timer.C:
		}
	}
}

// establish starts an etcd watch over the Backend's prefix from revision
// from (0: the current one) and waits, within the request timeout, until
// etcd confirms it.
func (h *watchHub) establish(r *hubRun, from int64) (stream, error) {
	b := h.b
	startCtx, cancelStart := context.WithTimeout(r.ctx, b.timeout)
	defer cancelStart()
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(r.ctx))
	opts := []clientv3.OpOption{
		clientv3.WithPrefix(),
		clientv3.WithCreatedNotify(),
		// Idle, the watch's revision still advances, so a resumption
		// after a break seldom finds it compacted.
		clientv3.WithProgressNotify(),
	}
	if from > 0 {
		opts = append(opts, clientv3.WithRev(from))
	}
	// The client's Watch blocks until its stream exists, so bound it with
	// startCtx too; once established, the watch lives on with r.ctx.
	stop := context.AfterFunc(startCtx, cancel)
	fail := func(err error) (stream, error) {
		stop()
		cancel()
		if startCtx.Err() != nil {
			return stream{}, startCtx.Err()
		}
		return stream{}, err
	}
	ch := b.cli.Watch(sctx, b.prefix, opts...)
	for {
		select {
		case resp, ok := <-ch:
			switch {
			case !ok:
				if err := r.ctx.Err(); err != nil {
					return fail(err)
				}
				if b.cli.Ctx().Err() != nil {
					return fail(errClientClosed)
				}
				return fail(errors.New("watch channel closed"))
			case resp.CompactRevision != 0:
				return fail(errCompacted)
			case resp.Canceled:
				return fail(resp.Err())
			case resp.Created:
				if !stop() {
					return fail(startCtx.Err())
				}
				if from == 0 {
					// The watch starts after this revision.
					r.rev = resp.Header.Revision
				}
				return stream{ch: ch, cancel: cancel}, nil
			}
		case <-startCtx.Done():
			return fail(startCtx.Err())
		}
	}
}

// Why drain returned.
const (
	broken    = iota // the etcd watch was cancelled or its channel closed
	compacted        // the watch's next revision has been compacted away
	rewound          // the store's revision is below the watch's: it lost data
)

// rewound reports whether the store's current revision is below the last
// one r dispatched, which happens when the store came back from a restart
// without its data (an empty or older data directory): revisions start
// over, and a watch resumed from its old revision would stay silent until
// the new ones caught up. It costs one read per Backend; a failed read
// reports false (the next reconnection asks again). A store that lost its
// data and has already written past the watch's revision goes unnoticed.
func (h *watchHub) rewound(r *hubRun) bool {
	ctx, cancel := context.WithTimeout(r.ctx, h.b.timeout)
	defer cancel()
	resp, err := h.b.cli.Get(ctx, h.b.prefix, clientv3.WithCountOnly())
	return err == nil && resp.Header.Revision < r.rev
}

// drain dispatches the events of s until it breaks or r ends, and a
// backend.EventReset to every subscription each time *reset is closed
// (taking the next reset signal). It says why it returned.
func (h *watchHub) drain(r *hubRun, s stream, reset *<-chan struct{}) int {
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case resp, ok = <-s.ch:
		case <-*reset:
			*reset = h.b.resetSignal()
			if h.rewound(r) {
				return rewound
			}
			h.resetAll(r)
			continue
		}
		if !ok {
			return broken
		}
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return compacted
		}
		if resp.Canceled || resp.Err() != nil {
			return broken
		}
		h.dispatch(r, resp)
	}
}

// dispatch sends the events of resp to the subscriptions of their keys,
// without blocking: a full channel drops the event (its buffered events
// already tell the receiver to look). Changes of keys nobody subscribed to,
// heartbeat records among them, cost one map look-up each.
func (h *watchHub) dispatch(r *hubRun, resp clientv3.WatchResponse) {
	for _, ev := range resp.Events {
		r.rev = max(r.rev, ev.Kv.ModRevision)
	}
	if resp.IsProgressNotify() {
		r.rev = max(r.rev, resp.Header.Revision)
	}
	prefix := h.b.prefix
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.run != r {
		return // stopped: nobody listens to r any more
	}
	h.b.noteEvents(resp.Events)
	for i, ev := range resp.Events {
		k := ev.Kv.Key
		if len(k) < len(prefix) || string(k[:len(prefix)]) != prefix {
			continue
		}
		rel := k[len(prefix):]
		key := rel
		if j := bytes.IndexByte(rel, 0); j >= 0 {
			key = rel[:j]
		}
		// No allocation for the look-up, nor for the records it drops.
		subs := h.subs[string(key)]
		if len(subs) == 0 {
			continue // a heartbeat record, or a key nobody watches
		}
		if len(rel) > len(key) {
			// <key>\x00: the marker only explains a deletion.
			if len(rel) == len(key)+1 {
				continue
			}
			if rel[len(key)+1] == waitersPart[0] {
				// A waiter: its registration and its refreshes change
				// nothing for anyone (and reporting them would wake
				// every waiter at each retry); its withdrawal or
				// expiry may let those behind it go.
				if ev.Type == mvccpb.DELETE {
					send(subs, backend.EventChanged)
				}
				continue
			}
		}
		switch ev.Type {
		case mvccpb.PUT:
			send(subs, backend.EventChanged)
		case mvccpb.DELETE:
			key := subs[0].key
			h.b.setSeenHeld(key, false)
			send(subs, h.b.deletionType(resp.Events, i, key))
		}
	}
}

// releasedWith reports whether the deletion events[i] came with a put of the
// release marker in the same transaction (so the same revision): the events
// of one revision are next to each other.
func releasedWith(events []*clientv3.Event, i int, marker string) bool {
	rev := events[i].Kv.ModRevision
	for j := i; j >= 0 && events[j].Kv.ModRevision == rev; j-- {
		if events[j].Type == mvccpb.PUT && string(events[j].Kv.Key) == marker {
			return true
		}
	}
	for j := i + 1; j < len(events) && events[j].Kv.ModRevision == rev; j++ {
		if events[j].Type == mvccpb.PUT && string(events[j].Kv.Key) == marker {
			return true
		}
	}
	return false
}

// send delivers an event to each of subs, all of one key, without
// blocking; a full channel drops it. watchHub.mu is held.
func send(subs []*subscription, typ backend.EventType) {
	for _, s := range subs {
		select {
		case s.out <- backend.Event{Key: s.key, Type: typ}:
		default:
		}
		s.notified()
	}
}

// resetAll delivers a backend.EventReset to every subscription of r without
// blocking. A reset must not be dropped (a holder renews at once on it), so
// a subscription whose channel has no room for it is closed instead, which
// the receiver treats the same way; the others are not held up by it.
func (h *watchHub) resetAll(r *hubRun) {
	h.mu.Lock()
	if h.run != r {
		h.mu.Unlock()
		return
	}
	h.newCoverLocked()
	var full []*subscription
	for key, subs := range h.subs {
		h.b.setSeenHeld(key, false) // the store may have lost data
		for _, s := range subs {
			select {
			case s.out <- backend.Event{Key: key, Type: backend.EventReset}:
				s.notified()
			default:
				full = append(full, s) // closed below, which notifies
			}
		}
	}
	for _, s := range full {
		h.removeLocked(s)
	}
	idle := h.n == 0
	h.mu.Unlock()
	if idle {
		h.retireIfIdle()
	}
}
