package sovereign_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// idleGoroutines bounds the goroutines that idle electors may add, however
// many there are: an idle elector (a leader between renewals, a follower
// watching) parks its loop and costs no goroutine; a few may be running
// at the instant of the count (a timer's callback, a resumed loop).
const idleGoroutines = 4

// libraryGoroutines returns the number of goroutines running code of the
// library (package sovereign or a package under it, the tests' own packages
// aside), by their stacks. Unlike runtime.NumGoroutine it does not count
// goroutines of earlier tests that are still ending.
func libraryGoroutines() int {
	return electortest.Goroutines(func(frame string) bool {
		return strings.HasPrefix(frame, "github.com/sovereign-go/sovereign.") ||
			strings.HasPrefix(frame, "github.com/sovereign-go/sovereign/") && !strings.HasPrefix(frame, "github.com/sovereign-go/sovereign_test.")
	})
}

// startPairs starts n elections, each with one elector on a and one on b,
// and returns the electors.
func startPairs(t *testing.T, n int, a, b backend.Backend) []*sovereign.Elector {
	t.Helper()
	var es []*sovereign.Elector
	for i := range n {
		for j, c := range []backend.Backend{a, b} {
			e, err := sovereign.New(c, fmt.Sprintf("election-%d", i), fmt.Sprintf("c%d", j), fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			es = append(es, e)
		}
	}
	return es
}

// TestIdleElectorsCostNoGoroutine: started electors that lead or follow
// (watching their key, on a backend whose watches notify) add a number of
// goroutines that does not grow with their number (n and 2n elections),
// keep leading and following through many renewals, and leave none behind
// once closed.
func TestIdleElectorsCostNoGoroutine(t *testing.T) {
	for _, n := range []int{100, 200} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				a, b := store.Client(), store.Client()
				defer a.Close()
				defer b.Close()
				before := libraryGoroutines()
				es := startPairs(t, n, a, b)
				time.Sleep(10 * time.Second) // every election has its leader, renewed many times
				synctest.Wait()
				leaders, followers := 0, 0
				for _, e := range es {
					switch e.State() {
					case sovereign.Leader:
						leaders++
					case sovereign.Follower:
						followers++
					}
				}
				if leaders != n || followers != n {
					t.Fatalf("%d leaders and %d followers for %d elections, want %d of each", leaders, followers, n, n)
				}
				if got := libraryGoroutines() - before; got > idleGoroutines {
					t.Errorf("%d idle electors (%d leading, %d following) run %d goroutines, want at most %d in all",
						len(es), n, n, got, idleGoroutines)
				}
				for _, e := range es {
					e.Close()
				}
				synctest.Wait()
				if got := libraryGoroutines() - before; got != 0 {
					t.Errorf("%d goroutines left after Close of every elector, want 0", got)
				}
			})
		})
	}
}

// A parked leader resigns at once when asked, and a parked follower takes
// over at once (no virtual time passes): Resign and the release's watch
// event wake them.
func TestParkedElectorsResignAndTakeOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a, b := store.Client(), store.Client()
		defer a.Close()
		defer b.Close()
		before := libraryGoroutines()
		es := startPairs(t, 1, a, b)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := libraryGoroutines() - before; got != 0 {
			t.Fatalf("%d goroutines for 2 idle electors, want 0 (both parked)", got)
		}
		li := 0
		if !es[0].IsLeader() {
			li = 1
		}
		leader, follower := es[li], es[1-li]
		if !leader.IsLeader() || follower.State() != sovereign.Follower {
			t.Fatalf("states %v and %v, want a leader and a follower", es[0].State(), es[1].State())
		}
		start := time.Now()
		if err := follower.Resign(context.Background()); !errors.Is(err, sovereign.ErrNotLeader) {
			t.Fatalf("Resign of the parked follower: got %v, want ErrNotLeader", err)
		}
		if err := leader.Resign(context.Background()); err != nil {
			t.Fatalf("Resign of the parked leader: got %v, want nil", err)
		}
		synctest.Wait()
		if leader.IsLeader() || !follower.IsLeader() {
			t.Fatalf("after Resign: old leader leads %v, follower leads %v; want false, true", leader.IsLeader(), follower.IsLeader())
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("hand-over took %v of virtual time, want 0", d)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got := libraryGoroutines() - before; got != 0 {
			t.Errorf("%d goroutines after the hand-over settled, want 0", got)
		}
	})
}

// With Run, the leader function's goroutine is the only one of a leading
// elector; the loop waits for it to return without a goroutine, and its
// return ends the term at once.
func TestRunCostsOnlyTheLeaderFunction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		before := libraryGoroutines()
		stop := make(chan struct{})
		terms := make(chan uint64, 1)
		go e.Run(ctx, func(ctx context.Context) error {
			term, _ := sovereign.TermFromContext(ctx)
			select {
			case terms <- term:
			default:
			}
			select {
			case <-stop:
			case <-ctx.Done():
			}
			return nil
		})
		time.Sleep(3 * time.Second)
		synctest.Wait()
		// Run's own goroutine (waiting for ctx) and the leader function.
		if got := libraryGoroutines() - before; got != 2 {
			t.Errorf("a leader under Run has %d goroutines, want 2 (Run's caller and the leader function)", got)
		}
		first := <-terms
		close(stop)
		synctest.Wait()
		if e.IsLeader() {
			t.Errorf("still leading right after the function returned")
		}
		time.Sleep(e.Options().ResignSitOut + time.Second)
		synctest.Wait()
		select {
		case second := <-terms:
			if second <= first {
				t.Errorf("second term %d, want above %d", second, first)
			}
		default:
			t.Errorf("no new term after the function returned and the sit-out ended")
		}
		cancel()
		synctest.Wait()
	})
}

// The electors of a process have at most 256 one-off calls (acquisitions
// with their verification, look-ups) in flight on one backend: the others
// wait for a place, so thousands of elections starting at once do not send
// thousands of requests that time out together. Every one still leads.
func TestCallsInFlightAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		h := &hooked{Backend: mem}
		var (
			mu                sync.Mutex
			inflight, maxSeen int
		)
		gate := make(chan struct{})
		h.set(func(h *hooked) {
			h.onAcquire = func(ctx context.Context, req backend.AcquireRequest) {
				mu.Lock()
				inflight++
				maxSeen = max(maxSeen, inflight)
				mu.Unlock()
				select {
				case <-gate:
				case <-ctx.Done():
				}
				mu.Lock()
				inflight--
				mu.Unlock()
			}
		})
		const n = 600
		opts := fastOpts()
		opts.RequestTimeout = 300 * time.Millisecond
		var es []*sovereign.Elector
		for i := range n {
			e, err := sovereign.New(h, fmt.Sprintf("election-%d", i), "a", opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			es = append(es, e)
		}
		synctest.Wait()
		mu.Lock()
		got := inflight
		mu.Unlock()
		if got != 256 {
			t.Errorf("%d acquisitions in flight at once for %d starting elections, want the bound, 256", got, n)
		}
		close(gate)
		time.Sleep(2 * time.Second)
		synctest.Wait()
		leaders := 0
		for _, e := range es {
			if e.IsLeader() {
				leaders++
			}
		}
		if leaders != n || maxSeen > 256 {
			t.Errorf("%d of %d elections lead, at most %d acquisitions were in flight; want all, at most 256", leaders, n, maxSeen)
		}
	})
}

// Resign called from inside the leader function while the elector's loop
// is parked reaches the loop (its queue wakes it): the step-down begins,
// the leader context ends, and the elector leads again after its sit-out.
func TestResignFromInsideWithParkedLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		before := libraryGoroutines()
		parked := make(chan int, 1)
		resigned := make(chan error, 1)
		terms := make(chan uint64, 2)
		go e.Run(ctx, func(lctx context.Context) error {
			term, _ := sovereign.TermFromContext(lctx)
			select {
			case terms <- term:
			default:
			}
			if len(terms) == 1 {
				// The loop has parked by now; 1.1s: not an instant of a renewal
				// or a heartbeat, whose goroutines would be counted.
				time.Sleep(1100 * time.Millisecond)
				parked <- libraryGoroutines() - before
				err := e.Resign(lctx)
				if lctx.Err() == nil {
					t.Error("leader context alive after Resign returned")
				}
				resigned <- err
			}
			<-lctx.Done()
			return nil
		})
		// Run's goroutine, the leader function's (here, counting).
		if got := <-parked; got != 2 {
			t.Errorf("%d library goroutines while the leader function runs, want 2 (Run and the function)", got)
		}
		if err := <-resigned; err != nil {
			t.Fatalf("Resign from inside the leader function: got %v, want nil", err)
		}
		time.Sleep(e.Options().ResignSitOut + time.Second)
		synctest.Wait()
		if len(terms) != 2 || !e.IsLeader() {
			t.Errorf("%d terms, leading %v after the sit-out; want 2 terms, leading", len(terms), e.IsLeader())
		}
		cancel()
		e.Close()
	})
}

// hungWatch is a backend whose subscriptions never get established: Watch
// blocks until its context ends.
type hungWatch struct{ backend.Backend }

func (hungWatch) Watch(ctx context.Context, _ string) (<-chan backend.Event, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// Subscriptions being established have a bound of their own: more
// elections than the bound whose subscriptions hang still acquire, every
// one of them.
func TestHungSubscriptionsHoldUpNoAcquisition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.NewStore().Client()
		defer mem.Close()
		b := hungWatch{mem}
		const n = 300 // more than the bound (256)
		es := make([]*sovereign.Elector, n)
		for i := range es {
			e, err := sovereign.New(b, fmt.Sprintf("e%d", i), "a", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			es[i] = e
		}
		time.Sleep(time.Second)
		leading := 0
		for _, e := range es {
			if e.IsLeader() {
				leading++
			}
		}
		if leading != n {
			t.Errorf("%d of %d elections lead 1s after starting with their subscriptions hung, want every one", leading, n)
		}
	})
}
