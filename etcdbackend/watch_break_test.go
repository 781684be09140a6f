package etcdbackend_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/etcdbackend"
	"github.com/sovereign-go/sovereign/internal/testetcd"
)

// breakableWatcher wraps a client's Watcher so that a test can break the
// latest etcd watch without touching the connection: mute makes it swallow
// the responses etcd sends from then on (as a stream that broke in flight
// loses them), and cut closes its channel, as etcd does when it cancels a
// watch. The Backend must then re-establish the watch by itself. Watches
// made after a cut pass through untouched until the next mute, or, after
// muteNew, start muted but for their confirmation; stall holds back
// everything watches made from then on receive (their confirmation too),
// until unstall, so that a test can keep the Backend's watch down.
type breakableWatcher struct {
	clientv3.Watcher

	mu      sync.Mutex // guards the fields below
	cur     *brokenWatch
	dropped int64         // highest revision among the swallowed events
	seen    chan struct{} // closed and replaced when dropped grows
	stalled chan struct{} // while non-nil, new watches wait for its close
	muteNew bool          // new watches start muted, but for their confirmation

	// The watches made, and the confirmations and progress notifications
	// the Backend has received.
	made, created, progress tally
}

// tally counts what a test waits for.
type tally struct {
	mu sync.Mutex    // guards n and ch
	n  int           // the count
	ch chan struct{} // closed and replaced when n grows
}

func (c *tally) add() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.ch != nil {
		close(c.ch)
	}
	c.ch = make(chan struct{})
}

func (c *tally) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// wait waits until the count is n or more, failing after 10 s.
func (c *tally) wait(t *testing.T, what string, n int) {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		c.mu.Lock()
		got := c.n
		if c.ch == nil {
			c.ch = make(chan struct{})
		}
		ch := c.ch
		c.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("%s: got %d within 10s, want %d", what, got, n)
		}
	}
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
	w.mu.Lock()
	bw := &brokenWatch{cut: make(chan struct{}), muted: w.muteNew}
	w.cur = bw
	stalled := w.stalled
	w.mu.Unlock()
	w.made.add()
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		defer cancel()
		if stalled != nil {
			select {
			case <-stalled:
			case <-bw.cut:
				return
			case <-ctx.Done():
				return
			}
		}
		for {
			select {
			case resp, ok := <-in:
				if !ok {
					return
				}
				w.mu.Lock()
				muted := bw.muted && !resp.Created
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
				// Counted once the Backend has the response: it reads
				// the channel again only after it has acted on it.
				switch {
				case resp.Created:
					w.created.add()
				case resp.IsProgressNotify():
					w.progress.add()
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

// stall makes the watches made from now on hold back what they receive,
// their confirmation included, until unstall.
func (w *breakableWatcher) stall() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stalled = make(chan struct{})
}

// unstall lets the stalled watches go on.
func (w *breakableWatcher) unstall() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.stalled)
	w.stalled = nil
}

// setMuteNew makes the watches made from now on start muted (on), but for
// their confirmation, or not (off).
func (w *breakableWatcher) setMuteNew(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.muteNew = on
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

// TestIdleWatchResumesPastACompaction: an idle watch (nothing changes
// under the Backend's prefix) still advances the revision it would resume
// from, with etcd's progress notifications, so that after a break it
// resumes from there: a history compacted meanwhile up to a change made
// during the break does not make it start over from the current revision,
// and that change is delivered (after the reset), not skipped.
func TestIdleWatchResumesPastACompaction(t *testing.T) {
	ec := testetcd.Start(t)
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	cli := newClient(t, ec, nil)
	bw := newBreakableWatcher(cli.Watcher)
	cli.Watcher = bw
	w := newBackend(t, cli, opts)
	a := newBackend(t, newClient(t, ec, nil), opts)
	raw := newClient(t, ec, nil)
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	// Changes elsewhere advance the store's revision, not the watch's.
	for i := range 5 {
		if _, err := raw.Put(ctx, fmt.Sprintf("elsewhere/%d", i), "x"); err != nil {
			t.Fatal(err)
		}
	}
	// The etcd client sends the request on the stream of the watches
	// made with the same metadata: the Backend's require a leader.
	if err := cli.RequestProgress(clientv3.WithRequireLeader(ctx)); err != nil {
		t.Fatalf("RequestProgress: %v", err)
	}
	bw.progress.wait(t, "progress notifications", 1)

	bw.stall()
	bw.cut()
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	compacted, err := ec.Compact(ctx, raw)
	if err != nil {
		t.Fatal(err)
	}
	if compacted != int64(l.Term) {
		t.Fatalf("compacted up to revision %d, want that of the acquisition, %d", compacted, l.Term)
	}
	bw.unstall()
	if e := nextNonReset(t, events, "acquisition during the break"); e.Type != backend.EventChanged {
		t.Fatalf("acquisition during the break: got %v, want %v", e.Type, backend.EventChanged)
	}
}

// TestWatchBrokenTwiceReplaysFromTheFirstBreak: a watch resumed after a
// break replays the changes it missed from the revision after the last it
// dispatched; if it breaks again before it has dispatched them, the next
// resumption starts from that same revision, not from the one etcd
// reported when it confirmed the resumed watch (the store's current one),
// so those changes are still delivered, none skipped.
func TestWatchBrokenTwiceReplaysFromTheFirstBreak(t *testing.T) {
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	cli := newClient(t, nil, nil)
	bw := newBreakableWatcher(cli.Watcher)
	cli.Watcher = bw
	w := newBackend(t, cli, opts)
	a := newBackend(t, newClient(t, nil, nil), opts)
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}

	// The first watch misses an acquisition and a release, and breaks.
	bw.mute()
	l, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	resp, err := cli.Get(ctx, "any")
	if err != nil {
		t.Fatal(err)
	}
	bw.waitDropped(t, resp.Header.Revision) // the release's
	bw.setMuteNew(true)
	created := bw.created.get()
	bw.cut()
	// The second is confirmed, and breaks before it delivers anything.
	bw.created.wait(t, "confirmed watches", created+1)
	bw.setMuteNew(false)
	bw.cut()
	for _, want := range []backend.EventType{backend.EventChanged, backend.EventReleased} {
		if e := nextNonReset(t, events, "changes missed before the first break"); e.Type != want {
			t.Fatalf("changes missed before the first break: got %v, want %v", e.Type, want)
		}
	}
}

// TestReconnectionToAnUnchangedStoreKeepsTheWatch: when the client's
// connection comes back, the Backend reads the store's revision to tell a
// store that lost its data (a revision below the watch's) from one that
// kept it. A store at the watch's very revision (nothing written since)
// kept it: every subscription gets its reset, and the etcd watch, which
// the client resumed, goes on; it is not started over.
func TestReconnectionToAnUnchangedStoreKeepsTheWatch(t *testing.T) {
	ec := testetcd.Start(t)
	ctx := testCtx(t)
	opts := &etcdbackend.Options{Prefix: newPrefix()}
	cli := newClient(t, ec, nil)
	bw := newBreakableWatcher(cli.Watcher)
	cli.Watcher = bw
	w := newBackend(t, cli, opts)
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	for len(events) > 0 {
		<-events // a spurious reset
	}
	etcdbackend.SignalReconnection(w)
	if e := next(t, events); e.Type != backend.EventReset {
		t.Fatalf("after the reconnection: got %v, want %v", e.Type, backend.EventReset)
	}
	a := newBackend(t, newClient(t, ec, nil), opts)
	if _, err := a.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if e := nextNonReset(t, events, "acquisition after the reconnection"); e.Type != backend.EventChanged {
		t.Fatalf("acquisition after the reconnection: got %v, want %v", e.Type, backend.EventChanged)
	}
	if got := bw.made.get(); got != 1 {
		t.Errorf("etcd watches made: got %d, want 1 (the watch goes on)", got)
	}
}

// TestWatchWaitsForABrokenWatch: a Watch made while the Backend's etcd
// watch is being re-established after a break waits for it (its return
// promises that every change after it is delivered), and fails when its
// context ends first; once the watch is back, a Watch returns.
func TestWatchWaitsForABrokenWatch(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	bw := newBreakableWatcher(cli.Watcher)
	cli.Watcher = bw
	w := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	bw.stall()
	made := bw.made.get()
	bw.cut()
	bw.made.wait(t, "watches made", made+1)
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := w.Watch(short, "j"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Watch while the etcd watch is down, with a 200 ms context: got %v, want context.DeadlineExceeded", err)
	}
	bw.unstall()
	until(t, events, backend.EventReset)
	if _, err := w.Watch(ctx, "j"); err != nil {
		t.Fatalf("Watch once the etcd watch is back: %v", err)
	}
}

// TestReconnectionWhileTheWatchStarts: a reconnection of the client while
// the Backend's etcd watch is being established (here for a new run of it,
// the connection monitor already running from an earlier one) is reported
// to the subscriptions as a reset once the watch is up: the etcd client
// may have resumed over the new connection without a word.
func TestReconnectionWhileTheWatchStarts(t *testing.T) {
	ctx := testCtx(t)
	cli := newClient(t, nil, nil)
	bw := newBreakableWatcher(cli.Watcher)
	cli.Watcher = bw
	w := newBackend(t, cli, &etcdbackend.Options{Prefix: newPrefix()})
	first, cancel := context.WithCancel(ctx)
	ch, err := w.Watch(first, "a")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	cancel()
	waitClosed(t, ch, "context cancelled")

	bw.stall()
	made := bw.made.get()
	type result struct {
		ch  <-chan backend.Event
		err error
	}
	done := make(chan result, 1)
	go func() {
		ch, err := w.Watch(ctx, "k")
		done <- result{ch, err}
	}()
	bw.made.wait(t, "watches made", made+1)
	etcdbackend.SignalReconnection(w)
	bw.unstall()
	r := <-done
	if r.err != nil {
		t.Fatalf("Watch: %v", r.err)
	}
	if e := nextEvent(t, r.ch, "reconnection during the establishment", 10*time.Second); e.Type != backend.EventReset {
		t.Fatalf("reconnection during the establishment: got %v, want %v", e.Type, backend.EventReset)
	}
}
