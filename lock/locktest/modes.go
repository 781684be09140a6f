package locktest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
)

// The cases of shared locks, semaphores, hierarchies and fair queueing
// (backend.Modes). Each is skipped, saying why, when the backend's
// ModeSupport lacks what it needs.

func needShared(s backend.ModeSupport) string {
	if !s.Shared {
		return "Shared"
	}
	return ""
}

func needWriterFirst(s backend.ModeSupport) string {
	if !s.Shared || !s.WriterFirst {
		return "Shared and WriterFirst"
	}
	return ""
}

func needHierarchical(s backend.ModeSupport) string {
	if !s.Shared || !s.Hierarchical {
		return "Shared and Hierarchical"
	}
	return ""
}

func needAncestorWaiters(s backend.ModeSupport) string {
	if !s.Hierarchical || !s.AncestorWaiters {
		return "Hierarchical and AncestorWaiters"
	}
	return ""
}

func needFair(s backend.ModeSupport) string {
	if !s.Fair {
		return "Fair"
	}
	return ""
}

var (
	shared = &lock.AcquireOptions{Mode: lock.Shared}
	hier   = &lock.AcquireOptions{Hierarchical: true}
)

// held returns err's *lock.HeldError, failing the test when it is not one.
func held(t *testing.T, what string, err error) *lock.HeldError {
	t.Helper()
	var he *lock.HeldError
	if !errors.As(err, &he) || !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("%s: got %v, want a *lock.HeldError", what, err)
	}
	return he
}

func ids(recs []backend.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.HolderID)
	}
	return out
}

// eventually calls cond every 10ms until it reports true, and fails the test
// when ctx ends first. It waits for a state another goroutine brings about
// (a waiter's registration), with ctx as the generous bound.
func eventually(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not reached before %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

var modeCases = []lockCase{
	{"shared holders and an exclusive one", needShared, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a, b, c := newL("alice"), newL("bob"), newL("carol")
		la, err := a.TryAcquire(ctx, key, shared)
		if err != nil {
			t.Fatalf("alice Shared: %v", err)
		}
		lb, err := b.TryAcquire(ctx, key, &lock.AcquireOptions{Mode: lock.Shared, Metadata: map[string]string{"r": "b"}})
		if err != nil {
			t.Fatalf("bob Shared beside alice: %v", err)
		}
		if lb.Term() <= la.Term() {
			t.Errorf("bob's term %d, want more than alice's %d", lb.Term(), la.Term())
		}
		_, err = c.TryAcquire(ctx, key, nil)
		if he := held(t, "carol Exclusive", err); !slices.Equal(ids(he.Holders), []string{"alice", "bob"}) || he.Holders[1].Key != key {
			t.Errorf("HeldError.Holders: got %+v, want alice and bob on %q", he.Holders, key)
		}
		hs, err := c.Holders(ctx, key)
		if err != nil || !slices.Equal(ids(hs), []string{"alice", "bob"}) || hs[0].Mode != lock.Shared || hs[1].Metadata["r"] != "b" {
			t.Errorf("Holders: got %+v, %v; want alice and bob, Shared, bob's r=b", hs, err)
		}
		if recs, err := c.List(ctx, key); err != nil || !slices.Equal(ids(recs), []string{"alice", "bob"}) {
			t.Errorf("List: got %v, %v; want one record per holder", ids(recs), err)
		}
		for _, lk := range []*lock.Lock{la, lb} { // bob is not the oldest holder
			if err := lk.Verify(ctx); err != nil {
				t.Errorf("Verify: %v", err)
			}
			if err := lk.Extend(ctx); err != nil {
				t.Errorf("Extend: %v", err)
			}
		}
		if err := lb.SetMetadata(ctx, map[string]string{"progress": "1/2"}); err != nil {
			t.Errorf("bob SetMetadata: %v", err)
		}
		if hs, _ := c.Holders(ctx, key); len(hs) != 2 || hs[1].Metadata["progress"] != "1/2" {
			t.Errorf("Holders after SetMetadata: got %+v, want bob's progress 1/2", hs)
		}
		got := make(chan error, 1)
		go func() {
			lc, err := c.Acquire(ctx, key, nil)
			if err == nil {
				if lc.Term() <= lb.Term() {
					t.Errorf("carol's term %d, want more than bob's %d", lc.Term(), lb.Term())
				}
				err = lc.Release(ctx)
			}
			got <- err
		}()
		if err := la.Release(ctx); err != nil {
			t.Errorf("alice Release: %v", err)
		}
		if err := lb.Release(ctx); err != nil {
			t.Errorf("bob Release: %v", err)
		}
		if err := <-got; err != nil {
			t.Errorf("carol Acquire after the Shared holders left: %v", err)
		}
	}},
	{"semaphore", needShared, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		sem := &lock.AcquireOptions{Mode: lock.Shared, Limit: 2}
		a, b, c := newL("a"), newL("b"), newL("c")
		la, err := a.TryAcquire(ctx, key, sem)
		if err != nil {
			t.Fatal(err)
		}
		lb, err := b.TryAcquire(ctx, key, sem)
		if err != nil {
			t.Fatalf("second permit: %v", err)
		}
		_, err = c.TryAcquire(ctx, key, sem)
		if he := held(t, "third permit of 2", err); len(he.Holders) != 2 || he.Holder.Limit != 2 {
			t.Errorf("HeldError: got %+v, want the 2 holders with limit 2", he.Holders)
		}
		if _, err := c.TryAcquire(ctx, key, &lock.AcquireOptions{Mode: lock.Shared, Limit: 3}); !errors.Is(err, lock.ErrLimitMismatch) {
			t.Errorf("limit 3 against 2: got %v, want ErrLimitMismatch", err)
		}
		got := make(chan error, 1)
		go func() {
			lc, err := c.Acquire(ctx, key, sem)
			if err == nil {
				err = lc.Release(ctx)
			}
			got <- err
		}()
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Errorf("third acquirer after a permit was released: %v", err)
		}
		lb.Release(ctx)
	}},
	{"writer preference", needWriterFirst, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		r1, r2, w := newL("r1"), newL("r2"), newL("writer")
		l1, err := r1.TryAcquire(ctx, key, shared)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			lw, err := w.Acquire(ctx, key, nil)
			if err == nil {
				err = lw.Release(ctx)
			}
			got <- err
		}()
		eventually(ctx, t, "a new reader refused while the writer waits", func() bool {
			l2, err := r2.TryAcquire(ctx, key, shared)
			if err == nil {
				l2.Release(ctx)
				return false
			}
			return errors.Is(err, lock.ErrHeld)
		})
		if err := l1.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("writer Acquire: %v", err)
		}
		l2, err := r2.TryAcquire(ctx, key, shared)
		if err != nil {
			t.Fatalf("reader after the writer: %v (its registration must be gone)", err)
		}
		l2.Release(ctx)
	}},
	{"hierarchy", needHierarchical, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a, b := newL("a"), newL("b")
		set, page1, page2 := lock.Key(key, "set"), lock.Key(key, "set", "page1"), lock.Key(key, "set", "page2")
		p1, err := a.TryAcquire(ctx, page1, hier)
		if err != nil {
			t.Fatalf("page1: %v", err)
		}
		p2, err := b.TryAcquire(ctx, page2, hier)
		if err != nil {
			t.Fatalf("page2 beside page1: %v", err)
		}
		_, err = b.TryAcquire(ctx, set, hier)
		if he := held(t, "the set over its pages", err); !slices.Equal(ids(he.Holders), []string{"a", "b"}) || he.Holders[0].Key != page1 {
			t.Errorf("HeldError.Holders: got %+v, want the page locks", he.Holders)
		}
		if _, err := b.TryAcquire(ctx, set, &lock.AcquireOptions{Hierarchical: true, Mode: lock.Shared}); !errors.Is(err, lock.ErrHeld) {
			t.Errorf("Shared set over Exclusive pages: got %v, want ErrHeld", err)
		}
		got := make(chan *lock.Lock, 1)
		go func() {
			ls, err := b.Acquire(ctx, set, hier)
			if err != nil {
				t.Errorf("set Acquire: %v", err)
			}
			got <- ls
		}()
		p1.Release(ctx)
		p2.Release(ctx)
		ls := <-got
		if ls == nil {
			return
		}
		_, err = a.TryAcquire(ctx, page1, hier)
		if he := held(t, "a page under the held set", err); he.Holder.Key != set {
			t.Errorf("HeldError.Holder.Key: got %q, want %q", he.Holder.Key, set)
		}
		done := make(chan error, 1)
		go func() {
			lp, err := a.Acquire(ctx, page1, hier)
			if err == nil {
				err = lp.Release(ctx)
			}
			done <- err
		}()
		ls.Release(ctx)
		if err := <-done; err != nil {
			t.Errorf("page Acquire after the set's release: %v", err)
		}
	}},
	{"exclusive waiter above refuses new locks below", needAncestorWaiters, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a, b, w := newL("a"), newL("b"), newL("writer")
		set, page1, page2 := lock.Key(key, "set"), lock.Key(key, "set", "page1"), lock.Key(key, "set", "page2")
		p1, err := a.TryAcquire(ctx, page1, hier)
		if err != nil {
			t.Fatalf("page1: %v", err)
		}
		// A plain Exclusive lock on the set finds page1 below and registers.
		writerAt := make(chan time.Time, 1)
		go func() {
			lw, err := w.Acquire(ctx, set, nil)
			if err != nil {
				t.Errorf("set Acquire: %v", err)
				writerAt <- time.Time{}
				return
			}
			at := time.Now()
			lw.Release(ctx)
			writerAt <- at
		}()
		eventually(ctx, t, "a new page lock refused while the set's writer waits", func() bool {
			lp, err := b.TryAcquire(ctx, page2, hier)
			if err == nil {
				lp.Release(ctx)
				return false
			}
			he := held(t, "page2 while the writer waits", err)
			return len(he.Holders) == 0 && he.Waiting > 0 && he.Holder.Key == set
		})
		pageAt := make(chan time.Time, 1)
		go func() {
			lp, err := b.Acquire(ctx, page2, hier)
			if err != nil {
				t.Errorf("page2 Acquire: %v", err)
				pageAt <- time.Time{}
				return
			}
			at := time.Now()
			lp.Release(ctx)
			pageAt <- at
		}()
		p1.Release(ctx)
		wAt, pAt := <-writerAt, <-pageAt
		if !wAt.IsZero() && !pAt.IsZero() && pAt.Before(wAt) {
			t.Errorf("page2 acquired %v before the set's writer, want after it", wAt.Sub(pAt))
		}
	}},
	{"fair order", needFair, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		h, probe := newL("holder"), newL("probe")
		fair := &lock.AcquireOptions{Fair: true}
		lh, err := h.TryAcquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		const n = 3
		order := make(chan int, n)
		errs := make(chan error, n)
		for i := range n {
			l := newL("w" + string(rune('0'+i)))
			go func() {
				errs <- l.Do(ctx, key, fair, func(context.Context, *lock.Lock) error {
					order <- i
					return nil
				})
			}()
			eventually(ctx, t, "the waiter's registration", func() bool {
				_, err := probe.TryAcquire(ctx, key, fair)
				var he *lock.HeldError
				return errors.As(err, &he) && he.Waiting == i+1
			})
		}
		if err := lh.Release(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			if err := <-errs; err != nil {
				t.Errorf("waiter: %v", err)
			}
			if got := <-order; got != i {
				t.Errorf("served #%d: got waiter %d, want %d", i, got, i)
			}
		}
	}},
}
