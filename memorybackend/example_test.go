package memorybackend_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// One store simulates the cluster; each candidate gets its own client, so a
// fault can cut one candidate off while the others keep working.
func Example() {
	ctx := context.Background()
	store := memorybackend.NewStore()
	a, b := store.Client(), store.Client()
	defer a.Close()
	defer b.Close()

	lease, err := a.Acquire(ctx, backend.AcquireRequest{Key: "scheduler", HolderID: "a", TTL: time.Minute})
	if err != nil {
		panic(err)
	}
	fmt.Println("a holds term", lease.Term)

	_, err = b.Acquire(ctx, backend.AcquireRequest{Key: "scheduler", HolderID: "b", TTL: time.Minute})
	var held *backend.HeldError
	if errors.As(err, &held) {
		fmt.Println("b sees holder", held.Holder.HolderID)
	}

	a.Partition()
	err = a.Renew(ctx, lease)
	fmt.Println("a partitioned:", errors.Is(err, memorybackend.ErrPartitioned))
	a.Heal()
	fmt.Println("a healed, renew error:", a.Renew(ctx, lease))
	fmt.Println("a's calls:", a.Calls()["Renew"], "renewals")
	// Output:
	// a holds term 1
	// b sees holder a
	// a partitioned: true
	// a healed, renew error: <nil>
	// a's calls: 2 renewals
}

// A restart without persistence loses every lease: the holder learns it on
// its next renewal, watches are closed so receivers re-subscribe, and the
// store-wide term counter keeps fencing terms increasing.
func ExampleStore_Restart() {
	ctx := context.Background()
	store := memorybackend.NewStore()
	a, b := store.Client(), store.Client()
	defer a.Close()
	defer b.Close()

	events, _ := b.Watch(ctx, "scheduler")
	lease, _ := a.Acquire(ctx, backend.AcquireRequest{Key: "scheduler", HolderID: "a", TTL: time.Minute})
	fmt.Println("a holds term", lease.Term)

	store.Restart(nil) // &memorybackend.RestartOptions{LoseTerms: true} would reset the terms too
	for range events {
	}
	fmt.Println("b's watch closed")
	fmt.Println("a's renewal reports the lease lost:", errors.Is(a.Renew(ctx, lease), backend.ErrLeaseLost))
	lb, _ := b.Acquire(ctx, backend.AcquireRequest{Key: "scheduler", HolderID: "b", TTL: time.Minute})
	fmt.Println("b holds term", lb.Term)
	// Output:
	// a holds term 1
	// b's watch closed
	// a's renewal reports the lease lost: true
	// b holds term 2
}
