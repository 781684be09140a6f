package sovereign_test

import (
	"context"
	"errors"
	"log/slog"
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

// watchHook wraps a backend and runs onWatch before each Watch call (n
// counts them from 1): a non-nil error fails the call. It hides every
// optional interface but backend.Watcher.
type watchHook struct {
	backend.Backend
	mu      sync.Mutex
	n       int
	onWatch func(n int) error
}

func (w *watchHook) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	w.mu.Lock()
	w.n++
	n, f := w.n, w.onWatch
	w.mu.Unlock()
	if f != nil {
		if err := f(n); err != nil {
			return nil, err
		}
	}
	return w.Backend.(backend.Watcher).Watch(ctx, key)
}

// TestFirstWatchAfterFailureIsAReset: a follower's first watch fails (the
// store is going down), and by the time a later one is established the
// store has restarted without its data, with the leader cut off from it.
// The subscription that follows a failed establishment is a reset, like
// one that follows a broken subscription: the follower, which had heard
// from the store, waits a TTL before it takes the free key, and never
// leads beside the cut leader.
func TestFirstWatchAfterFailureIsAReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store := memorybackend.NewStore()
		ca, cb := store.Client(), store.Client()
		t.Cleanup(func() { ca.Close() })
		t.Cleanup(func() { cb.Close() })
		var mu sync.Mutex
		var restart time.Time // guarded by mu
		restarted := func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return restart
		}
		wb := &watchHook{Backend: cb, onWatch: func(n int) error {
			if n == 1 {
				return errors.New("injected watch failure")
			}
			if n == 2 { // the store is back, empty
				ca.Partition()
				store.Restart(nil)
				mu.Lock()
				restart = time.Now()
				mu.Unlock()
			}
			return nil
		}}
		rec := &electortest.Recorder{}
		a := startOn(t, ca, "a", o, rec)
		time.Sleep(100 * time.Millisecond)
		b := startOn(t, wb, "b", o, rec)
		time.Sleep(100 * time.Millisecond)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		for !b.IsLeader() {
			if r := restarted(); !r.IsZero() && time.Since(r) > o.TTL+time.Second {
				t.Fatalf("b does not lead TTL + 1 s after the restart")
			}
			time.Sleep(time.Millisecond)
		}
		if restarted().IsZero() {
			t.Fatal("b leads, but its second watch was never established")
		}
		if took := time.Since(restarted()); took < o.TTL {
			t.Errorf("b led %v after the restart, want no acquisition of the free key before a TTL (%v)", took, o.TTL)
		}
		a.Close()
		electortest.CheckNoOverlap(t, rec.Intervals())
	})
}

// TestStartedDuringShortOutageLeadsOnceBack: an elector started while the
// store is down has never heard from it, so it knows of no lease the store
// could have lost: neither its failed heartbeat nor its failed attempts nor
// its watch established after failures start the wait, and it leads as
// soon as the store is back, not a TTL later.
func TestStartedDuringShortOutageLeadsOnceBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		mem := memorybackend.New()
		t.Cleanup(func() { mem.Close() })
		mem.Partition()
		e, err := sovereign.New(mem, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // less than a TTL
		if e.IsLeader() {
			t.Fatal("leader while the store is down")
		}
		mem.Heal()
		healed := time.Now()
		for !e.IsLeader() {
			// The next attempt comes within a backoff (at most the renew
			// interval, 500 ms); a wait would last until a TTL after the
			// first failure (700 ms from now).
			if d := time.Since(healed); d > 600*time.Millisecond {
				t.Fatalf("not leading %v after the store came back, want within 600 ms (no wait: it never heard from the store)", d)
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// TestOldLeaderNotHeldBackByStepDownFailures: the store restarts without
// its data; the leader learns at once that its lease is gone and steps
// down, but its leader function takes a while to return, and a heartbeat
// fails meanwhile. That call failed while the elector still held the key,
// so it says nothing about anyone else's lease: once the function has
// returned, the old leader acquires again at once, not a TTL later.
func TestOldLeaderNotHeldBackByStepDownFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store := memorybackend.NewStore()
		cl := store.Client()
		t.Cleanup(func() { cl.Close() })
		var hbFailed atomic.Int32
		failHB := atomic.Bool{}
		h := &hooked{Backend: cl, onHB: func(context.Context) (error, bool) {
			if failHB.Load() {
				hbFailed.Add(1)
				return errors.New("injected heartbeat failure"), true
			}
			return nil, false
		}}
		e, err := sovereign.New(h, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		returned := make(chan struct{})
		var terms atomic.Int32
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- e.Run(ctx, func(lctx context.Context) error {
				<-lctx.Done()
				if terms.Add(1) == 1 {
					time.Sleep(800 * time.Millisecond) // a slow clean-up
					failHB.Store(false)
					close(returned)
				}
				return nil
			})
		}()
		time.Sleep(1250 * time.Millisecond) // between two heartbeats (every 500 ms)
		if !e.IsLeader() {
			t.Fatal("a does not lead")
		}
		term := e.Term()
		failHB.Store(true)
		store.Restart(nil)
		<-returned
		if hbFailed.Load() == 0 {
			t.Fatal("no heartbeat failed while the leader function returned; the test proves nothing")
		}
		back := time.Now()
		for !e.IsLeader() {
			if d := time.Since(back); d > 100*time.Millisecond {
				t.Fatalf("the old leader does not lead again %v after its term ended, want at once (it held the key when its heartbeat failed)", d)
			}
			time.Sleep(time.Millisecond)
		}
		if e.Term() <= term {
			t.Errorf("term after the restart: got %d, want above %d", e.Term(), term)
		}
		cancel()
		<-done
	})
}

// TestLongOutageWaitRunsFromFirstFailure: a polling follower is cut off
// from the store for three TTLs, its attempts failing all along, and the
// leader leaves meanwhile. The wait starts at the first failure of the
// run, not at each: once the store answers again, the follower takes the
// free key at its next attempt rather than a TTL after its last failure.
func TestLongOutageWaitRunsFromFirstFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		ea, eb, log := leaderAndPoller(t, o, false)
		time.Sleep(2 * time.Second) // b polls a's lease
		if !ea.IsLeader() || eb.IsLeader() {
			t.Fatal("want a leading and b following")
		}
		cb := log.Backend.(*memorybackend.Backend)
		cb.Partition()
		time.Sleep(500 * time.Millisecond)
		ea.Close() // releases
		time.Sleep(3*o.TTL - 500*time.Millisecond)
		cb.Heal()
		healed := time.Now()
		for !eb.IsLeader() {
			// b's next attempt comes within a backoff (at most the renew
			// interval, 500 ms); a wait from its last failure would last a
			// TTL (1 s).
			if d := time.Since(healed); d > 600*time.Millisecond {
				t.Fatalf("b does not lead %v after the store answers again, want within 600 ms (its wait began at the first failure, 3 TTLs ago)", d)
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// TestKnownLeaseKeptThroughAFreeRead: after a reset a follower's read says
// the key is free (a replica that lagged, say), and a second reset follows
// before the wait ends. The follower then knows of no holder, but the lease
// it knew before the first reset is still the one to look for: when the
// read after the second reset finds it, the store kept its data, the wait
// ends, and a resignation hands over at once.
func TestKnownLeaseKeptThroughAFreeRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store := memorybackend.NewStore()
		ca, cb := store.Client(), store.Client()
		t.Cleanup(func() { ca.Close() })
		t.Cleanup(func() { cb.Close() })
		var staleReads atomic.Int32
		hb := &hooked{Backend: cb, onGet: func(context.Context, string) (backend.Record, error, bool) {
			if staleReads.Load() > 0 {
				staleReads.Add(-1)
				return backend.Record{}, backend.ErrNotHeld, true
			}
			return backend.Record{}, nil, false
		}}
		rec := &electortest.Recorder{}
		a := startOn(t, ca, "a", o, rec)
		time.Sleep(100 * time.Millisecond)
		b := startOn(t, hb, "b", o, rec)
		time.Sleep(100 * time.Millisecond)
		time.Sleep(time.Second)
		if !a.IsLeader() || b.Status().Leader.HolderID != "a" {
			t.Fatalf("want a leading and b following a; b follows %q", b.Status().Leader.HolderID)
		}
		staleReads.Store(1)
		store.Restart(&memorybackend.RestartOptions{KeepLeases: true})
		time.Sleep(50 * time.Millisecond)
		if staleReads.Load() != 0 || b.Status().Leader.HolderID != "" {
			t.Fatalf("after the first reset: stale reads left %d, b follows %q; want the stale read done and no leader known", staleReads.Load(), b.Status().Leader.HolderID)
		}
		store.Restart(&memorybackend.RestartOptions{KeepLeases: true})
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		term := a.Term()
		if err := a.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		resigned := time.Now()
		for !b.IsLeader() {
			if d := time.Since(resigned); d > 100*time.Millisecond {
				t.Fatalf("b does not lead %v after a resigned, want at once (the read after the second reset found the lease known before)", d)
			}
			time.Sleep(time.Millisecond)
		}
		if b.Term() <= term {
			t.Errorf("b's term: got %d, want above %d", b.Term(), term)
		}
		// a's LeadershipLost event may still be on its way to the
		// recorder (about once in 700 runs it was not there yet).
		synctest.Wait()
		electortest.CheckNoOverlap(t, rec.Intervals())
	})
}

// countHandler is a slog.Handler that counts the records whose message
// begins with prefix.
type countHandler struct {
	prefix string
	n      *atomic.Int32
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countHandler) WithGroup(string) slog.Handler            { return h }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, h.prefix) {
		h.n.Add(1)
	}
	return nil
}

// TestFreeKeyWaitLoggedOncePerWait: a follower that finds the key free
// after a reset logs that it waits once per wait: not again when a change
// of the key makes it read the key again during the same wait, and again
// when a second reset starts a new wait.
func TestFreeKeyWaitLoggedOncePerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ca, cb, raw := store.Client(), store.Client(), store.Client()
		t.Cleanup(func() { ca.Close() })
		t.Cleanup(func() { cb.Close() })
		t.Cleanup(func() { raw.Close() })
		var logged atomic.Int32
		ob := fastOpts()
		ob.Logger = slog.New(countHandler{prefix: "sovereign: the key is free after a reset", n: &logged})
		a, err := sovereign.New(ca, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := sovereign.New(cb, "election", "b", ob)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for _, e := range []*sovereign.Elector{a, b} {
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(time.Second)
		if !a.IsLeader() || b.IsLeader() {
			t.Fatal("want a leading and b following")
		}
		ca.Partition()
		store.Restart(nil)
		time.Sleep(10 * time.Millisecond)
		if n := logged.Load(); n != 1 {
			t.Fatalf("after the first reset: logged the wait %d times, want 1", n)
		}
		// During the wait, someone takes the key and lets it go: b reads
		// the key at each change, and finds it free again.
		l, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "raw", TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		if err := raw.Release(t.Context(), l); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		if n := logged.Load(); n != 1 {
			t.Fatalf("after more reads during the same wait: logged the wait %d times, want 1", n)
		}
		store.Restart(nil)
		time.Sleep(10 * time.Millisecond)
		if n := logged.Load(); n != 2 {
			t.Fatalf("after a second reset: logged the wait %d times, want 2 (one per wait)", n)
		}
	})
}

// TestFailedReadDuringWaitDoesNotProlongIt: a follower waits after a reset
// (the store restarted without its data, the leader cut off). During the
// wait a read of the key fails, but its watch stays up: had the store
// restarted again, the watch would have broken and prolonged the wait, so
// the failure does not (failures that come and go must not keep a follower
// waiting for ever; see TestIntermittentFailuresDoNotBlock). The follower
// takes the free key when the wait that began at the restart ends: no
// sooner than a TTL after the restart, and sooner than a TTL after the
// failure. (Without a watch a failure does prolong the wait:
// TestPollerFailureProlongsTheWait.)
func TestFailedReadDuringWaitDoesNotProlongIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store := memorybackend.NewStore()
		ca, cb, raw := store.Client(), store.Client(), store.Client()
		t.Cleanup(func() { ca.Close() })
		t.Cleanup(func() { cb.Close() })
		t.Cleanup(func() { raw.Close() })
		var failGet atomic.Bool
		var getFailed atomic.Int32
		hb := &hooked{Backend: cb, onGet: func(context.Context, string) (backend.Record, error, bool) {
			if failGet.Load() {
				getFailed.Add(1)
				return backend.Record{}, errors.New("injected read failure"), true
			}
			return backend.Record{}, nil, false
		}}
		a, err := sovereign.New(ca, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := sovereign.New(hb, "election", "b", o)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for _, e := range []*sovereign.Elector{a, b} {
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(time.Second)
		if !a.IsLeader() || b.IsLeader() {
			t.Fatal("want a leading and b following")
		}
		ca.Partition()
		store.Restart(nil)
		restart := time.Now()
		time.Sleep(400 * time.Millisecond) // b waits, a TTL from the restart
		// Someone takes the key: b reads it at the change, and the read fails.
		failGet.Store(true)
		l, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "raw", TTL: o.TTL})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
		failGet.Store(false)
		failed := time.Now()
		if getFailed.Load() == 0 {
			t.Fatal("b did not read the key at the change; the test proves nothing")
		}
		time.Sleep(50 * time.Millisecond)
		if err := raw.Release(t.Context(), l); err != nil {
			t.Fatal(err)
		}
		for !b.IsLeader() {
			if d := time.Since(failed); d > o.TTL+time.Second {
				t.Fatalf("b does not lead %v after its failed read", d)
			}
			time.Sleep(time.Millisecond)
		}
		if d := time.Since(restart); d < o.TTL {
			t.Errorf("b led %v after the restart, want no acquisition of the free key before a TTL (%v)", d, o.TTL)
		}
		if d := time.Since(failed); d >= o.TTL {
			t.Errorf("b led %v after its read failed during the wait, want sooner than a TTL (%v): with the watch up, the failure does not prolong the wait", d, o.TTL)
		}
	})
}

// TestWaitEndsJustAfterTheTTL: a lease renewed as the store went down
// expires a TTL later, and on a store that counts the expiry instant as
// still held (Redis: a key lives while now <= its expiry) an attempt at
// that very instant would find it. So the follower's wait after a reset
// ends just after a TTL (expiryMargin), not at it, and not much later.
func TestWaitEndsJustAfterTheTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		c := newCluster(t, 2, o)
		c.start(t)
		old := c.leader(t, 2*time.Second)
		time.Sleep(500 * time.Millisecond)
		c.clients[old].Partition()
		restart := time.Now()
		c.store.Restart(nil)
		next := c.es[1-old]
		for !next.IsLeader() {
			if time.Since(restart) > o.TTL+time.Second {
				t.Fatal("no new leader within TTL + 1 s of the restart")
			}
			time.Sleep(time.Millisecond)
		}
		synctest.Wait() // the LeadershipAcquired event is recorded
		ivs := c.rec.Intervals()
		i := slices.IndexFunc(ivs, func(iv electortest.Interval) bool { return iv.ID == next.ID() && iv.Start.After(restart) })
		if i < 0 {
			t.Fatalf("terms recorded: %+v, want one of %s after the restart", ivs, next.ID())
		}
		iv := ivs[i]
		if took := iv.Start.Sub(restart); took <= o.TTL || took > o.TTL+50*time.Millisecond {
			t.Errorf("%s acquired %v after the restart, want just after a TTL: in (%v, %v]", next.ID(), took, o.TTL, o.TTL+50*time.Millisecond)
		}
	})
}

// acquireHook wraps a backend, hiding every optional interface (no watch:
// the elector polls), and runs onAcquire before each Acquire: a non-nil
// error fails the call.
type acquireHook struct {
	backend.Backend
	onAcquire func() error
}

func (h *acquireHook) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	if err := h.onAcquire(); err != nil {
		return backend.Lease{}, err
	}
	return h.Backend.Acquire(ctx, req)
}

// TestFailedAttemptStartsTheWait: a polling follower's attempt fails
// because the store is restarting; it comes back without its data, with
// the leader cut off from it. The failed attempt is lost contact, as a
// broken watch is: the follower reads the key instead of acquiring it
// until a TTL has passed since the failure, and never leads beside the cut
// leader. So too when an earlier failure's wait ended early (the read
// found the leader's lease still there): that read ended the run of
// failures, and the next failure starts a wait of its own.
func TestFailedAttemptStartsTheWait(t *testing.T) {
	for _, tc := range []struct {
		name    string
		blip    int // the attempt that fails without a restart; 0: none
		restart int // the attempt that fails while the store restarts
	}{
		{"restart", 0, 3}, // b's first two attempts found a's lease
		{"blip, then restart", 3, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := fastOpts()
				store := memorybackend.NewStore()
				ca, cb := store.Client(), store.Client()
				t.Cleanup(func() { ca.Close() })
				t.Cleanup(func() { cb.Close() })
				var mu sync.Mutex
				var attempts int
				var failed time.Time // guarded by mu
				hb := &acquireHook{Backend: cb, onAcquire: func() error {
					mu.Lock()
					defer mu.Unlock()
					switch attempts++; attempts {
					case tc.blip:
						return errors.New("injected: the store blinked")
					case tc.restart:
						ca.Partition()
						store.Restart(nil)
						failed = time.Now()
						return errors.New("injected: the store is restarting")
					}
					return nil
				}}
				rec := &electortest.Recorder{}
				a := startOn(t, ca, "a", o, rec)
				time.Sleep(100 * time.Millisecond)
				b := startOn(t, hb, "b", o, rec)
				time.Sleep(100 * time.Millisecond)
				if !a.IsLeader() {
					t.Fatal("a does not lead")
				}
				failedAt := func() time.Time {
					mu.Lock()
					defer mu.Unlock()
					return failed
				}
				for !b.IsLeader() {
					if f := failedAt(); !f.IsZero() && time.Since(f) > o.TTL+time.Second {
						t.Fatal("b does not lead TTL + 1 s after its attempt failed")
					}
					time.Sleep(time.Millisecond)
				}
				if failedAt().IsZero() {
					t.Fatal("b leads, but its attempt never failed in the restart; the test proves nothing")
				}
				if took := time.Since(failedAt()); took < o.TTL {
					t.Errorf("b led %v after its attempt failed, want no acquisition of the free key before a TTL (%v)", took, o.TTL)
				}
				a.Close()
				electortest.CheckNoOverlap(t, rec.Intervals())
			})
		})
	}
}

// TestWaitReadsOnce: a polling follower that lost contact (a heartbeat
// failed) reads the key instead of its next attempt. When the read finds
// another holder than the one it knew, or the key free, that read is all
// until the wait ends: its next call is the attempt a TTL later, not
// another read.
func TestWaitReadsOnce(t *testing.T) {
	for _, free := range []bool{false, true} {
		name := "another holder"
		if free {
			name = "free"
		}
		t.Run(name, func(t *testing.T) {
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
				ea.Close() // releases; b, polling, learns it at its next call
				if !free {
					// Someone else takes the key (through b's client, unlogged).
					raw := b.Backend
					if _, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "raw", TTL: 10 * o.TTL}); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(3 * o.TTL)
				synctest.Wait()
				calls := b.since(n)
				if len(calls) < 2 || calls[0] != "get" || calls[1] != "acquire" {
					t.Errorf("calls after the heartbeat failed: %v, want a read, then an attempt when the wait ends", calls)
				}
			})
		})
	}
}

// TestResignedLeaderWaitsAfterReset: an elector that has only ever led
// (its one answer from the store was its own acquisition) resigns, and
// while it sits out the store restarts without its data, the new leader
// cut off from it. Its acquisition was an answer from the store like any
// other: it waits a TTL after the reset before it takes the free key, and
// never leads beside the cut leader.
func TestResignedLeaderWaitsAfterReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		store := memorybackend.NewStore()
		ca, cb := store.Client(), store.Client()
		t.Cleanup(func() { ca.Close() })
		t.Cleanup(func() { cb.Close() })
		rec := &electortest.Recorder{}
		a := startOn(t, ca, "a", o, rec)
		time.Sleep(100 * time.Millisecond)
		b := startOn(t, cb, "b", o, rec)
		time.Sleep(100 * time.Millisecond)
		time.Sleep(time.Second)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		if err := a.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		for !b.IsLeader() {
			time.Sleep(time.Millisecond)
		}
		cb.Partition()
		restart := time.Now()
		store.Restart(nil) // within a's sit-out (200 ms)
		for !a.IsLeader() {
			if time.Since(restart) > o.TTL+time.Second {
				t.Fatal("a does not lead TTL + 1 s after the restart")
			}
			time.Sleep(time.Millisecond)
		}
		if took := time.Since(restart); took < o.TTL {
			t.Errorf("a led %v after the restart, want no acquisition of the free key before a TTL (%v)", took, o.TTL)
		}
		b.Close()
		electortest.CheckNoOverlap(t, rec.Intervals())
	})
}
