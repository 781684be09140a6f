package sovereign_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// latency is the one-way delay of every call in the data-loss tests, so that
// the window between a follower's acquisition and the old leader's failed
// renewal has a length to measure.
const latency = 2 * time.Millisecond

// TestRestartWithoutPersistence restarts the store four times, losing every
// lease and heartbeat record (terms kept, as Redis keeps them through its
// server clock). Each restart must cause exactly one new leadership (no
// cascade), no overlap (the followers wait a TTL after their watches
// break before they take a free key; the old leader renews at once and,
// its lease lost, acquires again), and strictly increasing terms.
func TestRestartWithoutPersistence(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d candidates", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, n, fastOpts())
				for _, cl := range c.clients {
					cl.SetLatency(latency)
				}
				c.start(t)
				c.leader(t, 2*time.Second)
				const restarts = 4
				for range restarts {
					time.Sleep(1500 * time.Millisecond)
					c.store.Restart(nil)
					// A leader again within TTL + 1 s of the store being back.
					c.leader(t, 2*time.Second)
				}
				time.Sleep(time.Second)
				synctest.Wait()
				ivs := c.rec.Intervals()
				electortest.CheckNoOverlap(t, ivs)
				if got, want := len(ivs), 1+restarts; got != want {
					t.Errorf("leadership terms: got %d, want %d (one first term and one per restart, no cascade): %v", got, want, ivs)
				}
			})
		})
	}
}

// TestRestartWithoutPersistenceLeaderCut: the store restarts without its
// data while the leader cannot reach it (partitioned), so nothing tells the
// leader that its lease is gone: it leads until its renew deadline. The
// followers' watches break and are re-established, and they find the key
// free. A lease the store lost may still be live, and only its TTL ends it,
// so they acquire only a TTL after the reset: no two lead at once, and one
// leads within TTL + 1 s of the restart. After that, with the store's
// lease known again, a hand-over is immediate as before.
func TestRestartWithoutPersistenceLeaderCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		c := newCluster(t, 3, o)
		c.start(t)
		old := c.leader(t, 2*time.Second)
		time.Sleep(500 * time.Millisecond)
		c.clients[old].Partition()
		restart := time.Now()
		c.store.Restart(nil)

		next := -1
		for time.Since(restart) < o.TTL+time.Second {
			time.Sleep(time.Millisecond)
			ls := electortest.Leaders(c.es...)
			if len(ls) > 1 {
				t.Fatalf("%v after the restart: %d lead at once, want at most 1 (the cut leader until its deadline)", time.Since(restart), len(ls))
			}
			if len(ls) == 1 && ls[0] != c.es[old] {
				next = slices.Index(c.es, ls[0])
				break
			}
		}
		if next < 0 {
			t.Fatalf("no new leader within TTL + 1 s of the restart")
		}
		if took := time.Since(restart); took < o.TTL {
			t.Errorf("%s led %v after the restart, want no acquisition of the free key before a TTL (%v) has passed", c.es[next].ID(), took, o.TTL)
		}
		c.clients[old].Heal()
		// The new lease is known to every follower now: a resignation
		// hands over at once.
		time.Sleep(3 * time.Second)
		synctest.Wait()
		c.resignHandsOver(t, next, "after the restart")
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

// resignHandsOver has elector i resign and fails t unless another leads,
// under a higher term, within 100 ms (virtual time).
func (c *cluster) resignHandsOver(t *testing.T, i int, when string) {
	t.Helper()
	term := c.es[i].Term()
	if err := c.es[i].Resign(t.Context()); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	resigned := time.Now()
	for {
		time.Sleep(time.Millisecond)
		if ls := electortest.Leaders(c.es...); len(ls) == 1 && ls[0].Term() > term {
			return
		}
		if time.Since(resigned) > 100*time.Millisecond {
			t.Fatalf("no hand-over within 100 ms of a resignation %s", when)
		}
	}
}

// TestResetWithDataKept: the store restarts with its data (every watch
// breaks, every lease is kept). The followers' watches are re-established,
// and their read finds the lease they knew before: nothing was lost, so
// they do not wait a TTL, and a resignation right after the restart hands
// over at once.
func TestResetWithDataKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		c := newCluster(t, 3, o)
		c.start(t)
		li := c.leader(t, 2*time.Second)
		time.Sleep(500 * time.Millisecond)
		c.store.Restart(&memorybackend.RestartOptions{KeepLeases: true})
		time.Sleep(50 * time.Millisecond) // the watches are back (virtual time)
		synctest.Wait()
		if ls := electortest.Leaders(c.es...); len(ls) != 1 || ls[0] != c.es[li] {
			t.Fatalf("after a restart that kept the data: leaders %v, want %s alone", ls, c.es[li].ID())
		}
		c.resignHandsOver(t, li, "50 ms after a restart that kept the data")
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

// TestSameIDInstanceStopping: two instances configured with the same ID
// share one heartbeat record; when the one that does not lead stops, its
// RemoveMember deletes that record. The leader keeps its lease, and a third
// instance never takes it over.
func TestSameIDInstanceStopping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		rec := &electortest.Recorder{}
		o := fastOpts()
		var es []*sovereign.Elector
		var cls []*memorybackend.Backend
		for _, id := range []string{"twin", "twin", "other"} {
			cl := store.Client()
			e, err := sovereign.New(cl, "election", id, o)
			if err != nil {
				t.Fatal(err)
			}
			rec.Attach(e)
			es, cls = append(es, e), append(cls, cl)
		}
		defer func() {
			for i, e := range es {
				e.Close()
				cls[i].Close()
			}
		}()
		if err := es[0].Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if !es[0].IsLeader() {
			t.Fatal("the first twin does not lead")
		}
		term := es[0].Term()
		for _, e := range es[1:] {
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(3 * time.Second)
		es[1].Close() // removes the twins' shared heartbeat record
		if ms, _ := cls[2].Members(t.Context(), "election"); slices.ContainsFunc(ms, func(m backend.Member) bool { return m.ID == "twin" }) {
			t.Log("the leading twin re-heartbeated before the check; fine")
		}
		for range 20_000 { // 20 s, many heartbeat TTLs
			time.Sleep(time.Millisecond)
			if !es[0].IsLeader() || es[0].Term() != term || es[2].IsLeader() {
				t.Fatalf("after the other twin stopped: leader twin IsLeader %v term %d, other IsLeader %v; want the twin leading term %d throughout",
					es[0].IsLeader(), es[0].Term(), es[2].IsLeader(), term)
			}
		}
		electortest.CheckNoOverlap(t, rec.Intervals())
	})
}

// TestDeletedHeartbeatRecord: an operator deletes the leader's heartbeat
// record by hand. Nobody takes the lease over, and the leader's next
// heartbeat writes the record again.
func TestDeletedHeartbeatRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3, fastOpts())
		c.start(t)
		li := c.leader(t, 2*time.Second)
		leader := c.es[li]
		term := leader.Term()
		raw := c.store.Client()
		defer raw.Close()
		if err := raw.RemoveMember(context.Background(), "election", leader.ID()); err != nil {
			t.Fatal(err)
		}
		for range 10_000 {
			time.Sleep(time.Millisecond)
			if ls := electortest.Leaders(c.es...); len(ls) != 1 || ls[0] != leader || leader.Term() != term {
				t.Fatalf("after the record was deleted: leaders %d, want %s alone with term %d", len(ls), leader.ID(), term)
			}
		}
		ms, err := raw.Members(context.Background(), "election")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(ms, func(m backend.Member) bool { return m.ID == leader.ID() }) {
			t.Errorf("members %v: want the leader's record written again by its next heartbeat", ms)
		}
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

// The leader context's cause is ErrLeadershipLost for every way a term ends,
// Close and the end of Run's context included, and the LeadershipLost
// event's reason is the one that came first.
func TestLeaderContextCauseOnClose(t *testing.T) {
	for _, how := range []string{"Close", "Run's context", "Resign"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				cl := store.Client()
				defer cl.Close()
				e, err := sovereign.New(cl, "election", "a", fastOpts())
				if err != nil {
					t.Fatal(err)
				}
				var lost []sovereign.LeadershipLost
				e.Subscribe(func(ev sovereign.Event) {
					if l, ok := ev.(sovereign.LeadershipLost); ok {
						lost = append(lost, l)
					}
				})
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				causes := make(chan error, 1)
				led := make(chan struct{})
				done := make(chan error, 1)
				go func() {
					done <- e.Run(ctx, func(lctx context.Context) error {
						close(led)
						<-lctx.Done()
						causes <- context.Cause(lctx)
						return nil
					})
				}()
				<-led
				want := sovereign.ReasonClosed
				switch how {
				case "Close":
					e.Close()
				case "Run's context":
					cancel()
				case "Resign":
					want = sovereign.ReasonResigned
					if err := e.Resign(t.Context()); err != nil {
						t.Fatal(err)
					}
					cancel()
				}
				cause := <-causes
				if !errors.Is(cause, sovereign.ErrLeadershipLost) || errors.Is(cause, context.Canceled) {
					t.Errorf("leader context cause: got %v, want ErrLeadershipLost (not context.Canceled)", cause)
				}
				if !strings.Contains(cause.Error(), want.String()) {
					t.Errorf("leader context cause %q: want the reason (%v) in its message", cause, want)
				}
				<-done
				e.Close()
				synctest.Wait()
				if len(lost) != 1 || lost[0].Reason != want {
					t.Errorf("LeadershipLost events: got %+v, want one with reason %v", lost, want)
				}
			})
		})
	}
}

// When the renew deadline has passed and the elector is then closed, the
// reason is the deadline, whatever order the elector notices them in.
func TestLossReasonIsTheFirstCause(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			cl := store.Client()
			defer cl.Close()
			e, err := sovereign.New(cl, "election", "a", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			var lost []sovereign.LeadershipLost
			e.Subscribe(func(ev sovereign.Event) {
				if l, ok := ev.(sovereign.LeadershipLost); ok {
					lost = append(lost, l)
				}
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if err := e.Start(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
			cl.Hang()
			time.Sleep(700 * time.Millisecond) // past the deadline: both ready at once
			cancel()
			cl.Heal()
			e.Close()
			synctest.Wait()
			if len(lost) != 1 || lost[0].Reason != sovereign.ReasonDeadline {
				t.Fatalf("LeadershipLost events: got %+v, want one with reason %v", lost, sovereign.ReasonDeadline)
			}
		})
	}
}

// callLog wraps a backend, hiding every optional interface (no watch: the
// elector polls at the holder's expiry), recording the order of Acquire
// and Get calls, and failing Heartbeat while failHB is set.
type callLog struct {
	backend.Backend
	failHB atomic.Bool
	mu     sync.Mutex
	calls  []string
}

func (c *callLog) note(s string) {
	c.mu.Lock()
	c.calls = append(c.calls, s)
	c.mu.Unlock()
}

func (c *callLog) since(n int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls[n:])
}

func (c *callLog) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	c.note("acquire")
	return c.Backend.Acquire(ctx, req)
}

func (c *callLog) Get(ctx context.Context, key string) (backend.Record, error) {
	c.note("get")
	return c.Backend.Get(ctx, key)
}

var errInjectedHB = errors.New("injected heartbeat failure")

// failHeartbeatOnce fails e's heartbeats through c until e reports one
// failed (ElectionFailed), then lets them through again.
func (c *callLog) failHeartbeatOnce(e *sovereign.Elector) {
	failed := make(chan struct{}, 1)
	unsubscribe := e.Subscribe(func(ev sovereign.Event) {
		if f, ok := ev.(sovereign.ElectionFailed); ok && errors.Is(f.Err, errInjectedHB) {
			select {
			case failed <- struct{}{}:
			default:
			}
		}
	})
	defer unsubscribe()
	c.failHB.Store(true)
	<-failed
	c.failHB.Store(false)
}

func (c *callLog) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	if c.failHB.Load() {
		return errInjectedHB
	}
	return c.Backend.Heartbeat(ctx, key, id, ttl)
}

// leaderAndPoller starts, in the synctest bubble of t, an elector "a" that
// leads and then an elector "b" on a callLog (its heartbeats failing from
// the start when failHB), which follows by polling. Both, and their
// clients, are closed when the test ends.
func leaderAndPoller(t *testing.T, o *sovereign.Options, failHB bool) (a, b *sovereign.Elector, log *callLog) {
	t.Helper()
	store := memorybackend.NewStore()
	ca, cb := store.Client(), store.Client()
	t.Cleanup(func() { ca.Close(); cb.Close() })
	log = &callLog{Backend: cb}
	log.failHB.Store(failHB)
	a = startOn(t, ca, "a", o, nil)
	time.Sleep(100 * time.Millisecond)
	return a, startOn(t, log, "b", o, nil), log
}

// TestHeartbeatFailureStartsTheWait: a follower whose heartbeat failed has
// lost contact with the store as surely as one whose watch broke (on a
// real store its next attempt can reach the store right after a restart,
// before any reset arrives), so its next attempt is a read, not an
// acquisition.
func TestHeartbeatFailureStartsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		ea, eb, b := leaderAndPoller(t, o, false)
		time.Sleep(2 * time.Second) // b polls a's lease
		synctest.Wait()
		if !ea.IsLeader() || eb.IsLeader() {
			t.Fatal("want a leading and b following")
		}
		b.failHeartbeatOnce(eb)
		n := len(b.since(0))
		time.Sleep(2 * o.TTL)
		synctest.Wait()
		calls := b.since(n)
		if len(calls) == 0 || calls[0] != "get" {
			t.Errorf("calls after the heartbeat failed: %v, want a read first, not an acquisition", calls)
		}
	})
}

// TestHeartbeatsFailingForeverDoNotBlock: heartbeats are information. A
// follower whose heartbeats always fail waits once, a TTL after the first
// failure, not after each: when the leader goes, it takes over.
func TestHeartbeatsFailingForeverDoNotBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		ea, eb, _ := leaderAndPoller(t, o, true)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		ea.Close() // releases
		closed := time.Now()
		for !eb.IsLeader() {
			if time.Since(closed) > 3*o.TTL {
				t.Fatalf("b, whose heartbeats always fail, does not lead %v after the leader left", time.Since(closed))
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// gated is a memory client whose next Acquire, or next watch, once armed,
// waits until the test lets it go: a call in flight, as a client retrying
// a command on a new connection keeps one across a restart of the store.
type gated struct {
	*memorybackend.Backend // every optional interface, the watch included
	acquire, watch         gate
}

// gate holds back one call once armed.
type gate struct {
	mu               sync.Mutex
	entered, proceed chan struct{}
}

// arm makes the next call close entered when it begins, then wait for
// proceed to close before it reaches the store.
func (g *gate) arm() (entered, proceed chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.entered, g.proceed = make(chan struct{}), make(chan struct{})
	return g.entered, g.proceed
}

func (g *gate) pass() {
	g.mu.Lock()
	entered, proceed := g.entered, g.proceed
	g.entered, g.proceed = nil, nil
	g.mu.Unlock()
	if entered != nil {
		close(entered)
		<-proceed
	}
}

func (g *gated) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	g.acquire.pass()
	return g.Backend.Acquire(ctx, req)
}

func (g *gated) WatchNotify(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	g.watch.pass()
	return g.Backend.WatchNotify(ctx, key, notify)
}

// leaderAndGated starts, in the synctest bubble of t, an elector "a" on
// client ca of store, which leads, and then an elector "b" on a gated
// client, which follows; both record their terms in rec.
func leaderAndGated(t *testing.T, o *sovereign.Options) (store *memorybackend.Store, ca *memorybackend.Backend, gb *gated, a, b *sovereign.Elector, rec *electortest.Recorder) {
	t.Helper()
	store = memorybackend.NewStore()
	ca, cb := store.Client(), store.Client()
	t.Cleanup(func() { ca.Close(); cb.Close() })
	gb = &gated{Backend: cb}
	rec = &electortest.Recorder{}
	a = startOn(t, ca, "a", o, rec)
	time.Sleep(100 * time.Millisecond)
	b = startOn(t, gb, "b", o, rec)
	time.Sleep(time.Second)
	synctest.Wait()
	if !a.IsLeader() || b.IsLeader() {
		t.Fatal("want a leading and b following")
	}
	return store, ca, gb, a, b, rec
}

// leadsAfterATTL fails t unless b leads within TTL + 1 s of restart, and
// not before a TTL has passed; then, a second later, unless no two terms
// in rec overlapped.
func leadsAfterATTL(t *testing.T, b *sovereign.Elector, o *sovereign.Options, restart time.Time, rec *electortest.Recorder) {
	t.Helper()
	for !b.IsLeader() {
		if time.Since(restart) > o.TTL+time.Second {
			t.Fatal("b does not lead within TTL + 1 s of the restart")
		}
		time.Sleep(time.Millisecond)
	}
	if took := time.Since(restart); took < o.TTL {
		t.Errorf("b led %v after the restart, want no leadership on the free key before a TTL (%v) has passed", took, o.TTL)
	}
	time.Sleep(time.Second)
	synctest.Wait()
	electortest.CheckNoOverlap(t, rec.Intervals())
}

// TestAcquisitionInFlightAcrossRestart: a follower's attempt is in flight
// while the store restarts without its data, and reaches the store after
// the restart, which finds the key free. The leader is cut off, so nothing
// tells it that its lease is gone: it leads until its renew deadline. The
// follower's watch broke while its call was in flight, so it gives the
// acquisition up (released, never led on) and waits a TTL like a follower
// that saw the break before its attempt: no two lead at once, and it leads
// within TTL + 1 s of the restart.
func TestAcquisitionInFlightAcrossRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store, ca, gb, a, b, rec := leaderAndGated(t, o)
		entered, proceed := gb.acquire.arm()
		<-entered // b's next look at the key (virtual time passes)
		if !a.IsLeader() {
			t.Fatal("a no longer leads")
		}
		ca.Partition()
		restart := time.Now()
		store.Restart(nil)
		synctest.Wait()
		close(proceed) // b's acquisition reaches the empty store
		leadsAfterATTL(t, b, o, restart, rec)
	})
}

// TestAttemptWhileWatchDown: the store restarts without its data, the
// follower's watch breaks, and its next attempt falls due before the watch
// is back (no EventReset yet). The broken watch is the sign: that attempt
// reads the key, and the follower takes it only a TTL after the break,
// since the leader, cut off, leads until its deadline.
func TestAttemptWhileWatchDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store, ca, gb, a, b, rec := leaderAndGated(t, o)
		entered, proceed := gb.acquire.arm()
		<-entered // b's look at the key: the next comes quietRecheck TTLs later
		close(proceed)
		time.Sleep(10*o.TTL - 100*time.Millisecond)
		if !a.IsLeader() {
			t.Fatal("a no longer leads")
		}
		wentered, wproceed := gb.watch.arm()
		ca.Partition()
		restart := time.Now()
		store.Restart(nil)
		<-wentered // b watches again: held back until b leads
		leadsAfterATTL(t, b, o, restart, rec)
		close(wproceed)
	})
}

// flaky is a memory client whose heartbeats, acquisitions and reads fail
// every other time (each kind on its own count) once flaky is set: a store
// that times out now and then.
type flaky struct {
	*memorybackend.Backend // every optional interface, the watch included
	on                     atomic.Bool
	hb, acq, get           atomic.Int64
}

var errFlaky = errors.New("injected intermittent failure")

func (f *flaky) fails(n *atomic.Int64) bool { return f.on.Load() && n.Add(1)%2 == 0 }

func (f *flaky) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	if f.fails(&f.hb) {
		return errFlaky
	}
	return f.Backend.Heartbeat(ctx, key, id, ttl)
}

func (f *flaky) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	if f.fails(&f.acq) {
		return backend.Lease{}, errFlaky
	}
	return f.Backend.Acquire(ctx, req)
}

func (f *flaky) Get(ctx context.Context, key string) (backend.Record, error) {
	if f.fails(&f.get) {
		return backend.Record{}, errFlaky
	}
	return f.Backend.Get(ctx, key)
}

// TestIntermittentFailuresDoNotBlock: a follower whose calls to the store
// fail every other time (heartbeats, attempts, reads) waits a TTL after a
// failure, in case the store restarted, but failures during that wait do
// not prolong it (its watch would tell of a restart): when the leader goes,
// it takes over within a few TTLs. Before, each failure started the wait
// again and the follower never led.
func TestIntermittentFailuresDoNotBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store := memorybackend.NewStore()
		ca, cb := store.Client(), store.Client()
		t.Cleanup(func() { ca.Close(); cb.Close() })
		fb := &flaky{Backend: cb}
		a := startOn(t, ca, "a", o, nil)
		time.Sleep(100 * time.Millisecond)
		b := startOn(t, fb, "b", o, nil)
		time.Sleep(time.Second)
		fb.on.Store(true)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if !a.IsLeader() || b.IsLeader() {
			t.Fatal("want a leading and b following")
		}
		a.Close() // releases
		closed := time.Now()
		for !b.IsLeader() {
			if time.Since(closed) > 5*o.TTL {
				t.Fatalf("b, whose calls fail every other time, does not lead %v after the leader left", time.Since(closed))
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// TestPollerFailureProlongsTheWait: a follower that cannot watch has only
// its failed calls to tell it that the store went down. Its wait began
// with a failed heartbeat, and its read found a new leader, c, so it waits
// the TTL out. The store then restarts without its data while c is cut
// off, and the follower's next heartbeat fails: that failure prolongs the
// wait to a TTL after it, so the follower does not take the key the
// restart freed while c still leads. (A follower with a watch is told by
// the watch, and failures do not prolong its wait: see
// TestIntermittentFailuresDoNotBlock.)
func TestPollerFailureProlongsTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store := memorybackend.NewStore()
		ca, cb, cc := store.Client(), store.Client(), store.Client()
		t.Cleanup(func() { ca.Close(); cb.Close(); cc.Close() })
		log := &callLog{Backend: cb}
		rec := &electortest.Recorder{}
		a := startOn(t, ca, "a", o, rec)
		time.Sleep(100 * time.Millisecond)
		b := startOn(t, log, "b", o, rec)
		c := startOn(t, cc, "c", o, rec)
		time.Sleep(2 * time.Second) // b polls a's lease
		synctest.Wait()
		if !a.IsLeader() || b.IsLeader() || c.IsLeader() {
			t.Fatal("want a leading, b and c following")
		}
		n := len(log.since(0))
		log.failHeartbeatOnce(b) // b's wait begins at its next attempt, with a read
		if err := a.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		for !c.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		a.Close() // b is the one to take over from c
		for !slices.Contains(log.since(n), "get") {
			time.Sleep(time.Millisecond)
		}
		// b read c's lease, which it did not know: it waits the TTL out.
		time.Sleep(o.TTL / 4)
		cc.Partition()
		restart := time.Now()
		store.Restart(nil)
		log.failHeartbeatOnce(b) // during the wait
		for time.Since(restart) < o.TTL+time.Second && !b.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		if !b.IsLeader() {
			t.Fatal("b does not lead within TTL + 1 s of the restart")
		}
		if took := time.Since(restart); took < o.TTL {
			t.Errorf("b led %v after the restart, want no leadership on the free key before a TTL (%v) has passed", took, o.TTL)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		electortest.CheckNoOverlap(t, rec.Intervals())
	})
}

// startOn makes and starts an elector of "election" with id on be, closed
// when the test ends; rec, when not nil, records its terms.
func startOn(t *testing.T, be backend.Backend, id string, o *sovereign.Options, rec *electortest.Recorder) *sovereign.Elector {
	t.Helper()
	e, err := sovereign.New(be, "election", id, o)
	if err != nil {
		t.Fatal(err)
	}
	if rec != nil {
		rec.Attach(e)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestRestartWithoutPersistenceSameIDTwin: the leader's twin (an instance
// started with the same ID, as a rolling deploy can leave for a while)
// follows it. The store restarts without its data while the leader is cut
// off; the twin's own ID on the lost lease earns it nothing: it waits a TTL
// like any follower, whether it sees the break before its attempt or while
// an acquisition is in flight.
func TestRestartWithoutPersistenceSameIDTwin(t *testing.T) {
	for _, inflight := range []bool{false, true} {
		t.Run(fmt.Sprintf("in flight %v", inflight), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := fastOpts()
				store := memorybackend.NewStore()
				ca, cb := store.Client(), store.Client()
				t.Cleanup(func() { ca.Close(); cb.Close() })
				g := &gated{Backend: cb}
				rec := &electortest.Recorder{}
				a := startOn(t, ca, "a", o, rec)
				time.Sleep(100 * time.Millisecond)
				twin := startOn(t, g, "a", o, rec)
				time.Sleep(time.Second)
				synctest.Wait()
				if !a.IsLeader() || twin.IsLeader() {
					t.Fatal("want a leading and its twin following")
				}
				var proceed chan struct{}
				if inflight {
					var entered chan struct{}
					entered, proceed = g.acquire.arm()
					<-entered // the twin's next look at the key
				}
				ca.Partition()
				restart := time.Now()
				store.Restart(nil)
				synctest.Wait()
				if proceed != nil {
					close(proceed)
				}
				leadsAfterATTL(t, twin, o, restart, rec)
			})
		})
	}
}
