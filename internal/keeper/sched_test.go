package keeper_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/coalesce"
	"github.com/sovereign-go/sovereign/internal/keeper"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// keyed is a memory backend that renews in batches and counts, per key,
// the renewals its batches carried.
type keyed struct {
	*memorybackend.Backend
	mu      sync.Mutex
	batches int
	renews  map[string]int
	back    time.Time // when the first batch returned
}

func (b *keyed) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	b.mu.Lock()
	b.batches++
	if b.renews == nil {
		b.renews = make(map[string]int)
	}
	for _, l := range leases {
		b.renews[l.Key]++
	}
	b.mu.Unlock()
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = b.Backend.Renew(ctx, l)
	}
	b.mu.Lock()
	if b.back.IsZero() {
		b.back = time.Now()
	}
	b.mu.Unlock()
	return errs
}

func (b *keyed) counts() (batches int, renews map[string]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r := make(map[string]int, len(b.renews))
	for k, v := range b.renews {
		r[k] = v
	}
	return b.batches, r
}

// acquire acquires key on b and keeps it.
func acquire(t *testing.T, b backend.Backend, cfg keeper.Config, key string) *keeper.Hold {
	t.Helper()
	sent := time.Now()
	l, err := b.Acquire(t.Context(), backend.AcquireRequest{Key: key, HolderID: "a", TTL: cfg.TTL})
	if err != nil {
		t.Fatal(err)
	}
	return keeper.Start(t.Context(), cfg, l, sent)
}

// Holds renewed in batches cost no goroutine at rest and one in all while a
// batch hangs, however many there are: one scheduler drives them.
func TestBatchedHoldsShareOneGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &keyed{Backend: c}
		cfg := config(b)
		base := bubbleGoroutines()
		hs := make([]*keeper.Hold, 300)
		for i := range hs {
			hs[i] = acquire(t, b, cfg, fmt.Sprintf("k%d", i))
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n := bubbleGoroutines(); n != base {
			t.Errorf("goroutines while 300 batched holds are held: %d, want %d (none)", n, base)
		}
		if batches, _ := b.counts(); batches != 10 {
			t.Errorf("batch calls in 2s: %d, want 10 (one per 200ms instant for all 300 holds)", batches)
		}
		// The next instant is at 2.2s: its batch hangs until its 200ms
		// timeout.
		c.Hang()
		time.Sleep(250 * time.Millisecond)
		synctest.Wait()
		if n := bubbleGoroutines(); n != base+1 {
			t.Errorf("goroutines while the batch of 300 holds hangs: %d, want %d (the scheduler's one)", n, base+1)
		}
		c.Heal()
		for _, h := range hs {
			release(t, h)
		}
		if n := keeper.Schedulers(b); n != 0 {
			t.Errorf("schedulers after the last release: %d, want 0 (dropped with its timers)", n)
		}
		// A new hold makes a new scheduler, which renews it.
		h := acquire(t, b, cfg, "again")
		time.Sleep(time.Second)
		if !h.Held() || keeper.Schedulers(b) != 1 {
			t.Errorf("a hold after the scheduler was dropped: held %v, %d schedulers; want held by a new one", h.Held(), keeper.Schedulers(b))
		}
		release(t, h)
	})
}

// While a batch hangs, each hold steps down at its own deadline, to the
// instant: a hold started later than another, in the same batch, steps down
// after the other's earlier deadline fired; and holds a batch renewed share
// the deadline counted from that batch's send time.
func TestHungBatchEachAtItsOwnDeadline(t *testing.T) {
	t.Run("first batch", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := memorybackend.NewStore().Client()
			defer c.Close()
			b := &keyed{Backend: c}
			cfg := config(b)
			t0 := time.Now() // on the grid: the first batch is at +200ms
			a := acquire(t, b, cfg, "a")
			time.Sleep(150 * time.Millisecond)
			bb := acquire(t, b, cfg, "b")
			time.Sleep(40 * time.Millisecond)
			c.Hang() // before the first batch, which carries both
			<-a.Done()
			if d := time.Since(t0); d != 700*time.Millisecond {
				t.Errorf("a stepped down at +%v, want +700ms (its own deadline)", d)
			}
			if !bb.Held() {
				t.Error("b stepped down with a, before its own deadline")
			}
			<-bb.Done()
			if d := time.Since(t0); d != 850*time.Millisecond {
				t.Errorf("b stepped down at +%v, want +850ms (its own deadline)", d)
			}
			for _, h := range []*keeper.Hold{a, bb} {
				if r, _ := h.Reason(); r != keeper.Deadline {
					t.Errorf("reason %v, want Deadline", r)
				}
			}
			if batches, renews := b.counts(); batches == 0 || renews["a"] != renews["b"] {
				t.Errorf("%d batches, renewals %v: want a and b in the same batches", batches, renews)
			}
			c.Heal()
			release(t, a)
			release(t, bb)
		})
	})
	t.Run("after renewals", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := memorybackend.NewStore().Client()
			defer c.Close()
			b := &keyed{Backend: c}
			cfg := config(b)
			t0 := time.Now()
			a := acquire(t, b, cfg, "a")
			time.Sleep(150 * time.Millisecond)
			bb := acquire(t, b, cfg, "b")
			time.Sleep(100 * time.Millisecond) // past the batch at +200ms
			for _, h := range []*keeper.Hold{a, bb} {
				if st := h.Status(); !st.LastRenewal.Equal(t0.Add(200 * time.Millisecond)) {
					t.Fatalf("last renewal at +%v, want +200ms (the batch's send time)", st.LastRenewal.Sub(t0))
				}
			}
			c.Hang()
			<-a.Done()
			<-bb.Done()
			if d := time.Since(t0); d != 900*time.Millisecond {
				t.Errorf("stepped down at +%v, want +900ms (the batch at +200ms + RenewDeadline)", d)
			}
			c.Heal()
			release(t, a)
			release(t, bb)
		})
	})
}

// A Release while its hold's batch is in flight waits for the batch, so no
// renewal of it is sent after Release returns; the other holds of the batch
// are renewed on as before.
func TestReleaseAmidBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		b := &keyed{Backend: c}
		cfg := config(b)
		t0 := time.Now()
		hs := []*keeper.Hold{acquire(t, b, cfg, "k0"), acquire(t, b, cfg, "k1"), acquire(t, b, cfg, "k2")}
		c.SetLatency(80 * time.Millisecond)
		time.Sleep(250 * time.Millisecond) // the batch sent at +200ms is in flight
		if _, renews := b.counts(); renews["k1"] != 1 {
			t.Fatalf("renewals of k1 by +250ms: %d, want 1 (in flight)", renews["k1"])
		}
		if err := hs[1].Release(context.Background()); err != nil {
			t.Fatalf("Release amid a batch: %v", err)
		}
		// It waited for the batch, then released (80ms).
		b.mu.Lock()
		back := b.back
		b.mu.Unlock()
		if back.Sub(t0) <= 250*time.Millisecond || time.Since(back) != 80*time.Millisecond {
			t.Errorf("batch returned at +%v, Release at +%v: want Release one call (80ms) after the batch in flight returned", back.Sub(t0), time.Since(t0))
		}
		<-hs[1].Finished()
		_, before := b.counts()
		time.Sleep(2 * time.Second)
		_, after := b.counts()
		if after["k1"] != before["k1"] {
			t.Errorf("renewals of k1 after its Release returned: %d, want 0", after["k1"]-before["k1"])
		}
		if after["k0"]-before["k0"] < 9 {
			t.Errorf("renewals of k0 in the 2s after k1's release: %d, want about 10", after["k0"]-before["k0"])
		}
		other := store.Client()
		defer other.Close()
		if _, err := other.Get(t.Context(), "k1"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("k1 after Release: %v, want ErrNotHeld", err)
		}
		for _, i := range []int{0, 2} {
			if !hs[i].Held() {
				t.Errorf("hold k%d: not held after another hold of its batch was released", i)
			}
		}
		c.SetLatency(0)
		release(t, hs[0])
		release(t, hs[2])
	})
}

// After a store restart, RenewNow on every batched hold sends one batch for
// all of them, and each steps down on its own answer.
func TestBatchedRenewNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		c := store.Client()
		defer c.Close()
		b := &keyed{Backend: c}
		cfg := config(b)
		hs := make([]*keeper.Hold, 100)
		for i := range hs {
			hs[i] = acquire(t, b, cfg, fmt.Sprintf("k%d", i))
		}
		time.Sleep(50 * time.Millisecond)
		before, _ := b.counts()
		store.Restart(nil)
		at := time.Now()
		for _, h := range hs {
			h.RenewNow()
		}
		for _, h := range hs {
			<-h.Done()
			if r, _ := h.Reason(); r != keeper.LeaseLost {
				t.Errorf("reason %v, want LeaseLost", r)
			}
		}
		if d := time.Since(at); d != 0 {
			t.Errorf("stepped down %v after RenewNow, want at once", d)
		}
		if after, _ := b.counts(); after-before != 1 {
			t.Errorf("batch calls for 100 RenewNow: %d, want 1", after-before)
		}
		for _, h := range hs {
			release(t, h)
		}
	})
}

// MaxHold on a batched hold steps down at MaxHold and takes the hold out of
// the batches, so the store ends the lease one TTL later.
func TestBatchedMaxHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &keyed{Backend: c}
		cfg := config(b)
		cfg.MaxHold = 1100 * time.Millisecond
		t0 := time.Now()
		h := acquire(t, b, cfg, "k")
		other := acquire(t, b, config(b), "other")
		<-h.Done()
		if d := time.Since(t0); d != cfg.MaxHold {
			t.Errorf("stepped down at +%v, want MaxHold (%v)", d, cfg.MaxHold)
		}
		if r, _ := h.Reason(); r != keeper.MaxHold {
			t.Errorf("reason %v, want MaxHold", r)
		}
		_, before := b.counts()
		time.Sleep(cfg.TTL + time.Millisecond)
		_, after := b.counts()
		if after["k"] != before["k"] {
			t.Errorf("renewals after MaxHold: %d, want 0", after["k"]-before["k"])
		}
		if _, err := c.Get(t.Context(), "k"); !errors.Is(err, backend.ErrNotHeld) {
			t.Errorf("one TTL after MaxHold: %v, want the lease expired", err)
		}
		if !other.Held() {
			t.Error("the other hold stepped down")
		}
		release(t, h)
		release(t, other)
	})
}

// Extend on a batched hold moves its deadline past its batch's: a hung
// batch then steps it down at the deadline Extend set, not the batch's.
func TestBatchedExtendMovesTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &keyed{Backend: c}
		cfg := config(b)
		t0 := time.Now()
		a := acquire(t, b, cfg, "a")
		bb := acquire(t, b, cfg, "b")
		time.Sleep(300 * time.Millisecond) // renewed by the batch at +200ms
		if err := a.Extend(t.Context()); err != nil {
			t.Fatal(err)
		}
		c.Hang()
		<-bb.Done()
		if d := time.Since(t0); d != 900*time.Millisecond {
			t.Errorf("b stepped down at +%v, want +900ms", d)
		}
		<-a.Done()
		if d := time.Since(t0); d != time.Second {
			t.Errorf("a stepped down at +%v, want +1s (Extend at +300ms + 700ms)", d)
		}
		c.Heal()
		release(t, a)
		release(t, bb)
	})
}

// parallel renews in batches, recording each call's keys and send time
// and how many calls were in flight at once. While gate is closed, calls
// wait for it to open (or for their context to end); with hangFirst, the
// first call waits until its context ends. Every wait ends at quit, so
// that a test failing amid a wait leaves no goroutine blocked in its bubble.
type parallel struct {
	*memorybackend.Backend
	hangFirst bool
	quit      chan struct{}

	mu          sync.Mutex
	gate        chan struct{} // nil: calls go through
	calls       []batchCall
	inFlight    int
	maxInFlight int
}

// batchCall is one RenewBatch call as parallel saw it.
type batchCall struct {
	keys []string
	sent time.Time
}

func (b *parallel) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	keys := make([]string, len(leases))
	for i, l := range leases {
		keys[i] = l.Key
	}
	b.mu.Lock()
	first := len(b.calls) == 0
	b.calls = append(b.calls, batchCall{keys, time.Now()})
	b.inFlight++
	b.maxInFlight = max(b.maxInFlight, b.inFlight)
	gate := b.gate
	b.mu.Unlock()
	switch {
	case first && b.hangFirst:
		select {
		case <-ctx.Done():
		case <-b.quit:
		}
	case gate != nil:
		select {
		case <-gate:
		case <-ctx.Done():
		case <-b.quit:
		}
	}
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = b.Backend.Renew(ctx, l)
	}
	b.mu.Lock()
	b.inFlight--
	b.mu.Unlock()
	return errs
}

// newParallel returns a parallel over c, with its gate closed when gated.
func newParallel(c *memorybackend.Backend, gated, hangFirst bool) *parallel {
	b := &parallel{Backend: c, hangFirst: hangFirst, quit: make(chan struct{})}
	if gated {
		b.gate = make(chan struct{})
	}
	return b
}

// stop ends every wait, now and later, and waits for the calls to return.
// It must be called in the bubble.
func (b *parallel) stop() {
	close(b.quit)
	synctest.Wait()
}

// open lets the calls waiting at the gate, and every later one, through.
func (b *parallel) open() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.gate)
	b.gate = nil
}

// state returns the calls so far, how many are in flight, and the most
// that were in flight at once.
func (b *parallel) state() (calls []batchCall, inFlight, maxInFlight int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.calls), b.inFlight, b.maxInFlight
}

// A chunk whose call hangs until its timeout does not delay the other
// chunks of the same instant: they are sent at the instant, and the
// deadlines of their holds move from there, while the hung chunk's holds
// keep theirs (and are renewed once the call has timed out).
func TestHungChunkDelaysNoOther(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := newParallel(c, false, true)
		defer b.stop()
		cfg := config(b)
		const n = 2*coalesce.MaxBatch + 500 // three calls per instant
		t0 := time.Now()                    // on the grid: the first instant is at +200ms
		hs := startN(t, b, cfg, n, 0)
		at := t0.Add(cfg.RenewInterval)
		time.Sleep(250 * time.Millisecond) // the first call hangs until +400ms
		calls, inFlight, _ := b.state()
		if len(calls) != 3 || inFlight != 1 {
			t.Fatalf("calls at +250ms: %d sent, %d in flight; want 3 sent at the instant, the hung one in flight", len(calls), inFlight)
		}
		hung := make(map[string]bool, len(calls[0].keys))
		for _, k := range calls[0].keys {
			hung[k] = true
		}
		for i, call := range calls {
			if !call.sent.Equal(at) {
				t.Errorf("call %d of the instant sent at +%v, want +200ms", i, call.sent.Sub(t0))
			}
		}
		wrong := 0
		for _, h := range hs {
			st := h.Status()
			want := at // sent at the instant: its deadline moved
			if hung[h.Lease().Key] {
				want = t0 // in flight: still counted from its acquisition
			}
			if !h.Held() || !st.LastRenewal.Equal(want) || !st.Deadline.Equal(want.Add(cfg.RenewDeadline)) {
				if wrong++; wrong <= 3 {
					t.Errorf("%s (hung call: %v) at +250ms: held %v, last renewal +%v, deadline +%v; want held, +%v, +%v",
						h.Lease().Key, hung[h.Lease().Key], h.Held(), st.LastRenewal.Sub(t0), st.Deadline.Sub(t0),
						want.Sub(t0), want.Add(cfg.RenewDeadline).Sub(t0))
				}
			}
		}
		if wrong > 3 {
			t.Errorf("... %d holds in all not as wanted", wrong)
		}
		time.Sleep(time.Second) // the hung call's holds are retried after its timeout
		for _, h := range hs {
			if !h.Held() {
				t.Fatalf("%s not held 1s after a hung call of %d holds timed out", h.Lease().Key, len(hung))
			}
		}
		for _, h := range hs {
			release(t, h)
		}
	})
}

// An instant whose holds fill more calls than coalesce.MaxInFlight has that
// many in flight at once and never more (from as many goroutines, none per
// hold), sends the other chunks as calls return, and carries every hold
// due exactly once.
func TestChunksInFlightBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := newParallel(c, true, false)
		defer b.stop()
		cfg := config(b)
		const chunks = coalesce.MaxInFlight + 2
		const n = (chunks-1)*coalesce.MaxBatch + 100
		hs := startN(t, b, cfg, n, 0)
		synctest.Wait()
		base := bubbleGoroutines()
		time.Sleep(250 * time.Millisecond) // the instant at +200ms waits at the gate
		synctest.Wait()
		calls, inFlight, _ := b.state()
		if len(calls) != coalesce.MaxInFlight || inFlight != coalesce.MaxInFlight {
			t.Errorf("calls while the first ones wait: %d sent, %d in flight; want %d and %d (MaxInFlight)",
				len(calls), inFlight, coalesce.MaxInFlight, coalesce.MaxInFlight)
		}
		if g := bubbleGoroutines(); g != base+coalesce.MaxInFlight {
			t.Errorf("goroutines while %d calls wait: %d, want %d (the scheduler's, and one per further call in flight)",
				coalesce.MaxInFlight, g, base+coalesce.MaxInFlight)
		}
		b.open()
		synctest.Wait()
		calls, _, _ = b.state()
		if len(calls) != chunks {
			t.Fatalf("calls of the instant: %d, want %d", len(calls), chunks)
		}
		seen := make(map[string]int, n)
		for _, call := range calls {
			if len(call.keys) > coalesce.MaxBatch {
				t.Errorf("a call carried %d leases, more than MaxBatch (%d)", len(call.keys), coalesce.MaxBatch)
			}
			for _, k := range call.keys {
				seen[k]++
			}
		}
		for _, h := range hs {
			if k := h.Lease().Key; seen[k] != 1 {
				t.Fatalf("%s in %d calls of the instant, want 1", k, seen[k])
			}
		}
		time.Sleep(time.Second) // five more instants, through
		synctest.Wait()
		calls, _, most := b.state()
		if most != coalesce.MaxInFlight {
			t.Errorf("calls in flight at once: up to %d, want %d (MaxInFlight)", most, coalesce.MaxInFlight)
		}
		if len(calls) != 6*chunks {
			t.Errorf("calls after six instants: %d, want %d", len(calls), 6*chunks)
		}
		if g := bubbleGoroutines(); g != base {
			t.Errorf("goroutines between instants: %d, want %d (none)", g, base)
		}
		for _, h := range hs {
			if !h.Held() {
				t.Fatalf("%s not held", h.Lease().Key)
			}
		}
		for _, h := range hs {
			release(t, h)
		}
	})
}

// More holds than coalesce.MaxInFlight calls carry go out in more calls,
// each sent when one in flight returns; a hold released before its chunk's
// call starts is not in it.
func TestReleaseBeforeItsChunk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := newParallel(c, true, false)
		defer b.stop()
		cfg := config(b)
		const n = coalesce.MaxInFlight*coalesce.MaxBatch + 904 // one call more than in flight at once
		hs := startN(t, b, cfg, n, 0)
		time.Sleep(250 * time.Millisecond) // the instant's first calls wait at the gate
		calls, _, _ := b.state()
		if len(calls) != coalesce.MaxInFlight {
			t.Fatalf("calls while the first ones wait: %d, want %d (MaxInFlight)", len(calls), coalesce.MaxInFlight)
		}
		sent := make(map[string]bool, coalesce.MaxInFlight*coalesce.MaxBatch)
		for _, call := range calls {
			for _, k := range call.keys {
				sent[k] = true
			}
		}
		var later *keeper.Hold // a hold the last call would carry
		for _, h := range hs {
			if !sent[h.Lease().Key] {
				later = h
				break
			}
		}
		if len(sent) != coalesce.MaxInFlight*coalesce.MaxBatch || later == nil {
			t.Fatalf("the calls in flight carry %d leases, want %d of %d", len(sent), coalesce.MaxInFlight*coalesce.MaxBatch, n)
		}
		if err := later.Release(context.Background()); err != nil {
			t.Fatalf("Release: %v", err)
		}
		b.open()
		synctest.Wait()
		calls, _, _ = b.state()
		if len(calls) != coalesce.MaxInFlight+1 {
			t.Fatalf("calls at the first instant: %d, want %d", len(calls), coalesce.MaxInFlight+1)
		}
		last := calls[len(calls)-1].keys
		for _, k := range last {
			if k == later.Lease().Key {
				t.Errorf("%s renewed by the last call after its Release returned", k)
			}
		}
		if got, want := len(last), n-coalesce.MaxInFlight*coalesce.MaxBatch-1; got != want {
			t.Errorf("the last call carried %d leases, want %d", got, want)
		}
		for _, h := range hs {
			release(t, h)
		}
	})
}

// A pinned scheduler outlives its holds: short holds started one after
// another share it (no scheduler made and dropped per hold), it renews
// the next hold as before, and it is dropped once unpinned.
func TestPinnedSchedulerOutlivesItsHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &keyed{Backend: c}
		cfg := config(b)
		pin := keeper.NewPin(b, cfg.RenewInterval)
		if n := keeper.Schedulers(b); n != 1 {
			t.Fatalf("schedulers after Pin: %d, want 1", n)
		}
		first := acquire(t, b, cfg, "a")
		s := keeper.SchedulerOf(first)
		release(t, first)
		if n := keeper.Schedulers(b); n != 1 {
			t.Errorf("schedulers after the last hold of a pinned one left: %d, want 1 (kept)", n)
		}
		for i := range 3 {
			h := acquire(t, b, cfg, fmt.Sprintf("short%d", i))
			if got := keeper.SchedulerOf(h); got != s {
				t.Errorf("short hold %d: scheduler %p, want the pinned one %p", i, got, s)
			}
			release(t, h)
		}
		base := bubbleGoroutines()
		h := acquire(t, b, cfg, "b")
		time.Sleep(time.Second)
		synctest.Wait()
		if _, renews := b.counts(); !h.Held() || renews["b"] < 4 {
			t.Errorf("a hold on the pinned scheduler after 1s: held %v, %d renewals; want held, at least 4", h.Held(), renews["b"])
		}
		release(t, h)
		time.Sleep(time.Second) // its timers fire once more, for nothing
		synctest.Wait()
		if n := bubbleGoroutines(); n != base {
			t.Errorf("goroutines of an idle pinned scheduler: %d, want %d (none)", n, base)
		}
		pin.Unpin()
		pin.Unpin() // does nothing more
		if n := keeper.Schedulers(b); n != 0 {
			t.Errorf("schedulers after unpin: %d, want 0 (dropped)", n)
		}
		// A hold after that makes a new scheduler, dropped at its release.
		h = acquire(t, b, cfg, "c")
		if got := keeper.SchedulerOf(h); got == s || got == nil {
			t.Errorf("a hold after unpin: scheduler %p, want a new one (not %p)", got, s)
		}
		time.Sleep(time.Second)
		if !h.Held() {
			t.Error("a hold after unpin is not held after 1s")
		}
		release(t, h)
		if n := keeper.Schedulers(b); n != 0 {
			t.Errorf("schedulers after that hold's release: %d, want 0", n)
		}
	})
}

// nopBatcher renews and releases every lease at once, allocating nothing.
type nopBatcher struct{ backend.Backend }

func (*nopBatcher) RenewBatch(_ context.Context, leases []backend.Lease) []error {
	return make([]error, len(leases))
}

func (*nopBatcher) Release(context.Context, backend.Lease) error { return nil }

// Short holds started and released one after another on a pinned scheduler
// allocate nothing in the scheduler: they reuse it, its timers and its
// start bucket (one grid instant per interval, computed once). Only the
// Hold itself and Release's bounded context are allocated.
func TestShortHoldsOnAPinnedSchedulerAllocateNothing(t *testing.T) {
	b := &nopBatcher{}
	cfg := keeper.Config{Backend: b, TTL: time.Minute, RenewDeadline: 42 * time.Second,
		RenewInterval: 20 * time.Second, RequestTimeout: 12 * time.Second}
	defer keeper.NewPin(b, cfg.RenewInterval).Unpin()
	lease := backend.Lease{Key: "k", HolderID: "a", Token: "t", Term: 1, TTL: cfg.TTL}
	ctx := context.Background()
	pair := func() {
		h := keeper.Start(ctx, cfg, lease, time.Now())
		if err := h.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pair() // the first hold arms the timers and makes the bucket
	bounded := testing.AllocsPerRun(100, func() {
		c, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
		_ = c.Done()
		cancel()
	})
	got := testing.AllocsPerRun(100, pair)
	if want := 1 + bounded; got > want {
		t.Errorf("allocations per short hold: %v, want at most %v (the Hold, and %v for Release's context)", got, want, bounded)
	}
}

// An instant allocates per call, not per hold, and sending its chunks with
// several calls in flight adds next to nothing: an instant of three chunks
// allocates no more than three instants of one chunk, but for each further
// call in flight the goroutine that sends it.
func TestInstantAllocations(t *testing.T) {
	ctx := context.Background()
	perInstant := func(n int) float64 {
		b := &nopBatcher{}
		// A day's interval: the scheduler's own timer does not fire
		// while allocations are counted.
		cfg := keeper.Config{Backend: b, TTL: 100 * time.Hour, RenewDeadline: 70 * time.Hour,
			RenewInterval: 24 * time.Hour, RequestTimeout: 12 * time.Second}
		hs := make([]*keeper.Hold, n)
		for i := range hs {
			l := backend.Lease{Key: fmt.Sprintf("k%d", i), HolderID: "a", Token: "t", Term: 1, TTL: cfg.TTL}
			hs[i] = keeper.Start(ctx, cfg, l, time.Now())
		}
		keeper.RenewAllNow(hs[0]) // grows the buffers
		got := testing.AllocsPerRun(20, func() { keeper.RenewAllNow(hs[0]) })
		for _, h := range hs {
			if err := h.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return got
	}
	// The least of a few measures: a loaded machine only adds
	// allocations (calls in flight that spill to goroutines), never
	// takes one away.
	least := func(n int) float64 {
		m := perInstant(n)
		for range 2 {
			m = min(m, perInstant(n))
		}
		return m
	}
	one := least(coalesce.MaxBatch)
	three := least(3 * coalesce.MaxBatch)
	t.Logf("allocations per instant: %v for one chunk, %v for three", one, three)
	if want := 3*one + 2*2; three > want {
		t.Errorf("allocations per instant of three chunks: %v, want at most %v (3 × %v for one chunk, and 2 for each of 2 further calls in flight)", three, want, one)
	}
}

// Forget, a cleanup's Unpin, drops a scheduler whose timers belong to a
// synctest bubble from outside that bubble without touching them (stopping
// them there would be fatal): it only leaves the registry.
func TestForgetOutsideTheBubble(t *testing.T) {
	var (
		pin *keeper.Pin
		b   *keyed
	)
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b = &keyed{Backend: c}
		cfg := config(b)
		pin = keeper.NewPin(b, cfg.RenewInterval)
		release(t, acquire(t, b, cfg, "a")) // arms the scheduler's timers
	})
	pin.Forget()
	pin.Forget() // does nothing more
	if n := keeper.Schedulers(b); n != 0 {
		t.Errorf("schedulers after Forget: %d, want 0", n)
	}
}

// MaxHold counts from the send time of the acquisition, not from Start: an
// acquisition whose answer took 100ms steps down MaxHold after it was sent,
// both ways of renewing.
func TestMaxHoldCountsFromTheAcquisition(t *testing.T) {
	for _, batched := range []bool{false, true} {
		name := "one by one"
		if batched {
			name = "batched"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := memorybackend.NewStore().Client()
				defer c.Close()
				var b backend.Backend = c
				if batched {
					b = &keyed{Backend: c}
				}
				cfg := config(b)
				cfg.MaxHold = 1100 * time.Millisecond
				c.SetLatency(100 * time.Millisecond)
				t0 := time.Now()
				h := acquire(t, b, cfg, "k")
				c.SetLatency(0)
				if batched != (keeper.SchedulerOf(h) != nil) {
					t.Fatalf("renewed through a scheduler: %v, want %v", keeper.SchedulerOf(h) != nil, batched)
				}
				within(t, h.Done(), 3*time.Second, "step-down at MaxHold")
				if d := time.Since(t0); d != cfg.MaxHold {
					t.Errorf("stepped down %v after the acquisition was sent, want MaxHold (%v)", d, cfg.MaxHold)
				}
				if r, _ := h.Reason(); r != keeper.MaxHold {
					t.Errorf("reason %v, want MaxHold", r)
				}
				release(t, h)
			})
		})
	}
}

// RenewNow on a batched hold whose batch is in flight has it renewed again
// as soon as that call ends, not at the next instant of the grid.
func TestBatchedRenewNowDuringItsBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &keyed{Backend: c}
		t0 := time.Now()
		h := acquire(t, b, config(b), "k") // renewed at the 200ms instants
		c.SetLatency(50 * time.Millisecond)
		time.Sleep(210 * time.Millisecond) // the 200ms batch is in flight
		h.RenewNow()
		time.Sleep(100 * time.Millisecond)
		if n, _ := b.counts(); n != 2 {
			t.Errorf("batch calls by 310ms: got %d, want 2 (the 200ms one, then RenewNow's as it ended at 250ms)", n)
		}
		if got := h.Deadline().Sub(t0); got != 950*time.Millisecond {
			t.Errorf("deadline %v, want 950ms (RenewNow's renewal, sent at 250ms, + 700ms)", got)
		}
		c.SetLatency(0)
		release(t, h)
	})
}

// Batched holds started in the same interval share a bucket; each still
// steps down at its own deadline when it is the earliest, not at the
// deadline of the first hold that joined.
func TestBatchedHoldsStartedTogetherEachAtItsOwnDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &keyed{Backend: c}
		cfg := config(b) // TTL 1s, RenewDeadline 700ms: a margin of 300ms
		t0 := time.Now()
		first := acquire(t, b, cfg, "k1")
		l, err := b.Acquire(t.Context(), backend.AcquireRequest{Key: "k2", HolderID: "a", TTL: 450 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		short := keeper.Start(t.Context(), cfg, l, t0) // deadline 150ms: the granted 450ms less the margin
		if keeper.SchedulerOf(short) != keeper.SchedulerOf(first) {
			t.Fatal("the two holds renew through different schedulers")
		}
		within(t, short.Done(), 2*time.Second, "step-down of the shorter lease")
		if d := time.Since(t0); d != 150*time.Millisecond {
			t.Errorf("the shorter lease stepped down at %v, want its deadline, 150ms", d)
		}
		if !first.Held() {
			t.Error("the first hold stepped down")
		}
		release(t, short)
		release(t, first)
	})
}

// batchHangs renews in batches that hang until their context ends (with
// firstOnly, only the first; the others renew in the store), while single
// renewals (Extend) go through.
type batchHangs struct {
	*memorybackend.Backend
	firstOnly bool // only the first call hangs; the others renew in the store
	mu        sync.Mutex
	calls     [][2]time.Time // sent, returned
}

func (b *batchHangs) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	sent := time.Now()
	b.mu.Lock()
	hang := !b.firstOnly || len(b.calls) == 0
	b.mu.Unlock()
	errs := make([]error, len(leases))
	if hang {
		<-ctx.Done()
	}
	for i, l := range leases {
		if hang {
			errs[i] = ctx.Err()
		} else {
			errs[i] = b.Renew(ctx, l)
		}
	}
	b.mu.Lock()
	b.calls = append(b.calls, [2]time.Time{sent, time.Now()})
	b.mu.Unlock()
	return errs
}

// A batched hold extended after its bucket fired (and sorted it by
// deadline) is watched at the deadline Extend set: while its batches hang,
// it steps down there, not at whichever later renewal instant looks.
func TestBatchedExtendAfterItsBucketFired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchHangs{Backend: c}
		cfg := config(b) // margin 300ms, RenewDeadline 700ms, every 200ms, requests 200ms
		t0 := time.Now()
		h := acquire(t, b, cfg, "k1") // deadline 700ms
		l, err := b.Acquire(t.Context(), backend.AcquireRequest{Key: "k2", HolderID: "a", TTL: 450 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		short := keeper.Start(t.Context(), cfg, l, t0) // deadline 150ms: their bucket fires then
		within(t, short.Done(), 2*time.Second, "step-down of the shorter lease")
		time.Sleep(520*time.Millisecond - time.Since(t0))
		if err := h.Extend(t.Context()); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		within(t, h.Done(), 3*time.Second, "step-down of the extended hold")
		if d := time.Since(t0); d != 1220*time.Millisecond {
			t.Errorf("stepped down at %v, want the deadline Extend set, 1.22s (Extend at 520ms + 700ms)", d)
		}
		release(t, short)
		release(t, h)
	})
}

// A batched hold whose deadline is earlier than every other watched one
// moves the deadline timer earlier: it steps down at its deadline, not at
// the one the timer was armed for, nor at the next renewal instant.
func TestBatchedHoldWithTheEarliestDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchHangs{Backend: c}
		cfg := config(b) // margin 300ms
		t0 := time.Now()
		first := acquire(t, b, cfg, "k1") // deadline 700ms: the timer is armed for it
		time.Sleep(250 * time.Millisecond)
		l, err := b.Acquire(t.Context(), backend.AcquireRequest{Key: "k2", HolderID: "a", TTL: 430 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		short := keeper.Start(t.Context(), cfg, l, time.Now()) // deadline 380ms
		within(t, short.Done(), 2*time.Second, "step-down of the shorter lease")
		if d := time.Since(t0); d != 380*time.Millisecond {
			t.Errorf("stepped down at %v, want its deadline, 380ms", d)
		}
		release(t, short)
		release(t, first)
	})
}

// A hold started after a grid instant is due at the next one, not at once:
// even when it starts right after holds that began in the interval before
// it (and whose start instant has passed).
func TestBatchedHoldStartedAfterAnInstantWaitsForTheNext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &keyed{Backend: c}
		cfg := config(b) // renewed at the 200ms instants
		first := acquire(t, b, cfg, "k1")
		time.Sleep(250 * time.Millisecond)
		second := acquire(t, b, cfg, "k2")
		time.Sleep(100 * time.Millisecond) // 350ms
		if _, renews := b.counts(); renews["k1"] != 1 || renews["k2"] != 0 {
			t.Errorf("renewals by 350ms: %v, want k1 1 (at 200ms) and k2 0 (due at 400ms)", renews)
		}
		time.Sleep(100 * time.Millisecond) // 450ms
		if batches, renews := b.counts(); batches != 2 || renews["k1"] != 2 || renews["k2"] != 1 {
			t.Errorf("by 450ms: %d batches renewing %v, want 2 batches, the 400ms one renewing both", batches, renews)
		}
		release(t, second)
		release(t, first)
	})
}

// A batch call carrying holds of different RequestTimeouts is bounded by
// the longest, so no hold's renewal is cut sooner than its own timeout.
func TestBatchBoundedByTheLongestRequestTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchHangs{Backend: c}
		long, short := config(b), config(b)
		long.RequestTimeout, short.RequestTimeout = 300*time.Millisecond, 100*time.Millisecond
		h1 := acquire(t, b, long, "k1")
		h2 := acquire(t, b, short, "k2")
		if keeper.SchedulerOf(h1) != keeper.SchedulerOf(h2) {
			t.Fatal("the two holds renew through different schedulers")
		}
		time.Sleep(550 * time.Millisecond) // the 200ms batch was cut
		b.mu.Lock()
		calls := slices.Clone(b.calls)
		b.mu.Unlock()
		if len(calls) == 0 {
			t.Fatal("no batch call ended by 550ms")
		}
		if d := calls[0][1].Sub(calls[0][0]); d != 300*time.Millisecond {
			t.Errorf("the batch call was cut after %v, want the longest RequestTimeout, 300ms", d)
		}
		release(t, h1)
		release(t, h2)
	})
}

// within waits for ch for at most limit (of the bubble's time), and fails
// t when it is not closed by then: a hold that never steps down fails the
// test instead of hanging it.
func within(t *testing.T, ch <-chan struct{}, limit time.Duration, what string) {
	t.Helper()
	timer := time.NewTimer(limit)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("%s: not within %v", what, limit)
	}
}

// shortAnswer renews in batches in the store but answers one result fewer
// than it was sent leases, as a faulty backend might.
type shortAnswer struct{ *memorybackend.Backend }

func (b shortAnswer) RenewBatch(ctx context.Context, leases []backend.Lease) []error {
	errs := make([]error, len(leases))
	for i, l := range leases {
		errs[i] = b.Renew(ctx, l)
	}
	return errs[:len(errs)-1]
}

// A lease the batch's answer says nothing of is not renewed as far as the
// holder knows: its deadline does not move, and the renewal counts as
// failed.
func TestBatchAnswerMissingALease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := shortAnswer{c}
		h := acquire(t, b, config(b), "k") // renewed at the 200ms instants, deadline 700ms
		before := h.Deadline()
		time.Sleep(230 * time.Millisecond) // the 200ms batch answered, its retry not yet due (250ms)
		s := h.Status()
		if !s.Deadline.Equal(before) {
			t.Errorf("deadline moved by %v with no answer for the lease, want it unchanged", s.Deadline.Sub(before))
		}
		if s.Failures != 1 || s.LastError == nil {
			t.Errorf("Failures %d, LastError %v; want 1 and an error naming the short answer", s.Failures, s.LastError)
		}
		release(t, h)
	})
}

// At RenewInterval TTL/2 (the default), a batch that hangs is cut after a
// quarter interval (AttemptBound), not at RequestTimeout, and sent again
// at once, before the deadline: its holds survive one hung call.
func TestHungBatchLeavesTimeForItsRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memorybackend.NewStore().Client()
		defer c.Close()
		b := &batchHangs{Backend: c, firstOnly: true}
		cfg := config(b) // RenewDeadline 700ms
		cfg.RenewInterval = 500 * time.Millisecond
		cfg.RequestTimeout = 200 * time.Millisecond
		h := acquire(t, b, cfg, "k1")
		time.Sleep(2 * time.Second)
		if !h.Held() {
			r, cause := h.Reason()
			t.Fatalf("stepped down (%v: %v) after one batch hung; want it cut at RenewInterval/4 and sent again", r, cause)
		}
		b.mu.Lock()
		calls := slices.Clone(b.calls)
		b.mu.Unlock()
		if len(calls) < 2 {
			t.Fatalf("%d batch calls in 2s, want the hung one and its retry", len(calls))
		}
		if d := calls[0][1].Sub(calls[0][0]); d != 125*time.Millisecond {
			t.Errorf("the hung batch was cut after %v, want RenewInterval/4 = 125ms", d)
		}
		if d := calls[1][0].Sub(calls[0][1]); d != 0 {
			t.Errorf("the retry went %v after the hung batch was cut, want at once", d)
		}
		release(t, h)
	})
}
