package etcdbackend

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sovereign-go/sovereign/backend"
)

// unconnectedBackend returns a Backend whose client never connects: the
// hub tests below feed it watch responses by hand. A reset first reads the
// store's revision, which fails fast here.
func unconnectedBackend(t *testing.T) *Backend {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	b, err := New(cli, &Options{Prefix: "p/", RequestTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// testHub returns a hub of b with a run that no goroutine serves, and a
// function adding a subscription to it.
func testHub(t *testing.T, b *Backend) (*watchHub, *hubRun, func(key string) *subscription) {
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	r := &hubRun{ctx: ctx, cancel: cancel, ended: make(chan struct{}), live: make(chan struct{})}
	h := &watchHub{b: b, subs: make(map[string][]*subscription), run: r}
	add := func(key string) *subscription {
		s := &subscription{key: key, out: make(chan backend.Event, watchBuffer)}
		h.mu.Lock()
		h.subs[key] = append(h.subs[key], s)
		h.n++
		h.mu.Unlock()
		return s
	}
	return h, r, add
}

// ev is a watch event on etcd key k at revision rev.
func ev(typ mvccpb.Event_EventType, k string, rev int64) *clientv3.Event {
	return &clientv3.Event{Type: typ, Kv: &mvccpb.KeyValue{Key: []byte(k), ModRevision: rev}}
}

// received returns the events buffered in s's channel.
func received(s *subscription) []backend.EventType {
	var got []backend.EventType
	for {
		select {
		case e, ok := <-s.out:
			if !ok {
				return got
			}
			if e.Key != s.key {
				panic(fmt.Sprintf("event for %q on the subscription of %q", e.Key, s.key))
			}
			got = append(got, e.Type)
		default:
			return got
		}
	}
}

// TestDispatchRoutesEventsByKey: one etcd watch over the whole prefix
// carries every key's changes; each reaches the subscriptions of its own key
// only, typed as the per-key watch typed it (a deletion is an expiry when
// its revision deleted a lease mark, unless it came with its key's release
// marker), and heartbeat records, release markers, lease marks, waiter
// registrations and keys nobody watches reach nobody.
func TestDispatchRoutesEventsByKey(t *testing.T) {
	const (
		put = mvccpb.PUT
		del = mvccpb.DELETE
	)
	b := unconnectedBackend(t)
	h, r, add := testHub(t, b)
	k, k2, sub, other := add("k"), add("k"), add("k/sub"), add("lock/a:b/c")
	all := []*subscription{k, k2, sub, other}

	for _, tc := range []struct {
		name   string
		events []*clientv3.Event
		want   map[*subscription][]backend.EventType
	}{
		{"acquisition", []*clientv3.Event{ev(put, "p/k", 10)},
			map[*subscription][]backend.EventType{k: {backend.EventChanged}, k2: {backend.EventChanged}}},
		{"heartbeat records", []*clientv3.Event{ev(put, "p/k/heartbeat/a", 11), ev(del, "p/k/heartbeat/b", 12), ev(put, "p/k/sub/heartbeat/a\x00x", 13)},
			nil},
		{"keys nobody watches", []*clientv3.Event{ev(put, "p/j", 14), ev(del, "p/k/other", 15), ev(put, "p/k\x01", 16), ev(put, "q/k", 17)},
			nil},
		{"release: deletion and marker in one revision", []*clientv3.Event{ev(del, "p/k", 18), ev(put, "p/k\x00", 18)},
			map[*subscription][]backend.EventType{k: {backend.EventReleased}, k2: {backend.EventReleased}}},
		{"marker written first in the transaction", []*clientv3.Event{ev(put, "p/k/sub\x00", 19), ev(del, "p/k/sub\x00hx/t", 19)},
			map[*subscription][]backend.EventType{sub: {backend.EventReleased}}},
		{"expiry: deletion with a lease mark's", []*clientv3.Event{ev(del, "p/\x00lease/694d", 20), ev(del, "p/k/sub", 20), ev(put, "p/k/sub\x00", 21)},
			map[*subscription][]backend.EventType{sub: {backend.EventExpired}}},
		{"another key's marker in the same revision as a lease mark's deletion", []*clientv3.Event{ev(del, "p/k", 22), ev(put, "p/k/sub\x00", 22), ev(del, "p/\x00lease/1", 22)},
			map[*subscription][]backend.EventType{k: {backend.EventExpired}, k2: {backend.EventExpired}}},
		{"release on a session: a deletion alone", []*clientv3.Event{ev(del, "p/k", 27), ev(del, "p/\x00lease/1", 28)},
			map[*subscription][]backend.EventType{k: {backend.EventReleased}, k2: {backend.EventReleased}}},
		{"the marker wins over a lease mark's deletion", []*clientv3.Event{ev(del, "p/\x00lease/1", 29), ev(del, "p/k/sub\x00hx/t", 29), ev(put, "p/k/sub\x00", 29)},
			map[*subscription][]backend.EventType{sub: {backend.EventReleased}}},
		{"a lease mark under another prefix", []*clientv3.Event{ev(del, "q/\x00lease/1", 30), ev(del, "p/k", 30), ev(del, "p/k/sub/\x00lease/1", 30)},
			map[*subscription][]backend.EventType{k: {backend.EventReleased}, k2: {backend.EventReleased}}},
		{"entries", []*clientv3.Event{ev(put, "p/lock/a:b/c\x00hs/00000003/00000001", 23), ev(put, "p/lock/a:b/c\x00ix/t", 23)},
			map[*subscription][]backend.EventType{other: {backend.EventChanged, backend.EventChanged}}},
		{"waiters: only their withdrawal", []*clientv3.Event{ev(put, "p/k\x00wx/1", 24), ev(put, "p/k\x00ws/2", 25), ev(del, "p/k\x00wx/1", 26)},
			map[*subscription][]backend.EventType{k: {backend.EventChanged}, k2: {backend.EventChanged}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.dispatch(r, clientv3.WatchResponse{Events: tc.events})
			for _, s := range all {
				if got := received(s); !slices.Equal(got, tc.want[s]) {
					t.Errorf("subscription of %q: got %v, want %v", s.key, got, tc.want[s])
				}
			}
		})
	}
	if r.rev != 30 {
		t.Errorf("revision dispatched: got %d, want 30", r.rev)
	}
}

// TestSlowSubscriptionHoldsUpNobody: a subscription whose receiver is
// behind neither blocks the dispatch nor keeps other subscriptions from
// their events; its buffered events still tell it to look, and a reset that
// does not fit closes its channel (which the receiver treats as a reset)
// instead of being dropped, while the others get the reset.
func TestSlowSubscriptionHoldsUpNobody(t *testing.T) {
	b := unconnectedBackend(t)
	h, r, add := testHub(t, b)
	slow, fast, other := add("k"), add("k"), add("j")
	for len(slow.out) < cap(slow.out) {
		slow.out <- backend.Event{Key: "k", Type: backend.EventChanged}
	}
	h.dispatch(r, clientv3.WatchResponse{Events: []*clientv3.Event{ev(mvccpb.PUT, "p/k", 5)}})
	if got := received(fast); !slices.Equal(got, []backend.EventType{backend.EventChanged}) {
		t.Errorf("fast subscription: got %v, want [changed]", got)
	}
	if n := len(slow.out); n != watchBuffer {
		t.Errorf("slow subscription: got %d buffered events, want %d", n, watchBuffer)
	}

	h.resetAll(r)
	for _, s := range []*subscription{fast, other} {
		if got := received(s); !slices.Equal(got, []backend.EventType{backend.EventReset}) {
			t.Errorf("subscription of %q: got %v, want [reset]", s.key, got)
		}
	}
	if got := len(received(slow)); got != watchBuffer {
		t.Errorf("slow subscription: got %d events before its channel closed, want the %d buffered", got, watchBuffer)
	}
	if _, ok := <-slow.out; ok {
		t.Fatal("slow subscription: channel open after a reset that did not fit, want it closed")
	}
	h.mu.Lock()
	n, subs := h.n, len(h.subs["k"])
	h.mu.Unlock()
	if n != 2 || subs != 1 {
		t.Errorf("after closing the slow subscription: got %d subscriptions (%d of k), want 2 (1 of k)", n, subs)
	}
}

// TestDrainResetsOnReconnection: when the client's connection is back after
// a break (the etcd client resumes its watch silently), every subscription
// gets a reset; when the etcd watch breaks, drain says so.
func TestDrainResetsOnReconnection(t *testing.T) {
	b := unconnectedBackend(t)
	h, r, add := testHub(t, b)
	a, c := add("a"), add("c")
	ch := make(chan clientv3.WatchResponse)
	reset := b.resetSignal()
	b.signalReset()
	done := make(chan int)
	go func() { done <- h.drain(r, stream{ch: ch, cancel: func() {}}, &reset) }()
	for _, s := range []*subscription{a, c} {
		select {
		case e := <-s.out:
			if e.Type != backend.EventReset {
				t.Fatalf("subscription of %q: got %v, want %v", s.key, e.Type, backend.EventReset)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("subscription of %q: no reset within 10s", s.key)
		}
	}
	close(ch) // the etcd watch breaks
	if why := <-done; why != broken {
		t.Fatalf("drain: got %d, want broken (%d)", why, broken)
	}
}

// TestLastSubscriptionStopsTheRun: the run serving a hub is cancelled with
// its last subscription, and a run nobody listens to dispatches nothing.
func TestLastSubscriptionStopsTheRun(t *testing.T) {
	b := unconnectedBackend(t)
	h, r, add := testHub(t, b)
	s1, s2 := add("k"), add("k")
	h.unsubscribe(s1)
	if r.ctx.Err() != nil {
		t.Fatal("run cancelled with a subscription left")
	}
	h.unsubscribe(s2)
	if r.ctx.Err() == nil {
		t.Fatal("run still going after its last subscription ended")
	}
	h.unsubscribe(s2) // a second time: nothing
	s3 := add("k")
	h.dispatch(r, clientv3.WatchResponse{Events: []*clientv3.Event{ev(mvccpb.PUT, "p/k", 5)}})
	if got := received(s3); len(got) != 0 {
		t.Errorf("event dispatched by a stopped run: got %v, want none", got)
	}
}

// TestSweepForgetsUnusedKeys: the backend's local state about keys stays
// bounded: expired heartbeat leases and old held-key hints are dropped,
// while live ones and entries in use stay.
func TestSweepForgetsUnusedKeys(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	b, err := New(cli, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	now := time.Now()
	expired := &hbEntry{lease: 1, ttl: 5, expires: now.Add(-time.Second)}
	live := &hbEntry{lease: 2, ttl: 5, expires: now.Add(time.Second)}
	busy := &hbEntry{lease: 3, ttl: 5, expires: now.Add(-time.Second)}
	busy.mu.Lock() // a Heartbeat in progress
	b.hb["expired"], b.hb["live"], b.hb["busy"] = expired, live, busy
	b.held["old"], b.held["recent"] = now.Add(-2*sweepInterval), now

	b.mu.Lock()
	b.sweepLocked(now)
	b.mu.Unlock()
	busy.mu.Unlock()

	if _, ok := b.hb["expired"]; ok || !expired.dropped {
		t.Errorf("expired heartbeat entry: kept (dropped=%v), want it dropped", expired.dropped)
	}
	for _, k := range []string{"live", "busy"} {
		if e, ok := b.hb[k]; !ok || e.dropped {
			t.Errorf("%s heartbeat entry: got dropped, want it kept", k)
		}
	}
	if _, ok := b.held["old"]; ok {
		t.Error("old held-key hint: kept, want it dropped")
	}
	if !b.seenHeld("recent") {
		t.Error("recent held-key hint: dropped, want it kept")
	}
}

// TestDispatchDropsOtherRecordsWithoutAllocating: heartbeat records, keys
// nobody watches and waiter registrations come through the shared watch
// too; dropping them costs a map look-up and no allocation.
func TestDispatchDropsOtherRecordsWithoutAllocating(t *testing.T) {
	b := unconnectedBackend(t)
	h, r, add := testHub(t, b)
	s := add("k")
	resp := clientv3.WatchResponse{Events: []*clientv3.Event{
		ev(mvccpb.PUT, "p/k/heartbeat/a", 1),
		ev(mvccpb.DELETE, "p/k/heartbeat/b", 2),
		ev(mvccpb.PUT, "p/j", 3),
		ev(mvccpb.PUT, "p/k\x00wx/1", 4),
	}}
	if allocs := testing.AllocsPerRun(100, func() { h.dispatch(r, resp) }); allocs != 0 {
		t.Errorf("allocations per dispatch of records nobody is told about: got %v, want 0", allocs)
	}
	if got := received(s); len(got) != 0 {
		t.Errorf("subscription of k: got %v, want no event", got)
	}
}

// TestEndOfAStoppedRunLeavesTheNextAlone: a run stopped by the end of its
// last subscription finishes after a new subscription may have started
// the next run of the same hub; its end closes none of the new run's
// subscriptions and leaves the new run serving the hub.
func TestEndOfAStoppedRunLeavesTheNextAlone(t *testing.T) {
	b := unconnectedBackend(t)
	h, old, add := testHub(t, b)
	h.unsubscribe(add("k")) // the last subscription of old ends: old stops
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	next := &hubRun{ctx: ctx, cancel: cancel, ended: make(chan struct{}), live: make(chan struct{})}
	h.mu.Lock()
	h.run, h.gone = next, false // a subscription came before the hub was retired
	h.mu.Unlock()
	s := add("k")

	h.end(old, backend.ErrClosed)
	select {
	case _, ok := <-s.out:
		if !ok {
			t.Fatal("subscription of the next run: closed by the end of the stopped one")
		}
		t.Fatal("subscription of the next run: got an event, want none")
	default:
	}
	h.mu.Lock()
	run, n := h.run, h.n
	h.mu.Unlock()
	if run != next || n != 1 {
		t.Errorf("after the end of the stopped run: got run %p with %d subscriptions, want the next run %p with 1", run, n, next)
	}
	if next.ctx.Err() != nil {
		t.Error("the next run was cancelled by the end of the stopped one")
	}
}
