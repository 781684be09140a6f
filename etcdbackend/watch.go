package etcdbackend

import (
	"context"
	"errors"
	"fmt"
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

// errCompacted reports that a watch could not start at the wanted revision
// because it has been compacted away.
var errCompacted = errors.New("etcdbackend: watch revision compacted")

// Watch subscribes to acquisitions, releases and expiries of key (see the
// package doc for what each event means on etcd). It returns once the etcd
// watch is established, so any change after Watch returns is delivered.
// Events never block the watch: when the receiver falls behind and the
// channel's buffer of 16 is full, further events are dropped, since the
// buffered ones already tell the receiver to look; but a
// backend.EventReset, sent when the watch or the client's connection was
// re-established, is never dropped: when it does not fit, the channel is
// closed instead. The watch is re-established by its goroutine when etcd
// cancels it; otherwise the channel is closed when ctx ends, the Backend is
// closed or the etcd client is closed.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("etcdbackend: watch: %w", err)
	}
	// The establishment is bounded like any call; the watch itself lives
	// until ctx ends or the backend closes.
	startCtx, cancelStart, err := b.begin(ctx, "watch")
	if err != nil {
		return nil, err
	}
	defer cancelStart()

	wctx, cancel := context.WithCancel(ctx)
	stopOnClose := context.AfterFunc(b.life, cancel)
	// Taken before the watch is established, so that a reconnection
	// during the establishment is reported too.
	reset := b.resetSignal()
	w := &watch{b: b, key: key, ctx: wctx}
	first, err := w.establish(startCtx, 0)
	if err != nil {
		stopOnClose()
		cancel()
		if ctx.Err() == nil && b.life.Err() != nil {
			return nil, fmt.Errorf("etcdbackend: watch %q: %w", key, backend.ErrClosed)
		}
		return nil, fail(startCtx, fmt.Sprintf("watch %q", key), err)
	}

	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		first.cancel()
		stopOnClose()
		cancel()
		return nil, fmt.Errorf("etcdbackend: watch %q: %w", key, backend.ErrClosed)
	}
	b.watches.Add(1)
	if !b.monitoring {
		b.monitoring = true
		b.watches.Add(1)
		go b.monitor()
	}
	b.mu.Unlock()

	out := make(chan backend.Event, watchBuffer)
	go func() {
		defer b.watches.Done()
		defer close(out)
		defer cancel()
		defer stopOnClose()
		w.run(first, reset, out)
	}()
	return out, nil
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

// watch is the state of one Watch call.
type watch struct {
	b   *Backend
	key string
	ctx context.Context // ends the watch
	// rev is the last revision whose events have been delivered.
	rev int64
}

// stream is one established etcd watch.
type stream struct {
	ch     clientv3.WatchChan
	cancel context.CancelFunc
}

// establish starts an etcd watch on the key and its release marker from
// revision from (0: the current one) and waits, within startCtx, until etcd
// confirms it.
func (w *watch) establish(startCtx context.Context, from int64) (stream, error) {
	b := w.b
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(w.ctx))
	opts := []clientv3.OpOption{
		// The range holds the key, its marker key+"\x00" and the
		// entries of backend.Modes, key+"\x00...", and nothing else.
		clientv3.WithRange(b.stateEnd(w.key)),
		clientv3.WithCreatedNotify(),
	}
	if from > 0 {
		opts = append(opts, clientv3.WithRev(from))
	}
	// The client's Watch blocks until its stream exists, so bound it with
	// startCtx too; once established, the watch lives on with w.ctx.
	stop := context.AfterFunc(startCtx, cancel)
	fail := func(err error) (stream, error) {
		stop()
		cancel()
		if startCtx.Err() != nil {
			return stream{}, startCtx.Err()
		}
		return stream{}, err
	}
	ch := b.cli.Watch(sctx, b.leaseKey(w.key), opts...)
	for {
		select {
		case resp, ok := <-ch:
			switch {
			case !ok:
				if err := w.ctx.Err(); err != nil {
					return fail(err)
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
					w.rev = resp.Header.Revision
				}
				return stream{ch: ch, cancel: cancel}, nil
			}
		case <-startCtx.Done():
			return fail(startCtx.Err())
		}
	}
}

// run delivers the events of s and of every watch that replaces it, until
// w.ctx ends, the etcd client is closed, or a backend.EventReset cannot be
// delivered because the receiver is behind (closing the channel then tells
// the receiver the same). reset is closed when the client's connection is
// back after a break.
func (w *watch) run(s stream, reset <-chan struct{}, out chan<- backend.Event) {
	backoff := minWatchBackoff
	for {
		why := w.drain(s, &reset, out)
		s.cancel()
		if why == overflowed {
			return
		}
		// Re-establish from the next revision, so nothing is missed; if
		// that has been compacted, from now.
		lost := why == compacted || why == rewound
		for {
			if w.ctx.Err() != nil || w.b.cli.Ctx().Err() != nil {
				return
			}
			timer := time.NewTimer(backoff)
			select {
			case <-w.ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			from := w.rev + 1
			if lost {
				from = 0
			}
			startCtx, cancel := context.WithTimeout(w.ctx, w.b.timeout)
			next, err := w.establish(startCtx, from)
			cancel()
			if errors.Is(err, errCompacted) {
				lost = true
				continue
			}
			if err != nil {
				backoff = min(2*backoff, maxWatchBackoff)
				continue
			}
			backoff = minWatchBackoff
			// Whatever broke the watch (no leader, a compaction, a
			// connection the client gave up on) may have come with a
			// restart of the store, or, after a compaction, with changes
			// the watch can no longer replay.
			if !w.sendReset(out) {
				next.cancel()
				return
			}
			s = next
			break
		}
	}
}

// Why drain returned.
const (
	broken     = iota // the etcd watch was cancelled or its channel closed
	compacted         // the watch's next revision has been compacted away
	overflowed        // a backend.EventReset did not fit in the channel
	rewound           // the store's revision is below the watch's: it lost data
)

// rewound reports whether the store's current revision is below the last
// one the watch delivered, which happens when the store came back from a
// restart without its data (an empty or older data directory): revisions
// start over, and a watch resumed from its old revision would stay silent
// until the new ones caught up. It costs one read; a failed read reports
// false (the next reconnection asks again). A store that lost its data and
// has already written past the watch's revision goes unnoticed.
func (w *watch) rewound() bool {
	ctx, cancel := context.WithTimeout(w.ctx, w.b.timeout)
	defer cancel()
	resp, err := w.b.cli.Get(ctx, w.b.leaseKey(w.key), clientv3.WithCountOnly())
	return err == nil && resp.Header.Revision < w.rev
}

// drain delivers the events of s until it breaks or w.ctx ends, and a
// backend.EventReset each time *reset is closed (taking the next reset
// signal). It says why it returned.
func (w *watch) drain(s stream, reset *<-chan struct{}, out chan<- backend.Event) int {
	key, marker := w.b.leaseKey(w.key), w.b.releaseMarker(w.key)
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case resp, ok = <-s.ch:
		case <-*reset:
			*reset = w.b.resetSignal()
			if w.rewound() {
				return rewound
			}
			if !w.sendReset(out) {
				return overflowed
			}
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
		for _, ev := range resp.Events {
			w.rev = max(w.rev, ev.Kv.ModRevision)
			k := string(ev.Kv.Key)
			if k != key {
				if len(k) <= len(marker) {
					continue // the marker only explains a deletion
				}
				if k[len(marker)] == waitersPart[0] {
					// A waiter: its registration and its refreshes
					// change nothing for anyone (and reporting them
					// would wake every waiter at each retry); its
					// withdrawal or expiry may let those behind it
					// go.
					if ev.Type == mvccpb.DELETE {
						w.send(out, backend.EventChanged)
					}
					continue
				}
			}
			switch ev.Type {
			case mvccpb.PUT:
				w.send(out, backend.EventChanged)
			case mvccpb.DELETE:
				w.b.setSeenHeld(w.key, false)
				typ := backend.EventExpired
				for _, o := range resp.Events {
					if o.Type == mvccpb.PUT && string(o.Kv.Key) == marker && o.Kv.ModRevision == ev.Kv.ModRevision {
						typ = backend.EventReleased
					}
				}
				w.send(out, typ)
			}
		}
		if resp.IsProgressNotify() {
			w.rev = max(w.rev, resp.Header.Revision)
		}
	}
}

// sendReset delivers a backend.EventReset without blocking and reports
// whether it fitted in the channel. A reset must not be dropped (a holder
// renews at once on it), so the caller closes the channel when it does not
// fit, which the receiver treats the same way.
func (w *watch) sendReset(out chan<- backend.Event) bool {
	w.b.setSeenHeld(w.key, false) // the store may have lost data
	select {
	case out <- backend.Event{Key: w.key, Type: backend.EventReset}:
		return true
	default:
		return false
	}
}

// send delivers an event without blocking; a full channel drops it.
func (w *watch) send(out chan<- backend.Event, typ backend.EventType) {
	select {
	case out <- backend.Event{Key: w.key, Type: typ}:
	default:
	}
}
