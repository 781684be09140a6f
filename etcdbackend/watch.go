package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

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
// buffered ones already tell the receiver to look. The watch is
// re-established by its goroutine when etcd cancels it; the channel is closed
// when ctx ends, the Backend is closed or the etcd client is closed.
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
	b.mu.Unlock()

	out := make(chan backend.Event, watchBuffer)
	go func() {
		defer b.watches.Done()
		defer close(out)
		defer cancel()
		defer stopOnClose()
		w.run(first, out)
	}()
	return out, nil
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
		// The range holds exactly the key and its marker, key+"\x00".
		clientv3.WithRange(b.leaseKey(w.key) + "\x00\x00"),
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
// w.ctx ends or the etcd client is closed.
func (w *watch) run(s stream, out chan<- backend.Event) {
	backoff := minWatchBackoff
	for {
		lost := w.drain(s, out)
		s.cancel()
		// Re-establish from the next revision, so nothing is missed; if
		// that has been compacted, from now, with a hint that something
		// may have been missed.
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
			if lost {
				w.b.setSeenHeld(w.key, false)
				w.send(out, backend.EventChanged)
			}
			s = next
			break
		}
	}
}

// drain delivers the events of s until it breaks or w.ctx ends. It reports
// whether events may have been lost to a compaction.
func (w *watch) drain(s stream, out chan<- backend.Event) (lost bool) {
	key, marker := w.b.leaseKey(w.key), w.b.releaseMarker(w.key)
	for resp := range s.ch {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return true
		}
		if resp.Canceled || resp.Err() != nil {
			return false
		}
		for _, ev := range resp.Events {
			w.rev = max(w.rev, ev.Kv.ModRevision)
			if string(ev.Kv.Key) != key {
				continue // the marker only explains a deletion
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
	return false
}

// send delivers an event without blocking; a full channel drops it.
func (w *watch) send(out chan<- backend.Event, typ backend.EventType) {
	select {
	case out <- backend.Event{Key: w.key, Type: typ}:
	default:
	}
}
