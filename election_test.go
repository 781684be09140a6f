package sovereign_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

func TestOneLeaderAndTransitions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3, fastOpts())
		c.start(t)
		li := c.leader(t, time.Second)
		synctest.Wait()
		if got := c.es[li].Term(); got != 1 {
			t.Errorf("leader term = %d, want 1", got)
		}
		if got := c.es[li].State(); got != sovereign.Leader {
			t.Errorf("leader state = %v, want leader", got)
		}
		for i, e := range c.es {
			if i == li {
				continue
			}
			if got := e.State(); got != sovereign.Follower {
				t.Errorf("%s state = %v, want follower", e.ID(), got)
			}
			if got := e.Term(); got != 0 {
				t.Errorf("%s Term() = %d, want 0 for a follower", e.ID(), got)
			}
		}
		rec, err := c.es[0].Leader(t.Context())
		if err != nil || rec.HolderID != c.es[li].ID() || rec.Term != 1 {
			t.Errorf("Leader() = %+v, %v; want holder %s term 1", rec, err, c.es[li].ID())
		}
		// The leader's own events, in order.
		var kinds []string
		for _, s := range c.rec.Events() {
			if s.ID != c.es[li].ID() {
				continue
			}
			switch ev := s.Event.(type) {
			case sovereign.StateChanged:
				kinds = append(kinds, ev.From.String()+">"+ev.To.String())
			case sovereign.LeadershipAcquired:
				kinds = append(kinds, "acquired")
			case sovereign.LeaderChanged:
				kinds = append(kinds, "leader="+ev.Leader.HolderID)
			default:
				kinds = append(kinds, "other")
			}
		}
		want := []string{"follower>candidate", "candidate>leader", "acquired", "leader=" + c.es[li].ID()}
		if len(kinds) != len(want) {
			t.Fatalf("leader events = %v, want %v", kinds, want)
		}
		for i := range want {
			if kinds[i] != want[i] {
				t.Fatalf("leader events = %v, want %v", kinds, want)
			}
		}
	})
}

// Each elector's leadership events come in order, in pairs of one term:
// StateChanged to Leader, LeadershipAcquired{T}, later StateChanged from
// Leader, LeadershipLost{T}; an elector that never led publishes no loss
// (client-go #1187: OnStoppedLeading for a process that never led).
func TestLeadershipEventsPairedInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, fastOpts())
		c.start(t)
		li := c.leader(t, time.Second)
		fi := 1 - li
		time.Sleep(100 * time.Millisecond)
		c.es[fi].Close() // a follower that never led
		if err := c.es[li].Resign(t.Context()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		c.leader(t, time.Second) // the same one again, after its sit-out
		c.es[li].Close()
		synctest.Wait()
		for i, e := range c.es {
			var got []string
			for _, s := range c.rec.Events() {
				if s.ID != e.ID() {
					continue
				}
				switch ev := s.Event.(type) {
				case sovereign.StateChanged:
					if ev.From == sovereign.Leader || ev.To == sovereign.Leader {
						got = append(got, ev.From.String()+">"+ev.To.String())
					}
				case sovereign.LeadershipAcquired:
					got = append(got, fmt.Sprintf("acquired %d", ev.Term))
				case sovereign.LeadershipLost:
					got = append(got, fmt.Sprintf("lost %d", ev.Term))
				}
			}
			var want []string
			if i == li {
				want = []string{"candidate>leader", "acquired 1", "leader>follower", "lost 1",
					"candidate>leader", "acquired 2", "leader>follower", "lost 2"}
			}
			if !slices.Equal(got, want) {
				t.Errorf("%s leadership events: got %q, want %q", e.ID(), got, want)
			}
		}
	})
}

func TestLeaderKeepsLeadingAndCallsAreFew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, &sovereign.Options{Logger: quiet}) // defaults: TTL 10s, renew every 5s, heartbeat every 5s
		c.start(t)
		li := c.leader(t, 2*time.Second)
		fi := 1 - li
		time.Sleep(30 * time.Second) // steady state
		synctest.Wait()
		before := []map[string]int64{c.clients[0].Calls(), c.clients[1].Calls()}
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := c.es[li].Term(); got != 1 {
			t.Fatalf("after a minute the leader's term is %d, want 1 (still leading)", got)
		}
		calls := func(i int) int64 {
			var n int64
			for op, v := range c.clients[i].Calls() {
				n += v - before[i][op]
			}
			return n
		}
		// Leader: 12 renewals + 12 heartbeats a minute; follower: 12
		// heartbeats and, since its watch reports every expiry, no
		// polling (one look every 10 TTLs at most).
		if got := calls(li); got < 23 || got > 25 {
			t.Errorf("idle leader made %d calls in a minute, want 23..25", got)
		}
		if got := calls(fi); got < 12 || got > 13 {
			t.Errorf("idle follower made %d calls in a minute, want 12..13", got)
		}
		t.Logf("calls per minute: leader %d %v, follower %d %v", calls(li), c.clients[li].Calls(), calls(fi), c.clients[fi].Calls())
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

func TestPartitionedLeaderStepsDownBeforeAnotherLeads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		c := newCluster(t, 3, o)
		c.start(t)
		li := c.leader(t, time.Second)
		old := c.es[li]
		time.Sleep(3 * time.Second) // lead a while
		c.clients[li].Partition()
		partitioned := time.Now()
		// The leader must step down within RenewDeadline of its last
		// successful renewal (at most one RenewInterval before the
		// partition), and before the TTL could expire at the store.
		for old.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		stepped := time.Now()
		if d := stepped.Sub(partitioned); d > 700*time.Millisecond {
			t.Errorf("leader stepped down %v after the partition, want <= RenewDeadline (700ms)", d)
		}
		ni := c.leader(t, 2*time.Second)
		if ni == li {
			t.Fatalf("partitioned %s leads again", old.ID())
		}
		synctest.Wait()
		ivs := c.rec.Intervals()
		electortest.CheckNoOverlap(t, ivs)
		last := ivs[len(ivs)-1]
		if last.Start.Sub(stepped) < 300*time.Millisecond-time.Millisecond {
			t.Errorf("new leader acquired %v after the old stepped down, want >= TTL-RenewDeadline (the old lease must expire first)", last.Start.Sub(stepped))
		}
		t.Logf("virtual time: step-down %v after the partition, failover %v (TTL 1s)", stepped.Sub(partitioned), last.Start.Sub(partitioned))
		if failover := last.Start.Sub(partitioned); failover > time.Second+50*time.Millisecond {
			t.Errorf("failover took %v, want <= TTL + 50ms", failover)
		}
		if ivs[0].Reason != sovereign.ReasonDeadline {
			t.Errorf("old leader's loss reason = %v, want %v", ivs[0].Reason, sovereign.ReasonDeadline)
		}
		if last.Term <= ivs[0].Term {
			t.Errorf("new term %d, want > %d", last.Term, ivs[0].Term)
		}
		// Heal: the old leader rejoins as a follower, still one leader.
		c.clients[li].Heal()
		time.Sleep(5 * time.Second)
		if ls := electortest.Leaders(c.es...); len(ls) != 1 || ls[0] != c.es[ni] {
			t.Errorf("after heal, leaders = %d, want only %s", len(ls), c.es[ni].ID())
		}
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

// stuckRenew blocks Renew, ignoring its context, until released: the
// elector's goroutines make no progress, as in a paused process.
func TestPausedLeaderIsNotLeaderAfterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		h := &hooked{Backend: mem}
		e, err := sovereign.New(h, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var (
			leaderCtx context.Context
			once      sync.Once
		)
		acquired := make(chan struct{})
		release := make(chan struct{})
		go e.Run(t.Context(), func(ctx context.Context) error {
			once.Do(func() { leaderCtx = ctx; close(acquired) })
			select {
			case <-ctx.Done():
			case <-release: // the test is over: a context never cancelled fails it, not hangs it
			}
			return nil
		})
		<-acquired
		var stuckAt time.Time
		h.set(func(h *hooked) {
			h.onRenew = func(ctx context.Context, l backend.Lease) (error, bool) {
				stuckAt = time.Now()
				<-release // ignores ctx: the loop goroutine is stuck here
				return nil, false
			}
			// The whole process is paused: it cannot campaign again either
			// (its release after stepping down frees the key, and a new
			// term at the same instant as the checks below would race them).
			h.onAcquire = func(context.Context, backend.AcquireRequest) { <-release }
			// Nor can its loop step down: its next heartbeat (due 500ms
			// after the first) hangs too, so only the clock checks of
			// IsLeader, Term, State and Status stand between a caller and
			// a stale answer.
			h.onHB = func(context.Context) (error, bool) { <-release; return nil, false }
		})
		time.Sleep(400 * time.Millisecond)
		if !e.IsLeader() {
			t.Fatal("not leader before the deadline")
		}
		time.Sleep(500 * time.Millisecond) // past the 700ms deadline
		synctest.Wait()
		if e.IsLeader() {
			t.Errorf("IsLeader() = true %v after the last renewal was sent, past RenewDeadline", time.Since(stuckAt))
		}
		if got := e.Term(); got != 0 {
			t.Errorf("Term() = %d past the deadline, want 0", got)
		}
		if got := e.State(); got != sovereign.Follower {
			t.Errorf("State() = %v past the deadline, want follower", got)
		}
		if st := e.Status(); st.State != sovereign.Follower || st.Term != 0 || !st.Deadline.IsZero() {
			t.Errorf("Status() past the deadline: got state %v, term %d, deadline %v; want follower, 0, zero", st.State, st.Term, st.Deadline)
		}
		if leaderCtx.Err() == nil {
			t.Error("leader context not cancelled past the deadline while the loop is stuck")
		}
		if cause := context.Cause(leaderCtx); !errors.Is(cause, sovereign.ErrLeadershipLost) {
			t.Errorf("leader context cause = %v, want ErrLeadershipLost", cause)
		}
		close(release)
	})
}

func TestResignHandsOverAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3, fastOpts())
		c.start(t)
		li := c.leader(t, time.Second)
		synctest.Wait()
		before := time.Now()
		if err := c.es[li].Resign(t.Context()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		synctest.Wait() // let the watch wake the followers
		ni := c.leader(t, time.Second)
		if ni == li {
			t.Fatal("the resigned elector leads again")
		}
		if d := time.Since(before); d > 0 {
			t.Errorf("hand-over took %v of virtual time, want 0 (woken by the watch, not a timer)", d)
		}
		ivs := c.rec.Intervals()
		electortest.CheckNoOverlap(t, ivs)
		if ivs[0].Reason != sovereign.ReasonResigned {
			t.Errorf("reason = %v, want resigned", ivs[0].Reason)
		}
		if err := c.es[li].Resign(t.Context()); !errors.Is(err, sovereign.ErrNotLeader) {
			t.Errorf("Resign by a follower = %v, want ErrNotLeader", err)
		}
	})
}

// A resigned elector sitting out learns its successor from the successor's
// acquisition event, with one read of the store; seeing its own release it
// knows that nobody leads and reads nothing (that read would tell nothing
// and load the store just as the successor acquires).
func TestSittingOutReadsOnlyAfterAcquisition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		var gets [2]atomic.Int32
		es := make([]*sovereign.Elector, 2)
		for i := range es {
			cl := store.Client()
			h := &hooked{Backend: cl}
			h.onGet = func(context.Context, string) (backend.Record, error, bool) {
				gets[i].Add(1)
				return backend.Record{}, nil, false
			}
			e, err := sovereign.New(h, "election", "n"+string(rune('1'+i)), fastOpts())
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			t.Cleanup(func() {
				e.Close()
				cl.Close()
			})
			if err := e.Start(t.Context()); err != nil {
				t.Fatalf("Start: %v", err)
			}
			es[i] = e
		}
		var ls []*sovereign.Elector
		for len(ls) != 1 {
			time.Sleep(time.Millisecond)
			ls = electortest.Leaders(es...)
		}
		li := 0
		if ls[0] == es[1] {
			li = 1
		}
		ni := 1 - li
		synctest.Wait()
		var mu sync.Mutex
		var known []string // the leaders the resigned elector learns of
		unsubscribe := es[li].Subscribe(func(ev sovereign.Event) {
			if lc, ok := ev.(sovereign.LeaderChanged); ok {
				mu.Lock()
				known = append(known, lc.Leader.HolderID)
				mu.Unlock()
			}
		})
		defer unsubscribe()
		before := gets[li].Load()
		if err := es[li].Resign(t.Context()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		synctest.Wait() // the successor acquires; the resigned elector sees both events
		if !es[ni].IsLeader() {
			t.Fatal("the other elector does not lead after the Resign")
		}
		if got := gets[li].Load() - before; got != 1 {
			t.Errorf("the resigned elector read the store %d times during the hand-over, want 1 (after the successor's acquisition)", got)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(known) == 0 || known[len(known)-1] != es[ni].ID() {
			t.Errorf("leaders the resigned elector learned of: %q, want the last to be %q", known, es[ni].ID())
		}
	})
}

// stuckMembers is a memory client whose Members calls hang until their
// context ends.
type stuckMembers struct {
	*memorybackend.Backend
}

func (s stuckMembers) Members(ctx context.Context, key string) ([]backend.Member, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// Resign releases on its caller's goroutine: a leader whose loop goroutine
// is busy with a call of its own (here the look at stale heartbeat records
// it makes on becoming leader, which hangs until its request timeout) still
// hands over at once.
func TestResignDoesNotWaitForTheLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		rec := &electortest.Recorder{}
		var es []*sovereign.Elector
		for i, id := range []string{"n1", "n2"} {
			cl := store.Client()
			var b backend.Backend = cl
			if i == 0 {
				b = stuckMembers{cl}
			}
			e, err := sovereign.New(b, "election", id, fastOpts())
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			rec.Attach(e)
			t.Cleanup(func() {
				e.Close()
				cl.Close()
			})
			es = append(es, e)
		}
		if err := es[0].Start(t.Context()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		synctest.Wait() // n1 leads, and its loop waits for Members
		if !es[0].IsLeader() {
			t.Fatal("n1 does not lead")
		}
		if err := es[1].Start(t.Context()); err != nil {
			t.Fatalf("Start: %v", err)
		}
		synctest.Wait() // n2 follows, watching
		before := time.Now()
		if err := es[0].Resign(t.Context()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		if d := time.Since(before); d > 0 {
			t.Errorf("Resign took %v of virtual time, want 0 (not waiting for the loop's call to time out)", d)
		}
		if es[0].IsLeader() {
			t.Error("n1 still leads after Resign returned")
		}
		synctest.Wait()
		if !es[1].IsLeader() {
			t.Errorf("n2 does not lead after n1 resigned (virtual time since Resign: %v)", time.Since(before))
		}
		ivs := rec.Intervals()
		electortest.CheckNoOverlap(t, ivs)
		if len(ivs) < 1 || ivs[0].ID != "n1" || ivs[0].Reason != sovereign.ReasonResigned {
			t.Errorf("first term: %+v, want n1's, ended as resigned", ivs)
		}
	})
}

// A Resign whose context ends while the leader function still runs returns
// the context's error; the lease stays held (and renewed) until the function
// returns, and is released then.
func TestResignContextEndsBeforeFnReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, fastOpts())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		finish := make(chan struct{})
		var first atomic.Bool
		for _, e := range c.es {
			go e.Run(ctx, func(lctx context.Context) error {
				linger := first.CompareAndSwap(false, true)
				<-lctx.Done()
				if linger {
					<-finish
				}
				return nil
			})
		}
		li := c.leader(t, time.Second)
		fi := 1 - li
		rctx, rcancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer rcancel()
		if err := c.es[li].Resign(rctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Resign = %v, want context.DeadlineExceeded (the leader function still runs)", err)
		}
		if c.es[li].IsLeader() {
			t.Error("the resigned elector still leads")
		}
		time.Sleep(3 * time.Second) // three TTLs: the lease is renewed while fn runs
		synctest.Wait()
		if c.es[fi].IsLeader() {
			t.Fatal("the other elector leads while the resigned one's leader function still runs")
		}
		close(finish)
		synctest.Wait()
		if !c.es[fi].IsLeader() {
			t.Error("the other elector does not lead once the leader function has returned")
		}
		ivs := c.rec.Intervals()
		electortest.CheckNoOverlap(t, ivs)
		if ivs[0].Reason != sovereign.ReasonResigned {
			t.Errorf("reason = %v, want resigned", ivs[0].Reason)
		}
		cancel()
		synctest.Wait()
	})
}

// A Resign called with a context that has already ended steps down and
// returns the context's error; the loop then releases the lease, so another
// elector takes over at once.
func TestResignWithEndedContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, fastOpts())
		c.start(t)
		li := c.leader(t, time.Second)
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		before := time.Now()
		if err := c.es[li].Resign(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Resign = %v, want context.Canceled", err)
		}
		if c.es[li].IsLeader() {
			t.Error("the resigned elector still leads")
		}
		synctest.Wait()
		if ni := 1 - li; !c.es[ni].IsLeader() {
			t.Errorf("the other elector does not lead after the Resign (virtual time since: %v)", time.Since(before))
		}
		if d := time.Since(before); d > 0 {
			t.Errorf("hand-over took %v of virtual time, want 0", d)
		}
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

func TestRunReleasesOnlyAfterFnReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, fastOpts())
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		const linger = 3 * time.Second // fn's clean-up after cancellation, longer than the TTL
		var running atomic.Int32
		var overlap atomic.Bool
		calls := make([]atomic.Int32, 2)
		for i, e := range c.es {
			go e.Run(ctx, func(lctx context.Context) error {
				calls[i].Add(1)
				if running.Add(1) > 1 {
					overlap.Store(true)
				}
				defer running.Add(-1)
				<-lctx.Done()
				time.Sleep(linger)
				return nil
			})
		}
		li := c.leader(t, time.Second)
		fi := 1 - li
		if err := c.es[li].Resign(t.Context()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		if overlap.Load() {
			t.Fatal("two leader functions ran at once")
		}
		synctest.Wait()
		if got := calls[fi].Load(); got != 1 {
			t.Fatalf("follower fn called %d times after the hand-over, want 1", got)
		}
		// Resign returned after the linger: the lease was renewed meanwhile.
		synctest.Wait()
		if overlap.Load() {
			t.Error("two leader functions ran at once")
		}
		cancel()
		synctest.Wait()
	})
}

func TestRunKeepsCampaigningAfterLostTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		var terms []uint64
		termsCh := make(chan uint64, 10)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() {
			done <- e.Run(ctx, func(lctx context.Context) error {
				term, _ := sovereign.TermFromContext(lctx)
				termsCh <- term
				<-lctx.Done()
				return nil
			})
		}()
		terms = append(terms, <-termsCh)
		mem.Partition()
		time.Sleep(3 * time.Second) // an outage longer than the TTL
		mem.Heal()
		terms = append(terms, <-termsCh)
		if terms[1] <= terms[0] {
			t.Errorf("terms %v, want strictly increasing", terms)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil after ctx ends", err)
		}
		if err := e.Start(t.Context()); !errors.Is(err, sovereign.ErrClosed) {
			t.Errorf("Start after Run ended = %v, want ErrClosed", err)
		}
	})
}

func TestCloseDuringFnWaitsThenReleases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		mem, obs := store.Client(), store.Client()
		defer mem.Close()
		defer obs.Close()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		inFn := make(chan struct{})
		var returned atomic.Bool
		go e.Run(t.Context(), func(ctx context.Context) error {
			close(inFn)
			<-ctx.Done()
			time.Sleep(2 * time.Second)
			returned.Store(true)
			return nil
		})
		<-inFn
		closed := make(chan struct{})
		go func() { e.Close(); close(closed) }()
		time.Sleep(time.Second)
		synctest.Wait()
		if r, err := obs.Get(t.Context(), "election"); err != nil || r.HolderID != "a" {
			t.Errorf("while fn winds down: Get = %+v, %v; want still held by a (renewed)", r, err)
		}
		<-closed
		if !returned.Load() {
			t.Error("Close returned before the leader function")
		}
		if _, err := obs.Get(t.Context(), "election"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("after Close: Get err = %v, want ErrNotHeld (released)", err)
		}
		if err := e.Close(); err != nil {
			t.Errorf("second Close = %v, want nil", err)
		}
		if err := e.Resign(t.Context()); !errors.Is(err, sovereign.ErrClosed) {
			t.Errorf("Resign after Close = %v, want ErrClosed", err)
		}
	})
}

func TestCloseDuringCampaignWithHungBackend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		mem.Hang()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		start := time.Now()
		e.Close()
		if d := time.Since(start); d > e.Options().RequestTimeout {
			t.Errorf("Close took %v with a hung backend, want <= RequestTimeout", d)
		}
		if e.IsLeader() {
			t.Error("leader with a hung backend")
		}
	})
}

// An acquisition whose reply never comes (a request lost on a dead
// connection) is cut at RequestTimeout, and the candidate tries again:
// a hung call never stalls the campaign (kubernetes #65090).
func TestAcquisitionWithoutReplyCutAtRequestTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		h := &hooked{Backend: mem}
		var (
			calls int
			cut   time.Duration
		)
		start := time.Now()
		h.set(func(h *hooked) {
			h.onAcquire = func(ctx context.Context, _ backend.AcquireRequest) {
				if calls++; calls == 1 {
					<-ctx.Done() // no reply: only the caller's bound ends the call
					cut = time.Since(start)
				}
			}
		})
		e, err := sovereign.New(h, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		for !e.IsLeader() && time.Since(start) < 2*time.Second {
			time.Sleep(time.Millisecond)
		}
		if !e.IsLeader() {
			t.Fatalf("not leader %v after the start: the acquisition without a reply was never cut", time.Since(start))
		}
		if rt := e.Options().RequestTimeout; cut != rt {
			t.Errorf("acquisition without a reply cut after %v, want RequestTimeout (%v)", cut, rt)
		}
		if d := time.Since(start); d > 300*time.Millisecond {
			t.Errorf("leader %v after the start, want <= RequestTimeout + a retry (300ms)", d)
		}
	})
}

func TestBackendDownAtStartIsSurvived(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		mem.Partition()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var failures atomic.Int32
		e.Subscribe(func(ev sovereign.Event) {
			if f, ok := ev.(sovereign.ElectionFailed); ok && errors.Is(f.Err, memorybackend.ErrPartitioned) {
				failures.Add(1)
			}
		})
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if e.IsLeader() {
			t.Fatal("leader while the backend is down")
		}
		n := failures.Load()
		if n == 0 {
			t.Fatal("no ElectionFailed event while the backend is down")
		}
		if n > 200 {
			t.Errorf("%d failures in 10s: the retry does not back off", n)
		}
		mem.Heal()
		time.Sleep(time.Second)
		if !e.IsLeader() {
			t.Error("not leader one second after the backend came back")
		}
	})
}

// TestStartedTwice: Start and Run on an elector that already runs return
// ErrStarted at once.
func TestStartedTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatalf("first Start = %v, want nil", err)
		}
		if err := e.Start(t.Context()); !errors.Is(err, sovereign.ErrStarted) {
			t.Errorf("second Start = %v, want ErrStarted", err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute) // bounds a Run that would campaign
		defer cancel()
		if err := e.Run(ctx, func(context.Context) error { return nil }); !errors.Is(err, sovereign.ErrStarted) {
			t.Errorf("Run after Start = %v, want ErrStarted", err)
		}
	})
}
