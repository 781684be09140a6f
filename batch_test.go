package sovereign_test

import (
	"context"
	"errors"
	"fmt"
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

// batchingMemory is a memory client that renews and records heartbeats in
// batches, counting the batch calls.
type batchingMemory struct {
	*memorybackend.Backend
	renewBatches, hbBatches atomic.Int64
	hbHook                  atomic.Pointer[func([]backend.HeartbeatRequest) []error] // replaces HeartbeatBatch when set
}

func (b *batchingMemory) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	b.renewBatches.Add(1)
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = b.Backend.Renew(ctx, l)
	}
	return errs
}

func (b *batchingMemory) HeartbeatBatch(ctx context.Context, reqs []backend.HeartbeatRequest) []error {
	b.hbBatches.Add(1)
	if f := b.hbHook.Load(); f != nil {
		if errs := (*f)(reqs); errs != nil {
			return errs
		}
	}
	errs := make([]error, len(reqs))
	for i, r := range reqs {
		errs[i] = b.Backend.Heartbeat(ctx, r.Key, r.ID, r.TTL)
	}
	return errs
}

// Many elections of one instance on a backend that batches cost one
// renewal batch per RenewInterval and one heartbeat batch per
// HeartbeatInterval, however many there are, and all of them lead.
func TestManyElectionsShareBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchingMemory{Backend: c}
		const n = 40
		var es []*sovereign.Elector
		for i := range n {
			opts := fastOpts()
			opts.NoStartupJitter = false // elections start at different times
			e, err := sovereign.New(b, fmt.Sprintf("election-%d", i), "me", opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
		}
		time.Sleep(3 * time.Second) // every election leads by now
		for i, e := range es {
			if !e.IsLeader() {
				t.Fatalf("election %d has no leader after 3 TTLs", i)
			}
		}
		b.renewBatches.Store(0)
		b.hbBatches.Store(0)
		hbBefore := c.Calls()["Heartbeat"]
		time.Sleep(10 * time.Second)
		// TTL 1s: renew every 500ms, heartbeat every 500ms.
		if got := b.renewBatches.Load(); got < 19 || got > 21 {
			t.Errorf("%d renewal batches in 10s for %d elections, want about 20", got, n)
		}
		if got := b.hbBatches.Load(); got < 19 || got > 21 {
			t.Errorf("%d heartbeat batches in 10s for %d elections, want about 20", got, n)
		}
		if got := c.Calls()["Heartbeat"] - hbBefore; got < 19*n || got > 21*n {
			t.Errorf("%d heartbeats recorded in 10s, want about %d (each election every 500ms)", got, 20*n)
		}
		for i, e := range es {
			if !e.IsLeader() {
				t.Errorf("election %d lost its leader while renewing in batches", i)
			}
			e.Close()
		}
	})
}

// A follower that stopped polling (its watch reports every expiry) still
// takes over as soon as a crashed leader's lease expires.
func TestQuietFollowerTakesOverAtExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, &sovereign.Options{Logger: quiet}) // TTL 10s
		c.start(t)
		li := c.leader(t, 2*time.Second)
		fi := 1 - li
		time.Sleep(5 * time.Minute) // the follower has long stopped polling
		synctest.Wait()
		before := c.clients[fi].Calls()["Acquire"]
		time.Sleep(time.Minute)
		synctest.Wait()
		if got := c.clients[fi].Calls()["Acquire"] - before; got > 1 {
			t.Fatalf("idle follower made %d attempts in a minute, want at most 1", got)
		}
		crashed := time.Now()
		c.clients[li].Partition() // the leader's process is gone: no renewal, no release
		deadline := crashed.Add(12 * time.Second)
		for !c.es[fi].IsLeader() {
			if time.Now().After(deadline) {
				t.Fatal("the follower did not take over within the TTL after the leader crashed")
			}
			time.Sleep(10 * time.Millisecond)
		}
		// The lease expires TTL after the last renewal, which came at most
		// one RenewInterval (TTL/2) before the crash.
		if d := time.Since(crashed); d < 10*time.Second-10*time.Second/2 || d > 10*time.Second+50*time.Millisecond {
			t.Errorf("follower led %v after the crash, want within (TTL - RenewInterval, TTL]", d)
		}
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

// The double verification checks the store's own atomic reply when the
// backend confirms with it (no second request), and reads the record back
// when it does not.
func TestVerificationFoldedIntoConfirmedAcquire(t *testing.T) {
	for _, confirm := range []bool{true, false} {
		t.Run(fmt.Sprintf("confirms=%v", confirm), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memorybackend.New()
				defer mem.Close()
				var b backend.Backend = mem
				if !confirm {
					b = &hooked{Backend: mem} // hides AcquireConfirmer
				}
				e, err := sovereign.New(b, "election", "a", fastOpts())
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if err := e.Start(t.Context()); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
				if !e.IsLeader() {
					t.Fatal("no leader")
				}
				gets := mem.Calls()["Get"]
				switch {
				case confirm && gets != 0:
					t.Errorf("%d reads after a confirmed acquisition, want 0", gets)
				case !confirm && gets != 1:
					t.Errorf("%d reads after an acquisition, want 1 (the read-back)", gets)
				}
				if r, err := mem.Get(t.Context(), "election"); err != nil || r.Term != e.Term() || r.HolderID != "a" {
					t.Errorf("store holds %+v (%v), want a's lease of term %d", r, err, e.Term())
				}
			})
		})
	}
}

// Heartbeats of a batching backend are sent by one scheduler per backend
// and interval, not by the electors' loops: Close waits for a batch that
// carries its heartbeat before removing its record, so a late batch never
// writes the record again; a failed heartbeat is reported and retried
// before the next instant.
func TestScheduledHeartbeats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchingMemory{Backend: c}
		var (
			mu     sync.Mutex
			events []sovereign.Event
		)
		e, err := sovereign.New(b, "election", "a", fastOpts()) // heartbeat every 500ms
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		unsub := e.Subscribe(func(ev sovereign.Event) { mu.Lock(); events = append(events, ev); mu.Unlock() })
		defer unsub()
		if err := e.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if ms, err := c.Members(t.Context(), "election"); err != nil || len(ms) != 1 {
			t.Fatalf("members = %v, %v; want a", ms, err)
		}

		// A failing batch: reported, and retried within a backoff (well
		// before the next instant).
		var fails atomic.Int64
		failing := func(reqs []backend.HeartbeatRequest) []error {
			fails.Add(1)
			errs := make([]error, len(reqs))
			for i := range errs {
				errs[i] = errors.New("injected heartbeat failure")
			}
			return errs
		}
		b.hbHook.Store(&failing)
		time.Sleep(700 * time.Millisecond) // the instant at 1.5s and retries before the next, at 2s
		synctest.Wait()
		b.hbHook.Store(nil)
		if got := fails.Load(); got < 2 {
			t.Errorf("%d failing heartbeat batches in one interval, want retries within it", got)
		}
		failed := 0
		mu.Lock()
		for _, ev := range events {
			if f, ok := ev.(sovereign.ElectionFailed); ok && strings.Contains(f.Err.Error(), "injected heartbeat failure") {
				failed++
			}
		}
		mu.Unlock()
		if failed == 0 {
			t.Error("no ElectionFailed event for the failed heartbeats")
		}

		// A batch in flight when Close is called.
		inBatch, release := make(chan struct{}), make(chan struct{})
		blocking := func([]backend.HeartbeatRequest) []error {
			close(inBatch)
			<-release
			return nil // then record them
		}
		b.hbHook.Store(&blocking)
		<-inBatch
		b.hbHook.Store(nil)
		closed := make(chan error)
		go func() { closed <- e.Close() }()
		synctest.Wait()
		select {
		case <-closed:
			t.Fatal("Close returned while a batch carrying its heartbeat was in flight")
		default:
		}
		close(release)
		if err := <-closed; err != nil {
			t.Fatal(err)
		}
		if ms, err := c.Members(t.Context(), "election"); err != nil || len(ms) != 0 {
			t.Errorf("members after Close = %v, %v; want none (a late batch wrote the record again)", ms, err)
		}
	})
}

// A failed scheduled heartbeat is retried after the elector's backoff
// (exponential from RenewInterval/8, jittered within its upper half), even
// while another elector of the same scheduler is due only at the next
// instant; a success ends the run of failures, so the backoff of a later
// failure starts from the beginning again.
func TestScheduledHeartbeatRetryBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchingMemory{Backend: c}
		opts := fastOpts()                          // heartbeat every 500ms
		opts.RenewInterval = 200 * time.Millisecond // the backoff: from 25ms up to 200ms
		for _, name := range []string{"a", "b"} {
			e, err := sovereign.New(b, name, "me", opts)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second)
		var (
			mu    sync.Mutex
			fails int         // a's heartbeats still to fail
			calls []time.Time // when a's heartbeats were sent
			ok    []bool      // whether each succeeded
		)
		hook := func(reqs []backend.HeartbeatRequest) []error {
			errs := make([]error, len(reqs))
			mu.Lock()
			defer mu.Unlock()
			for i, r := range reqs {
				if r.Key != "a" {
					continue
				}
				calls = append(calls, time.Now())
				ok = append(ok, fails == 0)
				if fails > 0 {
					fails--
					errs[i] = errors.New("test: heartbeat refused")
				}
			}
			return errs
		}
		b.hbHook.Store(&hook)
		defer b.hbHook.Store(nil)
		mu.Lock()
		fails = 3
		mu.Unlock()
		time.Sleep(time.Second) // three failures and a success
		mu.Lock()
		fails = 1
		mu.Unlock()
		time.Sleep(time.Second) // one failure and a success
		mu.Lock()
		defer mu.Unlock()
		// The gaps after each failure: 1st, 2nd, 3rd of a run, then the 1st
		// of the next.
		ms := time.Millisecond
		caps := []time.Duration{25 * ms, 50 * ms, 100 * ms, 25 * ms}
		var gaps []time.Duration
		for i := 0; i+1 < len(calls); i++ {
			if !ok[i] {
				gaps = append(gaps, calls[i+1].Sub(calls[i]))
			}
		}
		if len(gaps) != len(caps) {
			t.Fatalf("a's heartbeats %v (ok %v): want 4 failures each followed by a retry", calls, ok)
		}
		for i, d := range caps {
			if gaps[i] < d/2 || gaps[i] > d {
				t.Errorf("retry after failure %d came %v later, want within [%v, %v]", i+1, gaps[i], d/2, d)
			}
		}
	})
}

// The first heartbeats of electors starting within the gathering window of
// each other (coalesce.Gather, 1ms) go out in one batch call.
func TestScheduledHeartbeatsGatherAtStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchingMemory{Backend: c}
		for _, name := range []string{"a", "b"} {
			e, err := sovereign.New(b, name, "me", fastOpts()) // heartbeat every 500ms
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			time.Sleep(500 * time.Microsecond)
		}
		time.Sleep(100 * time.Millisecond)
		if n := b.hbBatches.Load(); n != 1 {
			t.Errorf("heartbeat batch calls for two electors started 0.5ms apart: got %d, want 1", n)
		}
		if ms, err := c.Members(t.Context(), "b"); err != nil || len(ms) != 1 {
			t.Errorf("members of b: %v, %v; want its heartbeat recorded", ms, err)
		}
	})
}

// A heartbeat batch answered with fewer results than it carried counts as
// failed for every elector in it: none is taken for recorded.
func TestShortHeartbeatAnswerIsAFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchingMemory{Backend: c}
		e, err := sovereign.New(b, "election", "a", fastOpts()) // heartbeat every 500ms
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var failed atomic.Int64
		e.Subscribe(func(ev sovereign.Event) {
			if f, ok := ev.(sovereign.ElectionFailed); ok && strings.Contains(f.Err.Error(), "heartbeat") {
				failed.Add(1)
			}
		})
		short := func([]backend.HeartbeatRequest) []error { return []error{} }
		b.hbHook.Store(&short)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		b.hbHook.Store(nil)
		synctest.Wait()
		if failed.Load() == 0 {
			t.Error("no ElectionFailed for heartbeats the backend's answer left out")
		}
	})
}
