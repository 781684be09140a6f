package lock_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// TestFairHandOffCost: in a line of n Fair waiters, in n processes, each
// hand-off costs the store about two attempts (the first in line takes
// the lock, the next one learns it is first), not one per waiter: a
// waiter with others ahead of it lets releases pass and counts the line's
// changes instead (etcd's "watch only the predecessor", on every backend).
func TestFairHandOffCost(t *testing.T) {
	for _, mode := range []lock.Mode{lock.Exclusive, lock.Shared} {
		t.Run(mode.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				opts := &lock.Options{TTL: 10 * time.Second, Logger: quiet}
				holder := newLocker(t, client(t, store), "holder", opts)
				ao := &lock.AcquireOptions{Fair: true, Mode: mode}
				if mode == lock.Shared {
					ao.Limit = 1
				}
				lh, err := holder.TryAcquire(t.Context(), "queue/k", &lock.AcquireOptions{Mode: mode, Limit: ao.Limit})
				if err != nil {
					t.Fatal(err)
				}
				const n = 8
				var (
					mu      sync.Mutex
					order   []int
					wg      sync.WaitGroup
					clients []*memorybackend.Backend
				)
				for i := range n {
					c := client(t, store)
					clients = append(clients, c)
					l := newLocker(t, c, fmt.Sprintf("w%d", i), opts)
					wg.Go(func() {
						err := l.Do(t.Context(), "queue/k", ao, func(context.Context, *lock.Lock) error {
							mu.Lock()
							order = append(order, i)
							mu.Unlock()
							time.Sleep(10 * time.Millisecond)
							return nil
						})
						if err != nil {
							t.Errorf("waiter %d: %v", i, err)
						}
					})
					synctest.Wait() // waiter i registered before i+1
					time.Sleep(time.Millisecond)
				}
				for _, c := range clients {
					c.ResetCalls()
				}
				lh.Release(t.Context())
				wg.Wait()
				var attempts int64
				for _, c := range clients {
					attempts += c.Calls()["AcquireMode"]
				}
				if want := []int{0, 1, 2, 3, 4, 5, 6, 7}; !slices.Equal(order, want) {
					t.Errorf("order served: got %v, want %v", order, want)
				}
				// n successes, and about one failed attempt per hand-off
				// by the next in line; a herd would make n(n+1)/2 = 36.
				if attempts > 2*n {
					t.Errorf("AcquireMode calls for %d hand-offs: got %d, want at most %d", n, attempts, 2*n)
				}
				t.Logf("AcquireMode calls for %d hand-offs: %d", n, attempts)
			})
		})
	}
}
