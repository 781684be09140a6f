package etcdbackend

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/sovereign-go/sovereign/backend"
)

// TestResetThatDoesNotFitEndsTheWatch: a reset must reach the receiver, so
// when the channel is full the watch ends (and Watch's goroutine closes the
// channel, which the receiver treats as a reset) instead of dropping it.
// When there is room, the reset is delivered and the watch goes on.
func TestResetThatDoesNotFitEndsTheWatch(t *testing.T) {
	// The client never connects: drain only reads the stream given to it.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	// A reset first reads the store's revision, which fails here: fast.
	b, err := New(cli, &Options{RequestTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	w := &watch{b: b, key: "k", ctx: t.Context()}

	t.Run("room", func(t *testing.T) {
		out := make(chan backend.Event, watchBuffer)
		ch := make(chan clientv3.WatchResponse)
		reset := b.resetSignal()
		b.signalReset()
		done := make(chan int)
		go func() { done <- w.drain(stream{ch: ch, cancel: func() {}}, &reset, out) }()
		if e := <-out; e.Type != backend.EventReset {
			t.Fatalf("got %v, want %v", e.Type, backend.EventReset)
		}
		close(ch) // the etcd watch breaks
		if why := <-done; why != broken {
			t.Fatalf("drain: got %d, want broken (%d)", why, broken)
		}
	})
	t.Run("full", func(t *testing.T) {
		out := make(chan backend.Event, watchBuffer)
		for len(out) < cap(out) {
			out <- backend.Event{Key: "k", Type: backend.EventChanged}
		}
		ch := make(chan clientv3.WatchResponse)
		reset := b.resetSignal()
		b.signalReset()
		if why := w.drain(stream{ch: ch, cancel: func() {}}, &reset, out); why != overflowed {
			t.Fatalf("drain with a full channel: got %d, want overflowed (%d)", why, overflowed)
		}
	})
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
