package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// lateReply completes an acquisition at the store, then ends the caller's
// context before the reply is seen: the caller gave up while the reply was
// on its way.
type lateReply struct {
	*memorybackend.Backend
	stop func()
}

func (l *lateReply) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	lease, err := l.Backend.Acquire(context.WithoutCancel(ctx), req)
	l.stop()
	return lease, err
}

// Do and TryDo whose context ended while the acquisition's reply was on
// its way do not call fn: they give the lock back at once, MinHold
// notwithstanding (fn never ran), and return the context's error.
func TestDoAfterTheCallerGaveUp(t *testing.T) {
	for _, try := range []bool{false, true} {
		name := map[bool]string{false: "Do", true: "TryDo"}[try]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				mem, obs := client(t, store), client(t, store)
				ctx, cancel := context.WithCancel(t.Context())
				l := newLocker(t, &lateReply{Backend: mem, stop: cancel}, "a", fastOpts())
				var called atomic.Bool
				fn := func(context.Context, *lock.Lock) error { called.Store(true); return nil }
				var err error
				if try {
					err = l.TryDo(ctx, "job", &lock.AcquireOptions{MinHold: time.Minute}, fn)
				} else {
					err = l.Do(ctx, "job", &lock.AcquireOptions{MinHold: time.Minute}, fn)
				}
				if !errors.Is(err, context.Canceled) {
					t.Errorf("%s = %v, want context.Canceled", name, err)
				}
				if called.Load() {
					t.Errorf("%s called fn after its context ended", name)
				}
				if _, err := obs.Get(t.Context(), backend.LockKeyPrefix+"job"); !errors.Is(err, backend.ErrNotHeld) {
					t.Errorf("after %s: Get err = %v, want ErrNotHeld (given back at once, not left to its TTL)", name, err)
				}
			})
		})
	}
}
