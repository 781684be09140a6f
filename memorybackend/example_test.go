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
