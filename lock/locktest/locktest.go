// Package locktest runs the behaviour of package lock over a backend: one
// call per backend, like backend/backendtest for the backend contract. The
// cases run in real time against real servers, so they assert outcomes,
// never durations (timing is tested on the memory backend under synctest in
// package lock).
package locktest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/lock"
)

var prefixes atomic.Int64

var quiet = slog.New(slog.DiscardHandler)

// Run runs every case with Lockers on backends from open (one call per
// Locker; open registers the backend's clean-up with t) and locks of the
// given TTL. Each case uses keys of its own.
func Run(t *testing.T, open func(t *testing.T) backend.Backend, ttl time.Duration) {
	for _, tc := range slices.Concat(lockCases, modeCases) {
		t.Run(tc.name, func(t *testing.T) {
			if tc.needs != nil {
				m, ok := open(t).(backend.Modes)
				if !ok {
					t.Skip("the backend does not implement backend.Modes")
				}
				if missing := tc.needs(m.ModeSupport()); missing != "" {
					t.Skipf("the backend's ModeSupport lacks %s", missing)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			newL := func(id string) *lock.Locker {
				l, err := lock.New(open(t), id, &lock.Options{TTL: ttl, Logger: quiet})
				if err != nil {
					t.Fatalf("lock.New: %v", err)
				}
				t.Cleanup(func() { l.Close() })
				return l
			}
			tc.run(ctx, t, newL, fmt.Sprintf("locktest/%d/%s", prefixes.Add(1), tc.name))
		})
	}
}

type lockCase struct {
	name string
	// needs, when set, returns what the case needs that s lacks ("" when
	// nothing); the case is skipped then.
	needs func(s backend.ModeSupport) string
	// run gets a fresh Locker for each id, and a key prefix of its own.
	run func(ctx context.Context, t *testing.T, newL func(id string) *lock.Locker, key string)
}

var lockCases = []lockCase{
	{"try-acquire, held error, release", nil, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a, b := newL("alice@host"), newL("bob@host")
		k := key + "/job:1"
		la, err := a.TryAcquire(ctx, k, &lock.AcquireOptions{Metadata: map[string]string{"req": "r1"}})
		if err != nil {
			t.Fatalf("alice TryAcquire: %v", err)
		}
		_, err = b.TryAcquire(ctx, k, nil)
		var he *lock.HeldError
		if !errors.As(err, &he) || !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("bob TryAcquire: got %v, want a HeldError", err)
		}
		if h := he.Holder; h.Key != k || h.HolderID != "alice@host" || h.Term != la.Term() || h.Metadata["req"] != "r1" || h.TTL <= 0 || h.AcquiredAt.IsZero() {
			t.Errorf("holder: got %+v, want key %q, alice@host, term %d, req=r1, positive TTL, AcquiredAt set", h, k, la.Term())
		}
		if _, err := a.TryAcquire(ctx, k, nil); !errors.Is(err, lock.ErrHeld) {
			t.Errorf("alice's second TryAcquire: got %v, want ErrHeld (not reentrant)", err)
		}
		if err := la.Verify(ctx); err != nil {
			t.Errorf("Verify: %v", err)
		}
		if err := la.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := la.Release(ctx); err != nil {
			t.Errorf("second Release: %v", err)
		}
		lb, err := b.TryAcquire(ctx, k, nil)
		if err != nil {
			t.Fatalf("bob TryAcquire after the release: %v", err)
		}
		if lb.Term() <= la.Term() {
			t.Errorf("term: got %d after %d, want it to increase", lb.Term(), la.Term())
		}
		lb.Release(ctx)
	}},
	{"acquire woken by release", nil, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a, b := newL("alice"), newL("bob")
		la, err := a.TryAcquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan error, 1)
		go func() {
			lb, err := b.Acquire(ctx, key, nil)
			if err == nil {
				err = lb.Release(ctx)
			}
			got <- err
		}()
		if err := a.WaitFree(ctx, "never-held-"+key); err != nil {
			t.Fatalf("WaitFree on a free key: %v", err)
		}
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Errorf("bob Acquire: %v", err)
		}
	}},
	{"do", nil, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a, b := newL("alice"), newL("bob")
		ran := false
		err := a.Do(ctx, key, nil, func(ctx context.Context, l *lock.Lock) error {
			ran = true
			if !l.Held() || l.Key() != key {
				t.Errorf("in fn: Held %v, Key %q; want true, %q", l.Held(), l.Key(), key)
			}
			if err := b.TryDo(ctx, key, nil, func(context.Context, *lock.Lock) error {
				t.Error("bob's TryDo ran fn while alice held the lock")
				return nil
			}); !errors.Is(err, lock.ErrHeld) {
				t.Errorf("bob TryDo: got %v, want ErrHeld", err)
			}
			return l.Verify(ctx)
		})
		if err != nil || !ran {
			t.Fatalf("Do: got %v (ran %v), want nil after running fn", err, ran)
		}
		if hs, err := b.Holders(ctx, key); err != nil || len(hs) != 0 {
			t.Errorf("Holders after Do: got %v, %v; want none (released)", hs, err)
		}
	}},
	{"wait free", nil, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a, b := newL("alice"), newL("bob")
		la, err := a.TryAcquire(ctx, key, nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- b.WaitFree(ctx, key) }()
		if hs, err := b.Holders(ctx, key); err != nil || len(hs) != 1 || hs[0].HolderID != "alice" || hs[0].Key != key {
			t.Errorf("Holders: got %+v, %v; want alice on %q", hs, err, key)
		}
		la.Release(ctx)
		if err := <-done; err != nil {
			t.Errorf("WaitFree: %v", err)
		}
	}},
	{"list and metadata", nil, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a := newL("alice")
		var held []*lock.Lock
		for _, k := range []string{key + "/a", key + "/b", key + "x/c"} {
			lk, err := a.TryAcquire(ctx, k, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer lk.Release(ctx)
			held = append(held, lk)
		}
		if err := held[0].SetMetadata(ctx, map[string]string{"progress": "50%"}); err != nil {
			t.Errorf("SetMetadata: %v", err)
		}
		recs, err := a.List(ctx, key+"/")
		var keys []string
		for _, r := range recs {
			keys = append(keys, r.Key)
		}
		if err != nil || !slices.Equal(keys, []string{key + "/a", key + "/b"}) {
			t.Fatalf("List: got %v, %v; want [%s/a %s/b]", keys, err, key, key)
		}
		if recs[0].Metadata["progress"] != "50%" || recs[0].Term != held[0].Term() {
			t.Errorf("List record: got %+v, want term %d with progress=50%%", recs[0], held[0].Term())
		}
	}},
	{"min-hold keeps the lock past its TTL after TryDo", nil, func(ctx context.Context, t *testing.T, newL func(string) *lock.Locker, key string) {
		a, b := newL("alice"), newL("bob")
		ttl := a.Options().TTL
		if ttl > 2*time.Second {
			t.Skipf("TTL %v: the case waits 1.5 TTLs; it runs with TTLs up to 2 s", ttl)
		}
		minHold := ttl * 3 / 2 // beyond the TTL: the lock must be renewed meanwhile
		start := time.Now()
		if err := a.TryDo(ctx, key, &lock.AcquireOptions{MinHold: minHold}, func(context.Context, *lock.Lock) error { return nil }); err != nil {
			t.Fatalf("alice's TryDo: %v", err)
		}
		if _, err := b.TryAcquire(ctx, key, nil); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("bob's TryAcquire right after alice's TryDo returned: got %v, want ErrHeld (MinHold)", err)
		}
		lb, err := b.Acquire(ctx, key, nil)
		if err != nil {
			t.Fatalf("bob's Acquire: %v", err)
		}
		// Only a lower bound: a loaded machine makes the release later,
		// never earlier.
		if d := time.Since(start); d < minHold {
			t.Errorf("bob acquired %v after alice's TryDo began, want no sooner than MinHold %v (TTL %v)", d, minHold, ttl)
		}
		lb.Release(ctx)
	}},
}
