package lock_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) {
	redis.SetLogger(quietRedis{}) // go-redis logs failed dials
	goleak.VerifyTestMain(m)
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

var quiet = slog.New(slog.DiscardHandler)

// fastOpts: TTL 1s, renew deadline 700ms, renew interval 200ms (set: the
// default would be 500ms; these tests count on 200ms), request timeout
// 200ms.
func fastOpts() *lock.Options {
	return &lock.Options{TTL: time.Second, RenewInterval: 200 * time.Millisecond, Logger: quiet}
}

// newLocker returns a Locker closed at the end of the test (inside the
// synctest bubble when called from one).
func newLocker(t *testing.T, b backend.Backend, id string, o *lock.Options) *lock.Locker {
	t.Helper()
	l, err := lock.New(b, id, o)
	if err != nil {
		t.Fatalf("New: got error %v, want nil", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// client returns a client of store closed at the end of the test.
func client(t *testing.T, store *memorybackend.Store) *memorybackend.Backend {
	c := store.Client()
	t.Cleanup(func() { c.Close() })
	return c
}

// spy wraps a memory client: it counts Acquire calls in flight (and their
// maximum), and can run a hook after an Acquire that found the key held.
type spy struct {
	*memorybackend.Backend
	inflight, maxInflight atomic.Int64
	mu                    sync.Mutex // guards afterHeld
	afterHeld             func()     // run once, after the first Acquire that returns ErrHeld
	minTTL                time.Duration
	rejectKey             string
}

func (s *spy) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	n := s.inflight.Add(1)
	for {
		m := s.maxInflight.Load()
		if n <= m || s.maxInflight.CompareAndSwap(m, n) {
			break
		}
	}
	lease, err := s.Backend.Acquire(ctx, req)
	s.inflight.Add(-1)
	s.mu.Lock()
	hook := s.afterHeld
	if err != nil && hook != nil {
		s.afterHeld = nil
	} else {
		hook = nil
	}
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	return lease, err
}

func (s *spy) MinTTL() time.Duration {
	if s.minTTL > 0 {
		return s.minTTL
	}
	return s.Backend.MinTTL()
}

func (s *spy) ValidateKey(key string) error {
	if s.rejectKey != "" && key == s.rejectKey {
		return backend.ErrInvalid
	}
	return s.Backend.ValidateKey(key)
}

// acquireAsync starts l.Acquire(ctx, key, opts) in a goroutine; the channel
// delivers the lock (nil on error), the error and when the call returned.
func acquireAsync(ctx context.Context, l *lock.Locker, key string, opts *lock.AcquireOptions) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lk, err := l.Acquire(ctx, key, opts)
		ch <- acquired{lk, err, time.Now()}
	}()
	return ch
}

type acquired struct {
	lk  *lock.Lock
	err error
	at  time.Time
}
