package lock_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

var (
	sharedOpts = &lock.AcquireOptions{Mode: lock.Shared}
	hier       = &lock.AcquireOptions{Hierarchical: true}
	hierShared = &lock.AcquireOptions{Hierarchical: true, Mode: lock.Shared}
)

func semaphore(n int) *lock.AcquireOptions { return &lock.AcquireOptions{Mode: lock.Shared, Limit: n} }

// heldBy returns err's *HeldError, failing the test when it is not one.
func heldBy(t *testing.T, what string, err error) *lock.HeldError {
	t.Helper()
	var he *lock.HeldError
	if !errors.As(err, &he) || !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("%s: got %v, want a *HeldError", what, err)
	}
	return he
}

func holderIDs(recs []backend.Record) []string {
	var ids []string
	for _, r := range recs {
		ids = append(ids, r.HolderID+"@"+r.Key)
	}
	return ids
}

// TestShared: Shared holders each have their own entry, term, metadata and
// handle; an Exclusive acquisition sees them all; everything a handle does
// works for each of them.
func TestShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ac := client(t, store)
		alice := newLocker(t, ac, "alice", fastOpts())
		bob := newLocker(t, client(t, store), "bob", fastOpts())
		carol := newLocker(t, client(t, store), "carol", fastOpts())

		la, err := alice.TryAcquire(t.Context(), "schema/users", &lock.AcquireOptions{Mode: lock.Shared, Metadata: map[string]string{"r": "a"}})
		if err != nil {
			t.Fatalf("alice Shared: %v", err)
		}
		time.Sleep(time.Second) // alice is the oldest
		lb, err := bob.TryAcquire(t.Context(), "schema/users", &lock.AcquireOptions{Mode: lock.Shared, Metadata: map[string]string{"r": "b"}})
		if err != nil {
			t.Fatalf("bob Shared: %v", err)
		}
		if lb.Term() <= la.Term() || la.Mode() != lock.Shared || la.Record().Mode != lock.Shared {
			t.Errorf("bob's term %d after alice's %d, mode %v; want a higher term, shared", lb.Term(), la.Term(), la.Mode())
		}
		_, err = carol.TryAcquire(t.Context(), "schema/users", nil)
		he := heldBy(t, "carol Exclusive", err)
		if got := holderIDs(he.Holders); !slices.Equal(got, []string{"alice@schema/users", "bob@schema/users"}) {
			t.Errorf("HeldError.Holders: got %v, want alice and bob on schema/users", got)
		}
		if he.Holder.HolderID != "alice" || he.Holder.Mode != lock.Shared || he.Holders[1].Metadata["r"] != "b" {
			t.Errorf("HeldError.Holder: got %+v, want alice (the oldest), shared; bob's metadata r=b", he.Holder)
		}
		if msg := err.Error(); !strings.Contains(msg, `held by 2 shared holders, the oldest "alice"`) {
			t.Errorf("message: got %q, want it to say 2 shared holders, the oldest alice", msg)
		}
		hs, err := carol.Holders(t.Context(), "schema/users")
		if err != nil || !slices.Equal(holderIDs(hs), []string{"alice@schema/users", "bob@schema/users"}) {
			t.Errorf("Holders: got %v, %v; want alice, bob", holderIDs(hs), err)
		}
		recs, err := carol.List(t.Context(), "schema/")
		if err != nil || len(recs) != 2 || recs[0].Term != la.Term() || recs[1].Term != lb.Term() {
			t.Errorf("List: got %+v, %v; want one record per holder in term order", recs, err)
		}

		// The handle works for a holder that is not the oldest.
		if err := lb.Verify(t.Context()); err != nil {
			t.Errorf("bob Verify: %v", err)
		}
		if err := lb.Extend(t.Context()); err != nil {
			t.Errorf("bob Extend: %v", err)
		}
		if err := lb.SetMetadata(t.Context(), map[string]string{"progress": "1/2"}); err != nil {
			t.Errorf("bob SetMetadata: %v", err)
		}
		hs, _ = carol.Holders(t.Context(), "schema/users")
		if len(hs) != 2 || hs[1].Metadata["progress"] != "1/2" || hs[0].Metadata["r"] != "a" {
			t.Errorf("after SetMetadata: got %+v, want bob's progress 1/2 and alice's r=a", hs)
		}
		time.Sleep(3 * time.Second) // both renewed many times over
		if !la.Held() || !lb.Held() {
			t.Fatalf("after 3 TTLs: alice held %v, bob held %v; want both renewed", la.Held(), lb.Held())
		}

		// Loss of one Shared holder cancels its context only.
		ac.Partition()
		<-la.Done()
		if err := la.Err(); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("alice's cause after a partition: got %v, want ErrLockLost", err)
		}
		if !lb.Held() {
			t.Error("bob lost his Shared lock when alice was cut off")
		}
		time.Sleep(time.Second) // alice's entry expires at the store
		if hs, _ := carol.Holders(t.Context(), "schema/users"); !slices.Equal(holderIDs(hs), []string{"bob@schema/users"}) {
			t.Errorf("Holders after alice's entry expired: got %v, want bob only", holderIDs(hs))
		}
		ac.Heal()
		if err := la.Release(t.Context()); !errors.Is(err, lock.ErrLockLost) {
			t.Errorf("alice's Release after the loss: got %v, want ErrLockLost", err)
		}
		if err := lb.Release(t.Context()); err != nil {
			t.Errorf("bob's Release: %v", err)
		}
		lc, err := carol.TryAcquire(t.Context(), "schema/users", nil)
		if err != nil {
			t.Fatalf("carol Exclusive after the Shared holders left: %v", err)
		}
		if lc.Term() <= lb.Term() {
			t.Errorf("carol's term %d, want more than bob's %d", lc.Term(), lb.Term())
		}
		_, err = alice.TryAcquire(t.Context(), "schema/users", sharedOpts)
		if he := heldBy(t, "alice Shared while carol holds it exclusively", err); he.Holder.HolderID != "carol" {
			t.Errorf("holder: got %q, want carol", he.Holder.HolderID)
		}
		lc.Release(t.Context())
	})
}

// TestSharedLocalHolders: goroutines of one Locker hold a Shared lock at
// once; the local queue does not serialise them.
func TestSharedLocalHolders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		l := newLocker(t, client(t, store), "readers", fastOpts())
		other := newLocker(t, client(t, store), "other", fastOpts())
		const n = 5
		var (
			wg        sync.WaitGroup
			in, maxIn atomic.Int64
		)
		release := make(chan struct{})
		start := time.Now()
		for range n {
			wg.Go(func() {
				err := l.Do(t.Context(), "docs/1", sharedOpts, func(ctx context.Context, lk *lock.Lock) error {
					if c := in.Add(1); c > maxIn.Load() {
						maxIn.Store(c)
					}
					<-release
					in.Add(-1)
					return nil
				})
				if err != nil {
					t.Errorf("Do: %v", err)
				}
			})
		}
		synctest.Wait()
		if got := maxIn.Load(); got != n || time.Since(start) != 0 {
			t.Errorf("Shared holders of one Locker at once: got %d after %v, want %d at once", got, time.Since(start), n)
		}
		if hs, _ := other.Holders(t.Context(), "docs/1"); len(hs) != n {
			t.Errorf("Holders: got %d, want %d", len(hs), n)
		}
		close(release)
		wg.Wait()
	})
}

// readerStream runs readers that take key Shared for hold each, staggered
// so that there is always one holding it, until ctx ends.
func readerStream(ctx context.Context, t *testing.T, store *memorybackend.Store, key string, ms *backend.ModeSupport) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range 3 {
		c := client(t, store)
		if ms != nil {
			c.SetModeSupport(*ms)
		}
		r := newLocker(t, c, fmt.Sprintf("reader-%d", i), fastOpts())
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
			for ctx.Err() == nil {
				lk, err := r.Acquire(ctx, key, sharedOpts)
				if err != nil {
					return
				}
				time.Sleep(300 * time.Millisecond)
				lk.Release(context.Background())
			}
		})
	}
	return &wg
}

// TestWriterPreference: a waiting Exclusive acquirer blocks new Shared
// holders, so a stream of overlapping readers cannot starve it; without
// writer preference (the control) the same stream does.
func TestWriterPreference(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ctx, stop := context.WithCancel(t.Context())
		readers := readerStream(ctx, t, store, "schema/orders", nil)
		time.Sleep(time.Second) // the stream is going: the key is never free
		writer := newLocker(t, client(t, store), "writer", fastOpts())
		start := time.Now()
		wctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		lw, err := writer.Acquire(wctx, "schema/orders", nil)
		if err != nil {
			stop()
			readers.Wait()
			t.Fatalf("writer Acquire: %v", err)
		}
		// The readers holding it when the writer registered finish (300ms
		// each); nobody new gets in.
		if d := time.Since(start); d > 400*time.Millisecond {
			t.Errorf("writer waited %v, want at most one reader's hold (300ms)", d)
		}
		probe := newLocker(t, client(t, store), "probe", fastOpts())
		if _, err := probe.TryAcquire(t.Context(), "schema/orders", sharedOpts); !errors.Is(err, lock.ErrHeld) {
			t.Errorf("a reader while the writer holds it: got %v, want ErrHeld", err)
		}
		time.Sleep(500 * time.Millisecond)
		lw.Release(t.Context())
		stop()
		readers.Wait()
	})
	t.Run("registered writer refuses new readers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			r1 := newLocker(t, client(t, store), "r1", fastOpts())
			r2 := newLocker(t, client(t, store), "r2", fastOpts())
			wc := client(t, store)
			wc.SetLatency(100 * time.Millisecond) // a slow round trip
			w := newLocker(t, wc, "w", fastOpts())
			// r1's TTL is 10 times the writer's: the writer re-tries
			// before its own registration lapses, not when r1 might expire.
			l1, err := r1.TryAcquire(t.Context(), "k", &lock.AcquireOptions{Mode: lock.Shared, TTL: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan *lock.Lock, 1)
			go func() {
				lw, err := w.Acquire(t.Context(), "k", nil)
				if err != nil {
					t.Errorf("writer Acquire: %v", err)
				}
				got <- lw
			}()
			time.Sleep(time.Second) // a slow watch and two slow attempts: held, registered
			_, err = r2.TryAcquire(t.Context(), "k", sharedOpts)
			if he := heldBy(t, "r2 Shared while a writer waits", err); he.Waiting != 1 {
				t.Errorf("HeldError.Waiting: got %d, want 1 (the writer)", he.Waiting)
			}
			// The writer keeps its registration alive, with a margin for
			// its slow round trips: it never lapses, not for a moment.
			for range 100 {
				time.Sleep(50 * time.Millisecond)
				if _, err := r2.TryAcquire(t.Context(), "k", sharedOpts); !errors.Is(err, lock.ErrHeld) {
					t.Fatalf("r2 Shared while the writer waits: got %v, want ErrHeld (the registration must not lapse)", err)
				}
			}
			releasedAt := time.Now()
			l1.Release(t.Context())
			lw := <-got
			if d := time.Since(releasedAt); d > 100*time.Millisecond {
				t.Errorf("writer acquired %v after the last reader left, want at once (one slow round trip)", d)
			}
			lw.Release(t.Context())
			l2, err := r2.TryAcquire(t.Context(), "k", sharedOpts)
			if err != nil {
				t.Fatalf("r2 Shared after the writer: %v (its registration must be gone)", err)
			}
			l2.Release(t.Context())
		})
	})
	t.Run("a writer that gives up withdraws", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			r1 := newLocker(t, client(t, store), "r1", fastOpts())
			r2 := newLocker(t, client(t, store), "r2", fastOpts())
			w := newLocker(t, client(t, store), "w", fastOpts())
			l1, err := r1.TryAcquire(t.Context(), "k", sharedOpts)
			if err != nil {
				t.Fatal(err)
			}
			defer l1.Release(t.Context())
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			if _, err := w.Acquire(ctx, "k", nil); !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("writer Acquire: got %v, want ErrHeld and DeadlineExceeded", err)
			}
			// At once, not after the registration's TTL.
			l2, err := r2.TryAcquire(t.Context(), "k", sharedOpts)
			if err != nil {
				t.Fatalf("r2 Shared right after the writer gave up: %v, want it acquired", err)
			}
			l2.Release(t.Context())
		})
	})
	t.Run("control: without writer preference readers starve the writer", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			ctx, stop := context.WithCancel(t.Context())
			readers := readerStream(ctx, t, store, "schema/orders", &backend.ModeSupport{Shared: true})
			time.Sleep(time.Second)
			writer := newLocker(t, client(t, store), "writer", fastOpts())
			wctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if _, err := writer.Acquire(wctx, "schema/orders", nil); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("writer Acquire without writer preference: got %v, want starved until its deadline", err)
			}
			stop()
			readers.Wait()
		})
	})
}

// TestSemaphore: 50 concurrent acquirers of a semaphore of 3: never more
// than 3 hold it at once, 3 do most of the time, and every one is served.
func TestSemaphore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		const n, limit = 50, 3
		var (
			wg          sync.WaitGroup
			in, maxIn   atomic.Int64
			served      atomic.Int64
			lockers     []*lock.Locker
			observerErr error
		)
		for i := range 10 { // 10 processes of 5 goroutines each
			lockers = append(lockers, newLocker(t, client(t, store), fmt.Sprintf("worker-%d", i), fastOpts()))
		}
		observer := newLocker(t, client(t, store), "observer", fastOpts())
		start := time.Now()
		for i := range n {
			wg.Go(func() {
				err := lockers[i%len(lockers)].Do(t.Context(), "extract/tenant-1", semaphore(limit), func(ctx context.Context, lk *lock.Lock) error {
					c := in.Add(1)
					for m := maxIn.Load(); c > m && !maxIn.CompareAndSwap(m, c); m = maxIn.Load() {
					}
					if hs, err := observer.Holders(ctx, "extract/tenant-1"); err != nil || len(hs) > limit {
						observerErr = fmt.Errorf("holders at the store: got %d, %v; want at most %d", len(hs), err, limit)
					}
					time.Sleep(100 * time.Millisecond)
					in.Add(-1)
					served.Add(1)
					return nil
				})
				if err != nil {
					t.Errorf("acquirer %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		if observerErr != nil {
			t.Error(observerErr)
		}
		if got := served.Load(); got != n {
			t.Errorf("served: got %d, want %d", got, n)
		}
		if got := maxIn.Load(); got != limit {
			t.Errorf("most holders at once: got %d, want %d", got, limit)
		}
		// 50 holds of 100ms through 3 permits: 17 rounds if hand-over is
		// immediate.
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("50 holds of 100ms through 3 permits took %v, want permits handed over at once (about 1.7s)", d)
		}
	})
	t.Run("limit mismatch", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			a := newLocker(t, client(t, store), "a", fastOpts())
			b := newLocker(t, client(t, store), "b", fastOpts())
			la, err := a.TryAcquire(t.Context(), "k", semaphore(3))
			if err != nil {
				t.Fatal(err)
			}
			defer la.Release(t.Context())
			for _, ao := range []*lock.AcquireOptions{semaphore(2), sharedOpts} {
				if _, err := b.TryAcquire(t.Context(), "k", ao); !errors.Is(err, lock.ErrLimitMismatch) || !errors.Is(err, backend.ErrLimitMismatch) {
					t.Errorf("TryAcquire(limit %d) against limit 3: got %v, want ErrLimitMismatch", ao.Limit, err)
				}
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				if _, err := b.Acquire(ctx, "k", ao); !errors.Is(err, lock.ErrLimitMismatch) {
					t.Errorf("Acquire(limit %d) against limit 3: got %v, want ErrLimitMismatch at once", ao.Limit, err)
				}
				cancel()
			}
			if _, err := b.TryAcquire(t.Context(), "k", &lock.AcquireOptions{Limit: 2}); !errors.Is(err, lock.ErrInvalidOptions) {
				t.Errorf("Limit on an Exclusive lock: got %v, want ErrInvalidOptions", err)
			}
		})
	})
}

// TestCrashedPermitHolder: a permit holder whose process stops renewing
// (cut off from the store) frees its slot after its TTL at the store, and a
// waiter gets the permit then, not before.
func TestCrashedPermitHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		cc := client(t, store)
		crashed := newLocker(t, cc, "crashed", fastOpts())
		alive := newLocker(t, client(t, store), "alive", fastOpts())
		waiter := newLocker(t, client(t, store), "waiter", fastOpts())
		t0 := time.Now()
		lc, err := crashed.TryAcquire(t.Context(), "extract/t", semaphore(2))
		if err != nil {
			t.Fatal(err)
		}
		la, err := alive.TryAcquire(t.Context(), "extract/t", semaphore(2))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		cc.Partition() // the process is gone for the store
		hs, err := alive.Holders(t.Context(), "extract/t")
		if err != nil || len(hs) != 2 || hs[0].HolderID != "crashed" {
			t.Fatalf("Holders: got %v, %v; want crashed and alive", holderIDs(hs), err)
		}
		expiry := time.Since(t0) + hs[0].TTL // its last renewal + TTL
		got := make(chan time.Duration, 1)
		go func() {
			// Bounded (virtual time), so a permit that never frees fails the test instead of hanging it.
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			lw, err := waiter.Acquire(ctx, "extract/t", semaphore(2))
			if err != nil {
				t.Errorf("waiter Acquire: %v", err)
				got <- 0
				return
			}
			got <- time.Since(t0)
			lw.Release(context.Background())
		}()
		// The store keeps the crashed holder's entry until its last renewal
		// + TTL (1s), and not a moment longer.
		if d := <-got; d != expiry || expiry < time.Second {
			t.Errorf("waiter got the permit %v after the start, want at %v (the crashed holder's expiry, at least 1s)", d, expiry)
		}
		if lc.Held() {
			t.Error("the crashed holder still believes it holds a permit")
		}
		if !la.Held() {
			t.Error("the live holder lost its permit")
		}
		la.Release(t.Context())
		cc.Heal()
		lc.Release(t.Context())
	})
}

// TestHierarchy: a page lock conflicts with an Exclusive lock on its file
// set and not with other pages; an Exclusive file-set lock waits for every
// page lock below it; a page lock waits for the file-set lock above it, woken
// by its release.
func TestHierarchy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a := newLocker(t, client(t, store), "a", fastOpts())
		b := newLocker(t, client(t, store), "b", fastOpts())

		p1, err := a.TryAcquire(t.Context(), "files/set1/page1", hier)
		if err != nil {
			t.Fatalf("page1: %v", err)
		}
		p2, err := b.TryAcquire(t.Context(), "files/set1/page2", hier)
		if err != nil {
			t.Fatalf("page2 beside page1: %v", err)
		}
		for _, ao := range []*lock.AcquireOptions{nil, hier, hierShared} {
			_, err = b.TryAcquire(t.Context(), "files/set1", ao)
			he := heldBy(t, fmt.Sprintf("file set (%+v) over two page locks", ao), err)
			if got := holderIDs(he.Holders); !slices.Equal(got, []string{"a@files/set1/page1", "b@files/set1/page2"}) {
				t.Errorf("file set (%+v): HeldError.Holders got %v, want the two page locks", ao, got)
			}
		}
		if _, err := b.TryAcquire(t.Context(), "files", nil); !errors.Is(err, lock.ErrHeld) {
			t.Errorf("the top level over page locks: got %v, want ErrHeld", err)
		}
		if lk, err := b.TryAcquire(t.Context(), "files/set2", hier); err != nil {
			t.Errorf("another file set: %v", err)
		} else {
			lk.Release(t.Context())
		}

		// The file-set lock waits for both pages.
		got := make(chan time.Time, 1)
		go func() {
			ls, err := b.Acquire(t.Context(), "files/set1", hier)
			if err != nil {
				t.Errorf("file set Acquire: %v", err)
				got <- time.Time{}
				return
			}
			got <- time.Now()
			time.Sleep(time.Second)
			ls.Release(context.Background())
		}()
		time.Sleep(time.Second)
		p1.Release(t.Context())
		synctest.Wait()
		select {
		case <-got:
			t.Fatal("the file-set lock was acquired while page2 was held")
		default:
		}
		time.Sleep(time.Second)
		releasedAt := time.Now()
		p2.Release(t.Context())
		fsAt := <-got
		if !fsAt.Equal(releasedAt) {
			t.Errorf("file-set lock acquired %v after the last page's release, want at once", fsAt.Sub(releasedAt))
		}

		// Now the file set is held: a page lock waits for it, woken by its
		// release (published on the file set's key, which it watches).
		_, err = a.TryAcquire(t.Context(), "files/set1/page3", hierShared)
		if he := heldBy(t, "a page under a held file set", err); he.Holder.Key != "files/set1" || !strings.Contains(err.Error(), `conflicts with lock "files/set1"`) {
			t.Errorf("HeldError: got holder key %q, message %q; want the file set named", he.Holder.Key, err)
		}
		lp, err := a.Acquire(t.Context(), "files/set1/page3", hier)
		if err != nil {
			t.Fatalf("page3 Acquire: %v", err)
		}
		if want := fsAt.Add(time.Second); !time.Now().Equal(want) {
			t.Errorf("page3 acquired %v after the file set's release, want at once", time.Since(want))
		}
		lp.Release(t.Context())
	})
	t.Run("shared ancestor", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			a := newLocker(t, client(t, store), "a", fastOpts())
			b := newLocker(t, client(t, store), "b", fastOpts())
			ls, err := a.TryAcquire(t.Context(), "files/set1", hierShared)
			if err != nil {
				t.Fatal(err)
			}
			defer ls.Release(t.Context())
			if lk, err := b.TryAcquire(t.Context(), "files/set1/page1", hierShared); err != nil {
				t.Errorf("Shared page under a Shared file set: %v", err)
			} else {
				lk.Release(t.Context())
			}
			if _, err := b.TryAcquire(t.Context(), "files/set1/page1", hier); !errors.Is(err, lock.ErrHeld) {
				t.Errorf("Exclusive page under a Shared file set: got %v, want ErrHeld", err)
			}
		})
	})
}

// TestFairOrder: Fair waiters across processes are served in the order
// they began to wait, and a newcomer cannot jump the line.
func TestFairOrder(t *testing.T) {
	for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				holder := newLocker(t, client(t, store), "holder", fastOpts())
				ao := &lock.AcquireOptions{Fair: true, Mode: mode}
				if mode == lock.Shared {
					ao.Limit = 1 // one at a time, so the order shows
				}
				lh, err := holder.TryAcquire(t.Context(), "queue/k", &lock.AcquireOptions{Mode: mode, Limit: ao.Limit})
				if err != nil {
					t.Fatal(err)
				}
				const n = 5
				var (
					mu    sync.Mutex
					order []int
					wg    sync.WaitGroup
				)
				for i := range n {
					l := newLocker(t, client(t, store), fmt.Sprintf("w%d", i), fastOpts())
					wg.Go(func() {
						err := l.Do(t.Context(), "queue/k", ao, func(context.Context, *lock.Lock) error {
							mu.Lock()
							order = append(order, i)
							mu.Unlock()
							time.Sleep(300 * time.Millisecond)
							return nil
						})
						if err != nil {
							t.Errorf("waiter %d: %v", i, err)
						}
					})
					synctest.Wait()                   // waiter i registered before i+1
					time.Sleep(50 * time.Millisecond) // and the clock moved on
				}
				late := newLocker(t, client(t, store), "late", fastOpts())
				_, err = late.TryAcquire(t.Context(), "queue/k", ao)
				if he := heldBy(t, "a Fair newcomer", err); he.Waiting != n {
					t.Errorf("HeldError.Waiting: got %d, want %d", he.Waiting, n)
				}
				time.Sleep(3 * time.Second) // registrations must survive several TTLs
				lh.Release(t.Context())
				wg.Wait()
				if want := []int{0, 1, 2, 3, 4}; !slices.Equal(order, want) {
					t.Errorf("order served: got %v, want %v", order, want)
				}
			})
		})
	}
}

// noIO returns calls without the methods that do no I/O.
func noIO(calls map[string]int64) map[string]int64 {
	delete(calls, "ModeSupport")
	delete(calls, "ValidateKey")
	delete(calls, "MinTTL")
	return calls
}

// hidden is a backend without backend.Modes.
type hidden struct{ backend.Backend }

// TestUnsupported: options a backend cannot serve fail before any store
// call with ErrUnsupported, never as a silent exclusive lock.
func TestUnsupported(t *testing.T) {
	store := memorybackend.NewStore()
	c := client(t, store)
	partial := client(t, store)
	partial.SetModeSupport(backend.ModeSupport{Shared: true})
	for _, tc := range []struct {
		name string
		c    *memorybackend.Backend
		b    backend.Backend
		ao   *lock.AcquireOptions
		want string
	}{
		{"shared without Modes", c, hidden{c}, sharedOpts, "shared locks"},
		{"semaphore without Modes", c, hidden{c}, semaphore(3), "shared locks"},
		{"hierarchy without Modes", c, hidden{c}, hier, "hierarchical locks"},
		{"fair without Modes", c, hidden{c}, &lock.AcquireOptions{Fair: true}, "fair queueing"},
		{"hierarchy on a backend with Shared only", partial, partial, hierShared, "hierarchical locks"},
		{"top-level hierarchy on a backend with Shared only", partial, partial, hier, "hierarchical locks"},
		{"fair on a backend with Shared only", partial, partial, &lock.AcquireOptions{Fair: true, Mode: lock.Shared}, "fair queueing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLocker(t, tc.b, "a", fastOpts())
			tc.c.ResetCalls()
			key := "k/sub"
			if tc.name == "top-level hierarchy on a backend with Shared only" {
				key = "k"
			}
			check := func(op string, err error) {
				t.Helper()
				if !errors.Is(err, lock.ErrUnsupported) || !errors.Is(err, backend.ErrUnsupported) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: got %v, want ErrUnsupported naming %q", op, err, tc.want)
				}
			}
			_, err := l.TryAcquire(t.Context(), key, tc.ao)
			check("TryAcquire", err)
			_, err = l.Acquire(t.Context(), key, tc.ao)
			check("Acquire", err)
			check("Do", l.Do(t.Context(), key, tc.ao, func(context.Context, *lock.Lock) error {
				t.Error("fn ran")
				return nil
			}))
			calls := noIO(tc.c.Calls())
			if len(calls) != 0 {
				t.Errorf("store calls: got %v, want none", calls)
			}
		})
	}
	t.Run("exclusive without Modes", func(t *testing.T) {
		l := newLocker(t, hidden{c}, "a", fastOpts())
		lk, err := l.TryAcquire(t.Context(), "plain", nil)
		if err != nil {
			t.Fatalf("plain Exclusive on a backend without Modes: %v", err)
		}
		lk.Release(t.Context())
	})
}

// TestPolicy: Options.Policy sees the key and the options with defaults
// applied, and refuses before any store call.
func TestPolicy(t *testing.T) {
	store := memorybackend.NewStore()
	c := client(t, store)
	errTooLong := errors.New("extraction locks are held for 5 minutes at most")
	errAudit := errors.New("audit locks are exclusive")
	var seen []lock.AcquireOptions
	var mu sync.Mutex
	policy := func(key string, o lock.AcquireOptions) error {
		mu.Lock()
		seen = append(seen, o)
		mu.Unlock()
		switch {
		case strings.HasPrefix(key, "extraction/") && o.TTL > 5*time.Minute:
			return errTooLong
		case strings.HasPrefix(key, "audit/") && o.Mode != lock.Exclusive:
			return errAudit
		}
		return nil
	}
	l := newLocker(t, c, "a", &lock.Options{TTL: 10 * time.Minute, Logger: quiet, Policy: policy})
	for _, tc := range []struct {
		key  string
		ao   *lock.AcquireOptions
		want error
	}{
		{"extraction/t1", nil, errTooLong}, // the Locker's TTL: 10 minutes
		{"extraction/t1", &lock.AcquireOptions{TTL: 10 * time.Minute}, errTooLong},
		{"audit/2026", sharedOpts, errAudit},
		{"audit/2026", semaphore(2), errAudit},
	} {
		c.ResetCalls()
		_, err := l.TryAcquire(t.Context(), tc.key, tc.ao)
		if !errors.Is(err, lock.ErrPolicy) || !errors.Is(err, tc.want) {
			t.Errorf("TryAcquire(%q, %+v): got %v, want ErrPolicy and %v", tc.key, tc.ao, err, tc.want)
		}
		if err := l.Do(t.Context(), tc.key, tc.ao, func(context.Context, *lock.Lock) error { return nil }); !errors.Is(err, tc.want) {
			t.Errorf("Do(%q): got %v, want %v", tc.key, err, tc.want)
		}
		if calls := noIO(c.Calls()); len(calls) != 0 {
			t.Errorf("store calls after a refusal: got %v, want none", calls)
		}
	}
	if seen[0].TTL != 10*time.Minute {
		t.Errorf("options seen by the policy: TTL %v, want the Locker's 10m applied", seen[0].TTL)
	}
	for _, tc := range []struct {
		key string
		ao  *lock.AcquireOptions
	}{
		{"extraction/t1", &lock.AcquireOptions{TTL: 5 * time.Minute, Mode: lock.Shared, Limit: 3}},
		{"audit/2026", nil},
	} {
		lk, err := l.TryAcquire(t.Context(), tc.key, tc.ao)
		if err != nil {
			t.Errorf("TryAcquire(%q) within the rules: %v", tc.key, err)
			continue
		}
		lk.Release(t.Context())
	}
}

// TestStats counts held locks per subject, with the oldest holder.
func TestStats(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		a := newLocker(t, client(t, store), "a", fastOpts())
		b := newLocker(t, client(t, store), "b", fastOpts())
		var held []*lock.Lock
		take := func(l *lock.Locker, key string, ao *lock.AcquireOptions) {
			lk, err := l.TryAcquire(t.Context(), key, ao)
			if err != nil {
				t.Fatalf("TryAcquire(%q): %v", key, err)
			}
			held = append(held, lk)
			time.Sleep(time.Second)
		}
		take(b, "consolidation:fs1", nil)
		take(a, "consolidation/fs2", nil)
		take(a, "schema/users", sharedOpts)
		take(b, "schema/users", sharedOpts)
		take(a, "schema/orders", nil)
		take(a, "extract/t1", semaphore(3))
		recs, _ := a.List(t.Context(), "")
		t.Logf("records: %v", holderIDs(recs))

		stats, err := a.Stats(t.Context(), "")
		if err != nil {
			t.Fatalf("Stats: %v", err)
		}
		type row struct {
			subj                     string
			keys, held, shared, excl int
			oldestHolder, oldestKey  string
		}
		var got []row
		for _, s := range stats {
			got = append(got, row{s.Subject, s.Keys, s.Held, s.Shared, s.Exclusive, s.Oldest.HolderID, s.Oldest.Key})
		}
		want := []row{
			{"consolidation", 2, 2, 0, 2, "b", "consolidation:fs1"},
			{"extract", 1, 1, 1, 0, "a", "extract/t1"},
			{"schema", 2, 3, 2, 1, "a", "schema/users"},
		}
		if !slices.Equal(got, want) {
			t.Errorf("Stats: got %+v, want %+v", got, want)
		}
		stats, err = a.Stats(t.Context(), "schema/u")
		if err != nil || len(stats) != 1 || stats[0].Held != 2 || stats[0].Keys != 1 {
			t.Errorf("Stats(schema/u): got %+v, %v; want one subject with 2 holders of 1 key", stats, err)
		}
		// The figures come from one List.
		oc := client(t, store)
		observer := newLocker(t, oc, "observer", fastOpts())
		oc.ResetCalls()
		if stats, err := observer.Stats(t.Context(), ""); err != nil || len(stats) != 3 {
			t.Errorf("observer's Stats: got %+v, %v; want 3 subjects", stats, err)
		}
		if got, want := noIO(oc.Calls()), map[string]int64{"List": 1}; !maps.Equal(got, want) {
			t.Errorf("store calls of Stats: got %v, want %v", got, want)
		}
		for _, lk := range held {
			lk.Release(t.Context())
		}
	})
}

// noWatchModes hides the memory client's Watch but not its Modes.
type noWatchModes struct {
	backend.Backend
	backend.Modes
}

// TestSemaphoreWaitWithoutWatch: a waiter for a full semaphore, on a
// backend that cannot watch, tries again when the *first* holder's lease
// would expire (that frees a permit), not when the last one's would.
func TestSemaphoreWaitWithoutWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		alice := newLocker(t, client(t, store), "alice", fastOpts())
		cc := client(t, store)
		// Carol's own TTL, which bounds her waits between attempts, is
		// longer than both.
		carol := newLocker(t, noWatchModes{cc, cc}, "carol", &lock.Options{TTL: time.Minute, Logger: quiet})
		short := &lock.AcquireOptions{Mode: lock.Shared, Limit: 2, TTL: 2 * time.Second, NoRenew: true}
		long := &lock.AcquireOptions{Mode: lock.Shared, Limit: 2, TTL: 20 * time.Second, NoRenew: true}
		for _, o := range []*lock.AcquireOptions{short, long} {
			if _, err := alice.TryAcquire(t.Context(), "pool", o); err != nil {
				t.Fatal(err)
			}
		}
		t0 := time.Now()
		lc, err := carol.Acquire(t.Context(), "pool", semaphore(2))
		if err != nil {
			t.Fatal(err)
		}
		defer lc.Release(t.Context())
		if d := time.Since(t0); d < 2*time.Second || d > 2100*time.Millisecond {
			t.Errorf("carol acquired a permit after %v, want just after the first holder's 2s TTL (not the other's 20s)", d)
		}
	})
}
