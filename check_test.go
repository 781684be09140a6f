package sovereign_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// Check reports the backend unreachable only when it has not answered any
// call of the elector for three TTLs while the elector runs: heartbeats and
// attempts count as answers, the time before the first answer counts from
// Start, and a closed elector is not checked. A leader function that
// returned promptly in an earlier term is not held against the next one.
func TestCheckCountsEveryAnswer(t *testing.T) {
	t.Run("follower kept healthy by its heartbeats", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCluster(t, 2, fastOpts()) // a watching follower looks at the key every 10 TTLs
			c.start(t)
			li := c.leader(t, time.Second)
			time.Sleep(35 * time.Second) // its last look at the key was 5s ago
			synctest.Wait()
			if err := c.es[1-li].Check(time.Second); err != nil {
				t.Errorf("Check of a follower whose heartbeats succeed: got %v, want nil", err)
			}
		})
	})
	t.Run("attempts answer while heartbeats fail", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			raw := store.Client()
			defer raw.Close()
			if _, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			cl := store.Client()
			defer cl.Close()
			h := &hooked{Backend: cl, onHB: func(context.Context) (error, bool) { return errors.New("test: heartbeat refused"), true }}
			e, err := sovereign.New(noWatch{h}, "election", "a", fastOpts()) // looks at the key every TTL
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Second)
			if err := e.Check(time.Second); err != nil {
				t.Errorf("Check of a follower whose attempts are answered: got %v, want nil", err)
			}
		})
	})
	t.Run("down from the start", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cl := memorybackend.NewStore().Client()
			defer cl.Close()
			cl.Partition()
			e, err := sovereign.New(cl, "election", "a", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second)
			if err := e.Check(time.Second); err != nil {
				t.Errorf("Check 2s after Start with the backend down (TTL 1s): got %v, want nil (limit 3 TTLs)", err)
			}
			time.Sleep(2 * time.Second)
			if err := e.Check(time.Second); !errors.Is(err, sovereign.ErrUnhealthy) {
				t.Errorf("Check 4s after Start with the backend down: got %v, want ErrUnhealthy", err)
			}
		})
	})
	t.Run("closed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cl := memorybackend.NewStore().Client()
			defer cl.Close()
			e, err := sovereign.New(cl, "election", "a", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			waitLeader(t, e, time.Second)
			e.Close()
			time.Sleep(5 * time.Second)
			if err := e.Check(time.Second); err != nil {
				t.Errorf("Check 5s after Close: got %v, want nil (a closed elector makes no calls)", err)
			}
		})
	})
	t.Run("next term", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cl := memorybackend.NewStore().Client()
			defer cl.Close()
			e, err := sovereign.New(cl, "election", "a", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			var terms atomic.Int32
			go func() {
				defer close(done)
				_ = e.Run(ctx, func(lctx context.Context) error {
					terms.Add(1)
					<-lctx.Done()
					time.Sleep(100 * time.Millisecond) // winds down within the tolerance
					return nil
				})
			}()
			waitLeader(t, e, time.Second)
			if err := e.Resign(t.Context()); err != nil {
				t.Fatal(err)
			}
			waitLeader(t, e, 2*time.Second) // after the sit-out
			time.Sleep(time.Second)
			if n := terms.Load(); n != 2 {
				t.Fatalf("leader function called %d times, want 2", n)
			}
			if err := e.Check(500 * time.Millisecond); err != nil {
				t.Errorf("Check in the second term: got %v, want nil (the first term's function returned within the tolerance)", err)
			}
			cancel()
			<-done
		})
	})
}
