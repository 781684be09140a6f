package sovereign_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// The errors of calls made out of turn, as the method docs promise: Resign
// before Start is ErrNotLeader; Run without a function is ErrInvalidOptions;
// Start or Run of an elector that already runs is ErrStarted, and leaves the
// running one alone.
func TestCallsOutOfTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cl := memorybackend.NewStore().Client()
		defer cl.Close()
		e, err := sovereign.New(cl, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Resign(t.Context()); !errors.Is(err, sovereign.ErrNotLeader) {
			t.Errorf("Resign before Start: got %v, want ErrNotLeader", err)
		}
		// Bounded, so that a Run that accepts the nil function returns.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := e.Run(ctx, nil); !errors.Is(err, sovereign.ErrInvalidOptions) {
			t.Fatalf("Run with a nil function: got %v, want ErrInvalidOptions", err)
		}
		if err := e.Start(t.Context()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := e.Start(t.Context()); !errors.Is(err, sovereign.ErrStarted) {
			t.Errorf("second Start: got %v, want ErrStarted", err)
		}
		called := make(chan struct{}, 1)
		if err := e.Run(t.Context(), func(context.Context) error { called <- struct{}{}; return nil }); !errors.Is(err, sovereign.ErrStarted) {
			t.Errorf("Run after Start: got %v, want ErrStarted", err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !e.IsLeader() {
			t.Error("the started elector does not lead after the refused calls")
		}
		select {
		case <-called:
			t.Error("the function of a refused Run was called")
		default:
		}
	})
}

// An elector whose attempts fail (the store is down from the start) knows
// of no leader and keeps trying: it is a candidate once its startup jitter
// is over, not a follower, and after Close a follower again. An elector
// that ran removes its heartbeat record when closed.
func TestStateOfACandidateAndAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ca, cb, raw := store.Client(), store.Client(), store.Client()
		defer ca.Close()
		defer cb.Close()
		defer raw.Close()
		ca.Partition()
		a, err := sovereign.New(ca, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := sovereign.New(cb, "election", "b", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if got := a.State(); got != sovereign.Follower {
			t.Errorf("State before Start: got %v, want follower", got)
		}
		for _, e := range []*sovereign.Elector{a, b} {
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := a.State(); got != sovereign.Candidate {
			t.Errorf("State while every attempt fails: got %v, want candidate", got)
		}
		a.Close()
		if got := a.State(); got != sovereign.Follower {
			t.Errorf("State of the candidate after Close: got %v, want follower", got)
		}
		members := func() []string {
			ms, err := raw.Members(t.Context(), "election")
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range ms {
				ids = append(ids, m.ID)
			}
			return ids
		}
		if got := members(); !slices.Equal(got, []string{"b"}) {
			t.Fatalf("Members while b runs: got %q, want [b]", got)
		}
		b.Close()
		if got := members(); len(got) != 0 {
			t.Errorf("Members after Close: got %q, want none (b's heartbeat record removed)", got)
		}
	})
}

// slowWatch is a memory client whose subscriptions are established only
// when their context ends, and take a while more to return (a client
// tearing its connection down).
type slowWatch struct {
	*memorybackend.Backend
	returned atomic.Bool
}

func (s *slowWatch) WatchNotify(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	<-ctx.Done()
	time.Sleep(50 * time.Millisecond)
	s.returned.Store(true)
	return nil, ctx.Err()
}

// Close returns once every goroutine the elector started has ended,
// including one still establishing the subscription to the key.
func TestCloseWaitsForTheSubscription(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &slowWatch{Backend: memorybackend.NewStore().Client()}
		defer s.Close()
		e, err := sovereign.New(s, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		waitLeader(t, e, time.Second)
		e.Close()
		if !s.returned.Load() {
			t.Error("Close returned while the subscription's establishment still ran")
		}
	})
}

// A Resign whose context ends before the elector took the request (here it
// is busy with an attempt) returns the context's error, and the request is
// withdrawn: it never ends the term that attempt then begins.
func TestWithdrawnResignIsNeverActedOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		h := &hooked{Backend: mem}
		var first atomic.Bool
		inAttempt := make(chan struct{})
		h.onAcquire = func(ctx context.Context, _ backend.AcquireRequest) {
			if first.Swap(true) {
				return
			}
			close(inAttempt)
			select { // a slow store
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		e, err := sovereign.New(h, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var rec events
		rec.attach(e)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		<-inAttempt
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		defer cancel()
		if err := e.Resign(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Resign while the first attempt is in flight: got %v, want context.DeadlineExceeded", err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if !e.IsLeader() || e.Term() != 1 {
			t.Errorf("after the withdrawn Resign: got IsLeader %v, term %d; want still leading term 1", e.IsLeader(), e.Term())
		}
		if l, _, ok := rec.lost(); ok {
			t.Errorf("term %d lost (%v): the withdrawn Resign was acted on", l.Term, l.Reason)
		}
	})
}

// lateReply completes an acquisition at the store, then ends the Run's
// context before the reply is seen: all replicas stopped at once, the
// request already sent.
type lateReply struct {
	backend.Backend
	stop func()
}

func (l *lateReply) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	lease, err := l.Backend.Acquire(context.WithoutCancel(ctx), req)
	l.stop()
	return lease, err
}

// Get answers the verification regardless of the context, as a store that
// confirms an acquisition in its reply does.
func (l *lateReply) Get(ctx context.Context, key string) (backend.Record, error) {
	return l.Backend.Get(context.WithoutCancel(ctx), key)
}

// An acquisition whose reply comes after Run's context ended never starts
// the leader function, and is released at once rather than left to expire.
func TestAcquisitionCompletedAfterTheEndIsGivenBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		mem, obs := store.Client(), store.Client()
		defer mem.Close()
		defer obs.Close()
		ctx, cancel := context.WithCancel(t.Context())
		e, err := sovereign.New(&lateReply{Backend: mem, stop: cancel}, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		var called atomic.Bool
		if err := e.Run(ctx, func(context.Context) error {
			called.Store(true)
			return nil
		}); err != nil {
			t.Fatalf("Run = %v, want nil once ctx ends", err)
		}
		if called.Load() {
			t.Error("the leader function ran for an acquisition that completed after ctx ended")
		}
		if _, err := obs.Get(t.Context(), "election"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("after Run: Get err = %v, want ErrNotHeld (given back at once, not left to its TTL)", err)
		}
	})
}
