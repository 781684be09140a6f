package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// Example acquires a lease, shows that a second holder is refused with the
// holder's record, and reads the lease with plain commands as redis-cli
// would. miniredis stands in for a Redis server, its clock set so that the
// output is fixed: a term is the server's clock in microseconds (or the last
// term plus one, when that is larger), an opaque increasing integer.
func Example() {
	mr, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer mr.Close()
	mr.SetTime(time.Date(2025, 11, 22, 3, 13, 54, 567890000, time.UTC))

	client := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	b, err := redisbackend.New(client, nil) // nil: default options, prefix "sovereign:"
	if err != nil {
		panic(err)
	}
	defer b.Close() // closes the backend's pub/sub connection, not client

	ctx := context.Background()
	lease, err := b.Acquire(ctx, backend.AcquireRequest{Key: "billing", HolderID: "node-1", TTL: 15 * time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println("node-1 holds term", lease.Term)

	_, err = b.Acquire(ctx, backend.AcquireRequest{Key: "billing", HolderID: "node-2", TTL: 15 * time.Second})
	var held *backend.HeldError
	if errors.As(err, &held) {
		fmt.Println("node-2 refused; holder:", held.Holder.HolderID, "term", held.Holder.Term)
	}

	fmt.Println("HGET sovereign:{billing} holder =", client.HGet(ctx, "sovereign:{billing}", "holder").Val())
	fmt.Println("GET sovereign:{billing}:term =", client.Get(ctx, "sovereign:{billing}:term").Val())
	// Output:
	// node-1 holds term 1763781234567890
	// node-2 refused; holder: node-1 term 1763781234567890
	// HGET sovereign:{billing} holder = node-1
	// GET sovereign:{billing}:term = 1763781234567890
}
