package redisbackend_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// errCut is what a cutHook's client gets once cut.
var errCut = errors.New("test: client cut off from the server")

// cutHook cuts a client off from the server (every command and dial fails)
// once cut is set, and can hold back one of the client's EVALSHAs until the
// test lets it go.
type cutHook struct {
	cut              atomic.Bool
	mu               sync.Mutex
	skip             int // EVALSHAs to let through before the one held
	entered, proceed chan struct{}
}

// holdScript makes the EVALSHA after the next skip ones close entered when
// it is about to be sent, then wait for proceed to close.
func (h *cutHook) holdScript(skip int) (entered, proceed chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.skip = skip
	h.entered, h.proceed = make(chan struct{}), make(chan struct{})
	return h.entered, h.proceed
}

func (h *cutHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.cut.Load() {
			return nil, errCut
		}
		return next(ctx, network, addr)
	}
}

func (h *cutHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.cut.Load() {
			cmd.SetErr(errCut)
			return errCut
		}
		if cmd.Name() == "evalsha" {
			h.mu.Lock()
			var entered, proceed chan struct{}
			if h.entered != nil && h.skip == 0 {
				entered, proceed = h.entered, h.proceed
				h.entered, h.proceed = nil, nil
			}
			h.skip--
			h.mu.Unlock()
			if entered != nil {
				close(entered)
				<-proceed
			}
		}
		return next(ctx, cmd)
	}
}

func (h *cutHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.cut.Load() {
			for _, c := range cmds {
				c.SetErr(errCut)
			}
			return errCut
		}
		return next(ctx, cmds)
	}
}

// TestLockAcquisitionInFlightAcrossRestart, on a real redis-server without
// persistence: a waiter's attempt is on its way when the server restarts;
// go-redis sends it on a pooled connection that the restart broke, and
// retries it on a new one, where the empty server finds the key free. The
// holder is cut off, so nothing tells it that its lock is gone: it holds it
// until its renew deadline. The waiter's watch broke with the connection,
// so it gives that acquisition up and takes the lock only a TTL after the
// restart, never alongside the holder (before, it took it at once).
// A Fair waiter (through backend.Modes) does the same.
func TestLockAcquisitionInFlightAcrossRestart(t *testing.T) {
	for name, o := range map[string]*lock.AcquireOptions{"exclusive": nil, "fair": {Fair: true}} {
		t.Run(name, func(t *testing.T) { lockAcquisitionInFlightAcrossRestart(t, o) })
	}
}

func lockAcquisitionInFlightAcrossRestart(t *testing.T, o *lock.AcquireOptions) {
	srv := testredis.Start(t) // no persistence
	newLocker := func(id string, h *cutHook, o *redisbackend.Options) *lock.Locker {
		rdb := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
		rdb.AddHook(h)
		b, err := redisbackend.New(rdb, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		l, err := lock.New(b, id, &lock.Options{TTL: electorTTL, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	ha, hb := &cutHook{}, &cutHook{}
	// The holder publishes nothing (PubSubOff): a waiter that hears of its
	// renewals makes no attempt while they come, and the test needs the
	// waiter's look at the end of the TTL it read.
	a, b := newLocker("a", ha, &redisbackend.Options{PubSub: redisbackend.PubSubOff}), newLocker("b", hb, nil)
	ctx := context.Background()
	la, err := a.TryAcquire(ctx, "job", o)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		at  time.Time
		err error
	}
	// The waiter's first attempt finds the key held; its next is held back.
	entered, proceed := hb.holdScript(1)
	got := make(chan result, 1)
	go func() {
		lb, err := b.Acquire(ctx, "job", o)
		got <- result{time.Now(), err}
		if err == nil {
			_ = lb.Release(ctx)
		}
	}()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the waiter made no attempt within 5 s")
	}
	ha.cut.Store(true)
	restart := time.Now()
	srv.Restart(t) // SIGTERM, start again: every key is gone
	up := time.Now()
	close(proceed)
	var r result
	select {
	case r = <-got:
	case <-time.After(electorTTL + 10*time.Second):
		t.Fatal("the waiter did not acquire within TTL + 10 s of the restart")
	}
	if r.err != nil {
		t.Fatalf("waiter: %v", r.err)
	}
	if took := r.at.Sub(up); took < electorTTL {
		t.Errorf("the waiter acquired %v after the server was up again (%v after the restart began), want no acquisition of the free key before a TTL (%v): the cut holder held it until its deadline",
			took, r.at.Sub(restart), electorTTL)
	}
	if la.Held() {
		t.Errorf("the cut holder still holds the lock after the waiter acquired it")
	}
}
