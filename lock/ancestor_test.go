package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// pageStream runs lockers that take hierarchical locks below root (each on a
// page of its own, Exclusive or Shared in turn), hold each for 300ms and
// take the next at once, staggered so that there is always one held: root
// is never free. ms, when not nil, restricts the lockers' clients. It stops
// when ctx ends.
func pageStream(ctx context.Context, t *testing.T, store *memorybackend.Store, root string, ms *backend.ModeSupport) *sync.WaitGroup {
	var wg sync.WaitGroup
	for i := range 3 {
		c := client(t, store)
		if ms != nil {
			c.SetModeSupport(*ms)
		}
		pl := newLocker(t, c, fmt.Sprintf("pager-%d", i), fastOpts())
		opts := hier
		if i%2 == 1 {
			opts = hierShared
		}
		wg.Go(func() {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
			for n := 0; ctx.Err() == nil; n++ {
				lk, err := pl.Acquire(ctx, fmt.Sprintf("%s/p%d-%d", root, i, n), opts)
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

// TestAncestorWaiters: an Exclusive lock on a key is not starved by a stream
// of overlapping hierarchical locks below it (issue #11): once it waits, new
// locks below are refused, so it waits only for those held when it began.
// This holds for a hierarchical Exclusive lock and for a plain one (which
// registers as a waiter when it finds locks below). Without the rule (the
// control) the same stream starves it.
func TestAncestorWaiters(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts *lock.AcquireOptions
	}{
		{"hierarchical", hier},
		{"plain", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				ctx, stop := context.WithCancel(t.Context())
				pages := pageStream(ctx, t, store, "files/set1", nil)
				defer func() {
					stop()
					pages.Wait()
				}()
				time.Sleep(time.Second) // the stream is going: the file set is never free
				writer := newLocker(t, client(t, store), "writer", fastOpts())
				start := time.Now()
				wctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				lw, err := writer.Acquire(wctx, "files/set1", tc.opts)
				if err != nil {
					t.Fatalf("file-set writer Acquire: %v", err)
				}
				// The page locks held when the writer registered finish
				// (300ms each); no new one gets in.
				if d := time.Since(start); d > 300*time.Millisecond {
					t.Errorf("file-set writer waited %v, want at most one page lock's hold (300ms)", d)
				}
				probe := newLocker(t, client(t, store), "probe", fastOpts())
				if _, err := probe.TryAcquire(t.Context(), "files/set1/probe", hierShared); !errors.Is(err, lock.ErrHeld) {
					t.Errorf("a page lock while the writer holds the file set: got %v, want ErrHeld", err)
				}
				time.Sleep(500 * time.Millisecond)
				lw.Release(t.Context())
			})
		})
	}
	t.Run("control: without the rule locks below starve the writer", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			ctx, stop := context.WithCancel(t.Context())
			pages := pageStream(ctx, t, store, "files/set1", &backend.ModeSupport{Shared: true, Hierarchical: true, Fair: true, WriterFirst: true})
			defer func() {
				stop()
				pages.Wait()
			}()
			time.Sleep(time.Second)
			writer := newLocker(t, client(t, store), "writer", fastOpts())
			wctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if _, err := writer.Acquire(wctx, "files/set1", hier); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("file-set writer Acquire without the rule: got %v, want starved until its deadline", err)
			}
		})
	})
	t.Run("a waiting writer refuses locks below; when it gives up they get in at once", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			a := newLocker(t, client(t, store), "a", fastOpts())
			b := newLocker(t, client(t, store), "b", fastOpts())
			w := newLocker(t, client(t, store), "w", fastOpts())
			p1, err := a.TryAcquire(t.Context(), "files/set1/page1", hier)
			if err != nil {
				t.Fatal(err)
			}
			defer p1.Release(t.Context())
			start := time.Now()
			wctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			wdone := make(chan error, 1)
			go func() {
				_, err := w.Acquire(wctx, "files/set1", nil)
				wdone <- err
			}()
			synctest.Wait() // the writer found page1 and registered
			_, err = b.TryAcquire(t.Context(), "files/set1/page2/line3", hierShared)
			he := heldBy(t, "a lock two levels below the waiting writer", err)
			if len(he.Holders) != 0 || he.Waiting != 1 || he.Holder.Key != "files/set1" {
				t.Errorf("HeldError: got Holders %v, Waiting %d, Holder.Key %q; want none, 1, the file set", holderIDs(he.Holders), he.Waiting, he.Holder.Key)
			}
			if want := `lock "files/set1/page2/line3" has 1 exclusive waiting ahead on lock "files/set1"`; !strings.Contains(err.Error(), want) {
				t.Errorf("message: got %q, want it to contain %q", err, want)
			}
			// A Fair lock below keeps its own line; a lock beside the file
			// set is not affected.
			for _, k := range []string{"files/set2/page1", "files/set1/page2"} {
				opts := hier
				if k == "files/set1/page2" {
					opts = &lock.AcquireOptions{Hierarchical: true, Fair: true}
				}
				if lk, err := b.TryAcquire(t.Context(), k, opts); err != nil {
					t.Errorf("%s (%+v) while a writer waits for files/set1: %v, want acquired", k, opts, err)
				} else {
					lk.Release(t.Context())
				}
			}
			got := make(chan time.Time, 1)
			go func() {
				lk, err := b.Acquire(t.Context(), "files/set1/page2", hier)
				if err != nil {
					t.Errorf("page2 Acquire: %v", err)
					got <- time.Time{}
					return
				}
				got <- time.Now()
				lk.Release(context.Background())
			}()
			time.Sleep(100 * time.Millisecond)
			synctest.Wait()
			select {
			case <-got:
				t.Fatal("page2 acquired while the file-set writer waits")
			default:
			}
			if err := <-wdone; !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("writer Acquire: got %v, want DeadlineExceeded (page1 is held)", err)
			}
			// Its withdrawal is published on the file set's key, which the
			// page lock watches.
			if at := <-got; !at.Equal(start.Add(time.Second)) {
				t.Errorf("page2 acquired %v after the writer gave up, want at once", at.Sub(start.Add(time.Second)))
			}
		})
	})
}
