package lock_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestStoreRestartModesHolderCut is TestStoreRestartHolderCut for the
// waiters that go through backend.Modes: a Shared waiter behind an
// Exclusive holder, a Fair waiter, a hierarchical lock below an Exclusive
// ancestor, and an Exclusive waiter behind Shared holders. The store
// restarts and loses its data while the holder cannot reach it, so the
// holder keeps its lock until its renew deadline; the waiter, whose watch
// broke, must not take the free key before a TTL has passed. And after a
// restart that kept the data, the holder's release still hands over at
// once: the waiter finds the lease it saw before.
func TestStoreRestartModesHolderCut(t *testing.T) {
	excl := &lock.AcquireOptions{}
	for _, tc := range []struct {
		name                 string
		holdKey, waitKey     string
		holdOpts, waiterOpts *lock.AcquireOptions
	}{
		{"shared waiter", "k", "k", excl, &lock.AcquireOptions{Mode: lock.Shared}},
		{"fair waiter", "k", "k", &lock.AcquireOptions{Fair: true}, &lock.AcquireOptions{Fair: true}},
		{"lock below an ancestor", "a", "a/b", &lock.AcquireOptions{Hierarchical: true}, &lock.AcquireOptions{Hierarchical: true}},
		{"exclusive waiter behind a shared holder", "k", "k", &lock.AcquireOptions{Mode: lock.Shared}, excl},
		{"ancestor behind a lock below", "a/b", "a", &lock.AcquireOptions{Hierarchical: true}, &lock.AcquireOptions{Hierarchical: true}},
	} {
		for _, keep := range []bool{false, true} {
			name := tc.name + ", data lost"
			if keep {
				name = tc.name + ", data kept"
			}
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					store := memorybackend.NewStore()
					opts := fastOpts()
					ca := client(t, store)
					l := newLocker(t, ca, "a", opts)
					waiter := newLocker(t, client(t, store), "b", opts)
					lk, err := l.TryAcquire(t.Context(), tc.holdKey, tc.holdOpts)
					if err != nil {
						t.Fatal(err)
					}
					got := acquireAsync(t.Context(), waiter, tc.waitKey, tc.waiterOpts)
					time.Sleep(500 * time.Millisecond)
					synctest.Wait()
					if !keep {
						ca.Partition()
					}
					store.Restart(&memorybackend.RestartOptions{KeepLeases: keep})
					restart := time.Now()
					if keep {
						time.Sleep(10 * time.Millisecond)
						synctest.Wait() // the waiter read the key after its watch broke
						if err := lk.Release(t.Context()); err != nil {
							t.Fatalf("Release: %v", err)
						}
					}
					a := <-got
					if a.err != nil {
						t.Fatalf("waiter: %v", a.err)
					}
					defer a.lk.Release(context.Background())
					took := a.at.Sub(restart)
					switch {
					case keep && took > 100*time.Millisecond:
						t.Errorf("waiter acquired %v after the release, want at once: the store kept the lease the waiter knew", took)
					case !keep && took < opts.TTL:
						t.Errorf("waiter acquired %v after the restart, want no acquisition of the free key before a TTL (%v): the cut holder held it until its deadline", took, opts.TTL)
					}
					if !keep && lk.Held() {
						t.Errorf("the cut holder still held the lock when the waiter acquired it")
					}
				})
			})
		}
	}
}
