package etcdbackend_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
)

// breakableWatcher wraps a client's Watcher so that a test can break the
// latest etcd watch without touching the connection: mute makes it swallow
// the responses etcd sends from then on (as a stream that broke in flight
// loses them), and cut closes its channel, as etcd does when it cancels a
// watch. The Backend must then re-establish the watch by itself. Watches
// made after a cut pass through untouched until the next mute.
type breakableWatcher struct {
	clientv3.Watcher

	mu      sync.Mutex // guards the fields below
	cur     *brokenWatch
	dropped int64         // highest revision among the swallowed events
	seen    chan struct{} // closed and replaced when dropped grows
}

// brokenWatch is one watch made through a breakableWatcher.
type brokenWatch struct {
	muted bool          // guarded by breakableWatcher.mu
	cut   chan struct{} // closed by cut
}

func newBreakableWatcher(w clientv3.Watcher) *breakableWatcher {
	return &breakableWatcher{Watcher: w, seen: make(chan struct{})}
}

func (w *breakableWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	ictx, cancel := context.WithCancel(ctx)
	in := w.Watcher.Watch(ictx, key, opts...)
	bw := &brokenWatch{cut: make(chan struct{})}
	w.mu.Lock()
	w.cur = bw
	w.mu.Unlock()
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case resp, ok := <-in:
				if !ok {
					return
				}
				w.mu.Lock()
				muted := bw.muted
				if muted {
					for _, e := range resp.Events {
						if e.Kv.ModRevision > w.dropped {
							w.dropped = e.Kv.ModRevision
							close(w.seen)
							w.seen = make(chan struct{})
						}
					}
				}
				w.mu.Unlock()
				if muted {
					continue
				}
				select {
				case out <- resp:
				case <-bw.cut:
					return
				case <-ctx.Done():
					return
				}
			case <-bw.cut:
				return
			}
		}
	}()
	return out
}

// mute makes the latest watch swallow what etcd sends from now on.
func (w *breakableWatcher) mute() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur.muted = true
}

// waitDropped waits until the muted watch has swallowed an event of
// revision rev or later.
func (w *breakableWatcher) waitDropped(t *testing.T, rev int64) {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		w.mu.Lock()
		got, seen := w.dropped, w.seen
		w.mu.Unlock()
		if got >= rev {
			return
		}
		select {
		case <-seen:
		case <-timer.C:
			t.Fatalf("muted watch: got events up to revision %d within 10s, want %d", got, rev)
		}
	}
}

// cut closes the latest watch's channel.
func (w *breakableWatcher) cut() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.cur.cut)
}

// TestWatchReestablishedFromNextRevision: when etcd ends the Backend's watch
// over a connection that stays up (no leader, say), the Backend starts a new
// one from the revision after the last it dispatched: the changes made
// while the old one was broken are delivered, after a backend.EventReset,
// none twice and none from before the Watch, and the watch is live again.
func TestWatchReestablishedFromNextRevision(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	cli := newClient(t, nil, nil)
	bw := newBreakableWatcher(cli.Watcher)
	cli.Watcher = bw
	w := newBackend(t, cli, opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	acquire := func() backend.Lease {
		t.Helper()
		l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return l
	}
	release := func(l backend.Lease) {
		t.Helper()
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	var events <-chan backend.Event
	// expect reads events until it has len(want) that are not resets, and
	// checks them; with reset, a reset must come before the first.
	expect := func(what string, reset bool, want ...backend.EventType) {
		t.Helper()
		var got []backend.EventType
		resets := 0
		for len(got) < len(want) {
			e := nextEvent(t, events, what, 10*time.Second)
			if e.Type == backend.EventReset {
				resets++
				continue
			}
			if reset && resets == 0 {
				t.Fatalf("%s: got %v before any %v, want the reset first", what, e.Type, backend.EventReset)
			}
			got = append(got, e.Type)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: got %v, want %v", what, got, want)
		}
	}

	// History from before the Watch, which a resumption must not replay.
	release(acquire())
	var err error
	if events, err = w.Watch(ctx, "k"); err != nil {
		t.Fatalf("Watch: %v", err)
	}

	// Broken before any event was dispatched: resumed from the revision
	// the watch started after.
	bw.mute()
	l1 := acquire()
	bw.waitDropped(t, int64(l1.Term))
	bw.cut()
	expect("after a break with nothing dispatched", true, backend.EventChanged)

	// Broken after events were dispatched: resumed from the one after the
	// last dispatched.
	bw.mute()
	release(l1)
	l2 := acquire()
	bw.waitDropped(t, int64(l2.Term))
	bw.cut()
	expect("after a break following a dispatched event", true, backend.EventReleased, backend.EventChanged)

	// Live again.
	release(l2)
	expect("release after the re-establishment", false, backend.EventReleased)
}
