package redisbackend_test

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// TestWatchReturnsAfterConfirmation: Watch returns only once the server has
// confirmed the subscription, so an Acquire that starts after Watch
// returned is delivered, even when the watcher's link to the server is
// slow: its writes reach the server 300 ms after they were made, so a
// Watch that returned once SUBSCRIBE was written would let the Acquire's
// PUBLISH, from another client, reach the server before the SUBSCRIBE (a
// waiter that subscribes and then tries would miss the release it waits
// for).
func TestWatchReturnsAfterConfirmation(t *testing.T) {
	srv := testredis.Start(t)
	ctx := ctxBound(t)
	const delay = 300 * time.Millisecond
	slow := srv.NewClient(t, &redis.Options{Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newSlowConn(c, delay), nil
	}})
	watcher := newBackend(t, slow, nil)
	actor := newBackend(t, srv.NewClient(t, nil), nil)
	start := time.Now()
	ch, err := watcher.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	t.Logf("Watch returned after %v", time.Since(start).Round(time.Millisecond))
	if _, err := actor.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got := next(t, ch); got.Type != backend.EventChanged || got.Key != "k" {
		t.Fatalf("event after an Acquire that started after Watch returned: got %+v, want changed on k", got)
	}
}

// slowConn is a link whose writes reach the other end after a delay, in
// order: Write returns at once, as on a network with a long latency.
type slowConn struct {
	net.Conn
	delay time.Duration
	q     chan slowChunk
	done  chan struct{}
	once  sync.Once
}

type slowChunk struct {
	b  []byte
	at time.Time
}

func newSlowConn(c net.Conn, delay time.Duration) *slowConn {
	s := &slowConn{Conn: c, delay: delay, q: make(chan slowChunk, 1024), done: make(chan struct{})}
	go s.pump()
	return s
}

func (s *slowConn) pump() {
	for {
		select {
		case c := <-s.q:
			timer := time.NewTimer(time.Until(c.at)) // the link's latency
			select {
			case <-timer.C:
			case <-s.done:
				timer.Stop()
				return
			}
			if _, err := s.Conn.Write(c.b); err != nil {
				return
			}
		case <-s.done:
			return
		}
	}
}

func (s *slowConn) Write(b []byte) (int, error) {
	select {
	case s.q <- slowChunk{b: append([]byte(nil), b...), at: time.Now().Add(s.delay)}:
		return len(b), nil
	case <-s.done:
		return 0, net.ErrClosed
	}
}

func (s *slowConn) Close() error {
	s.once.Do(func() { close(s.done) })
	return s.Conn.Close()
}

// TestPubSubOff: with PubSubOff, Watch fails with an error wrapping
// errors.ErrUnsupported, and no operation publishes: a subscriber of the
// key's channel sees nothing of an Acquire, a Release, an entry's
// acquisition and release, or a CancelWait of a live registration; the
// first message it gets is the one of a later Acquire through a backend
// that publishes.
func TestPubSubOff(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	ctx := ctxBound(t)
	off := newBackend(t, c, &redisbackend.Options{PubSub: redisbackend.PubSubOff})
	if _, err := off.Watch(ctx, "lock/k"); !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Watch with PubSubOff: got %v, want an error wrapping errors.ErrUnsupported", err)
	}
	sub := c.Subscribe(ctx, "sovereign:{lock/k}{}:events")
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	l, err := off.Acquire(ctx, backend.AcquireRequest{Key: "lock/k", HolderID: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := off.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	e, err := off.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "lock/k", HolderID: "a", TTL: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := off.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "lock/k", HolderID: "w", TTL: time.Minute},
		Fair: true, WaitID: "wait-w"}); !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("AcquireMode of a held key: got %v, want ErrHeld", err)
	}
	if err := off.CancelWait(ctx, "lock/k", "wait-w"); err != nil {
		t.Fatal(err)
	}
	if err := off.Release(ctx, e); err != nil {
		t.Fatal(err)
	}
	on := newBackend(t, c, nil)
	marker, err := on.Acquire(ctx, backend.AcquireRequest{Key: "lock/k", HolderID: "b", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	m, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := "acquired:" + strconv.FormatUint(marker.Term, 10); m.Payload != want {
		t.Errorf("first message on the channel: got %q, want %q (nothing from the backend with PubSubOff)", m.Payload, want)
	}
}
