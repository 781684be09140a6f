package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// Redis times key expiry by its wall clock, so a step of the server's clock
// forward by more than a lease's remaining TTL ends the lease at once, with
// no event, while its holder is well inside its renew deadline. The
// waiters hear of every renewal (backend.RenewalWatcher) and do not take
// the key before the last renewal's TTL is up by their own clocks; the
// holder's next renewal finds its lease gone and it stops (a leader takes
// the key again at once). These tests step a real redis-server's clock
// (testredis.Config.SteppableClock) at random moments of the renewal cycle,
// with a RenewInterval that does not divide the TTL: without the renewal
// events, a waiter whose look, timed by the TTL it last read, came after a
// step and before the holder's next renewal took the key while the holder
// still held it (every run of either test failed).

// clockStepRenew is the RenewInterval of these tests: at TTL 1 s, renewals
// at 0.4, 0.8, 1.2 s, so the waiters' looks (a TTL after the renewal they
// read) do not come just after a renewal.
const clockStepRenew = 400 * time.Millisecond

// TestElectorServerClockStepsForward: three replicas; the server's clock is
// stepped forward by two TTLs, eight times. No two may lead at once, and
// terms must keep increasing.
func TestElectorServerClockStepsForward(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{SteppableClock: true})
	rec := &electortest.Recorder{}
	var es []*sovereign.Elector
	for _, id := range []string{"r1", "r2", "r3"} {
		rdb := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
		b, err := redisbackend.New(rdb, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		e, err := sovereign.New(b, "daemon", id, &sovereign.Options{TTL: electorTTL, RenewInterval: clockStepRenew, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		rec.Campaign(t, e)
		es = append(es, e)
	}
	electortest.Eventually(t, "a leader", func() bool { return len(electortest.Leaders(es...)) == 1 })
	for range 8 {
		time.Sleep(electorTTL + rand.N(electorTTL)) // the fault's timing, not synchronisation
		srv.StepClock(t, 2*electorTTL)
	}
	time.Sleep(2 * electorTTL) // the last step's aftermath
	for _, e := range es {
		_ = e.Close()
	}
	ivs := rec.Intervals()
	t.Logf("terms: %v", ivs)
	electortest.CheckNoOverlap(t, ivs)
	slices.SortFunc(ivs, func(a, b electortest.Interval) int { return a.Start.Compare(b.Start) })
	for i := 1; i < len(ivs); i++ {
		if ivs[i].Term <= ivs[i-1].Term {
			t.Errorf("term %d of %s began after term %d of %s: want a higher term", ivs[i].Term, ivs[i].ID, ivs[i-1].Term, ivs[i-1].ID)
		}
	}
}

// TestLockServerClockStepsForward: two Lockers take turns at one lock with
// Do, each holding it for about a TTL, while the server's clock is stepped
// forward by two TTLs, twelve times. A lock whose lease the step ended is
// lost (its function's context is cancelled at its next renewal); the
// other Locker, waiting in Do, must not get the lock before that.
func TestLockServerClockStepsForward(t *testing.T) {
	srv := testredis.StartConfig(t, testredis.Config{SteppableClock: true})
	type hold struct {
		id         string
		term       uint64
		start, end time.Time // fn entered; the lock's context done or fn returned
	}
	var (
		mu    sync.Mutex
		holds []hold
	)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, id := range []string{"a", "b"} {
		rdb := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
		b, err := redisbackend.New(rdb, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		l, err := lock.New(b, id, &lock.Options{TTL: electorTTL, RenewInterval: clockStepRenew, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		wg.Go(func() {
			for ctx.Err() == nil {
				err := l.Do(ctx, "job", nil, func(fctx context.Context, lk *lock.Lock) error {
					h := hold{id: id, term: lk.Term(), start: time.Now()}
					select {
					case <-fctx.Done():
					case <-time.After(electorTTL/2 + rand.N(electorTTL)): // holding, not synchronisation
					}
					h.end = time.Now()
					mu.Lock()
					holds = append(holds, h)
					mu.Unlock()
					return nil
				})
				if err != nil && ctx.Err() == nil && !errors.Is(err, lock.ErrLockLost) {
					t.Errorf("%s: Do: %v", id, err)
				}
			}
		})
	}
	for range 12 {
		time.Sleep(electorTTL + rand.N(electorTTL)) // the fault's timing, not synchronisation
		srv.StepClock(t, 2*electorTTL)
	}
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(holds, func(a, b hold) int { return a.start.Compare(b.start) })
	if len(holds) < 8 {
		t.Errorf("%d holds in 12 to 24 s, want at least 8", len(holds))
	}
	for i := 1; i < len(holds); i++ {
		p, h := holds[i-1], holds[i]
		if h.start.Before(p.end) {
			t.Errorf("%s held the lock (term %d) from %s while %s still held it (term %d, until %s): overlap %v",
				h.id, h.term, h.start.Format("15:04:05.000"), p.id, p.term, p.end.Format("15:04:05.000"), p.end.Sub(h.start))
		}
		if h.term <= p.term {
			t.Errorf("term %d of %s after term %d of %s: want a higher term", h.term, h.id, p.term, p.id)
		}
	}
}

// acquireCounter counts a client's acquisition scripts (EVALSHA or EVAL
// with two keys, the second the term counter), sent alone or in a
// pipeline; its cutHook can cut the client off from the server.
type acquireCounter struct {
	cutHook
	n atomic.Int64
}

func (h *acquireCounter) count(cmd redis.Cmder) {
	args := cmd.Args()
	if name := cmd.Name(); (name == "evalsha" || name == "eval") && len(args) >= 5 && fmt.Sprint(args[2]) == "2" &&
		strings.HasSuffix(fmt.Sprint(args[4]), ":term") {
		h.n.Add(1)
	}
}

func (h *acquireCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return h.cutHook.ProcessHook(func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	})
}

func (h *acquireCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return h.cutHook.ProcessPipelineHook(func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			h.count(c)
		}
		return next(ctx, cmds)
	})
}

// TestFollowerHearsRenewals: a follower that hears of the leader's
// renewals makes no attempt while they come (it used to look once a TTL),
// and takes over once they stop: a TTL after the last one, not sooner.
func TestFollowerHearsRenewals(t *testing.T) {
	srv := testredis.Start(t)
	newElector := func(id string, h *acquireCounter) *sovereign.Elector {
		rdb := srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
		rdb.AddHook(h)
		b, err := redisbackend.New(rdb, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		e, err := sovereign.New(b, "daemon", id, &sovereign.Options{TTL: electorTTL, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	ha, hb := &acquireCounter{}, &acquireCounter{}
	rec := &electortest.Recorder{}
	a := newElector("a", ha)
	rec.Campaign(t, a)
	electortest.Eventually(t, "a leads", a.IsLeader)
	b := newElector("b", hb)
	rec.Campaign(t, b)
	electortest.Eventually(t, "b's first attempt", func() bool { return hb.n.Load() > 0 })
	before := hb.n.Load()
	time.Sleep(3 * electorTTL) // the window observed, not synchronisation
	// One look may fall in the window: b's watch is established in the
	// background, and when that ends after its first attempt, b looks
	// again (changes may have been missed while it was not subscribed).
	// Without renewal events it would look once a TTL, three times.
	if n := hb.n.Load() - before; n > 1 {
		t.Errorf("the follower made %d acquisition attempts in 3 TTLs while the leader renewed, want at most 1 (the look after its watch is established)", n)
	}
	// The leader is cut off: its renewals stop.
	ha.cut.Store(true)
	cut := time.Now()
	electortest.Eventually(t, "b leads", b.IsLeader)
	// IsLeader may be true before the recorder has b's term.
	var took time.Duration
	electortest.Eventually(t, "b's term recorded", func() bool {
		for _, iv := range rec.Intervals() {
			if iv.ID == "b" {
				took = iv.Start.Sub(cut)
				return true
			}
		}
		return false
	})
	electortest.CheckNoOverlap(t, rec.Intervals())
	// The last renewal came at most RenewInterval (TTL/2) before the cut.
	if took < electorTTL-electorTTL/2 || took > 2*electorTTL {
		t.Errorf("b led %v after the leader was cut off, want between 1/2 TTL and 2 TTLs (a TTL after the last renewal)", took)
	}
	t.Logf("b led %v after the leader was cut off; it made %d attempts in all", took, hb.n.Load())
}
