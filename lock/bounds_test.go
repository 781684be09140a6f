package lock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

type valueKey struct{}

// valueSpy wraps a memory client and records the value under valueKey of
// the contexts its Acquire and Release calls get, and their deadlines.
type valueSpy struct {
	*memorybackend.Backend
	mu        sync.Mutex // guards the fields below
	values    []any
	deadlines []time.Duration // deadline - time of the call
}

func (s *valueSpy) record(ctx context.Context) {
	d, _ := ctx.Deadline()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.values = append(s.values, ctx.Value(valueKey{}))
	s.deadlines = append(s.deadlines, time.Until(d))
}

func (s *valueSpy) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	s.record(ctx)
	return s.Backend.Acquire(ctx, req)
}

func (s *valueSpy) Release(ctx context.Context, l backend.Lease) error {
	s.record(ctx)
	return s.Backend.Release(ctx, l)
}

// TryAcquire and Release given a context that is never cancelled (here one
// with a value) bound their store call by RequestTimeout, give at least
// 15/16 of it, and pass the context's values on to the backend; on a hung
// store each returns within RequestTimeout.
func TestNeverCancelledContextBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		spy := &valueSpy{Backend: client(t, store)}
		o := fastOpts() // RequestTimeout 200ms
		l := newLocker(t, spy, "a", o)
		ctx := context.WithValue(context.Background(), valueKey{}, "v")
		for range 3 {
			lk, err := l.TryAcquire(ctx, "k", nil)
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			if err := lk.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		const timeout = 200 * time.Millisecond
		for i, v := range spy.values {
			if v != "v" {
				t.Errorf("call %d: the backend saw value %v, want v", i, v)
			}
			if d := spy.deadlines[i]; d > timeout || d < timeout*15/16 {
				t.Errorf("call %d: deadline %v after the call, want between %v and %v", i, d, timeout*15/16, timeout)
			}
		}

		spy.Hang()
		start := time.Now()
		if _, err := l.TryAcquire(ctx, "k", nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("TryAcquire on a hung store: got %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d > timeout || d < timeout*15/16 {
			t.Errorf("TryAcquire on a hung store returned after %v, want between %v and %v", d, timeout*15/16, timeout)
		}
		spy.Heal()
		lk, err := l.TryAcquire(ctx, "k", nil)
		if err != nil {
			t.Fatalf("TryAcquire: %v", err)
		}
		spy.Hang()
		start = time.Now()
		if err := lk.Release(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Release on a hung store: got %v, want DeadlineExceeded", err)
		}
		if d := time.Since(start); d > timeout || d < timeout*15/16 {
			t.Errorf("Release on a hung store returned after %v, want between %v and %v", d, timeout*15/16, timeout)
		}
		spy.Heal()
		// The release is retried in the background: the key comes free.
		if err := l.WaitFree(t.Context(), "k"); err != nil {
			t.Errorf("WaitFree after a failed release: %v", err)
		}
	})
}

// gatedAcquires wraps a memory client: Acquire waits for gate, ignoring
// its context, then acquires without it (a reply already on its way).
type gatedAcquires struct {
	*memorybackend.Backend
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedAcquires) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	close(g.entered)
	<-g.gate
	return g.Backend.Acquire(context.Background(), req)
}

// A TryAcquire whose store call succeeds after Close began returns
// ErrClosed and releases what it acquired; Close waits for it.
func TestCloseDuringAcquisition(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func(t *testing.T) context.Context
	}{
		{"context never cancelled", func(*testing.T) context.Context { return context.Background() }},
		{"cancellable context", func(t *testing.T) context.Context { return t.Context() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				g := &gatedAcquires{Backend: client(t, store), entered: make(chan struct{}), gate: make(chan struct{})}
				l, err := lock.New(g, "a", fastOpts())
				if err != nil {
					t.Fatal(err)
				}
				got := make(chan error, 1)
				go func() {
					_, err := l.TryAcquire(tc.ctx(t), "k", nil)
					got <- err
				}()
				<-g.entered
				closed := make(chan struct{})
				go func() {
					defer close(closed)
					l.Close()
				}()
				synctest.Wait()
				select {
				case <-closed:
					t.Fatal("Close returned while a TryAcquire was in flight")
				default:
				}
				close(g.gate)
				if err := <-got; !errors.Is(err, lock.ErrClosed) {
					t.Errorf("TryAcquire that succeeded at the store after Close began: got %v, want ErrClosed", err)
				}
				<-closed
				recs, err := client(t, store).List(t.Context(), "")
				if err != nil {
					t.Fatal(err)
				}
				if len(recs) != 0 {
					t.Errorf("after Close: %d locks held, want 0 (the late acquisition released)", len(recs))
				}
			})
		})
	}
}
