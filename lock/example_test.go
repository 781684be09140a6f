package lock_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// Two replicas try to run the same daily report. Alice's TryDo runs it;
// Bob's, made while Alice holds the lock, returns the *HeldError at once
// without running his function.
func ExampleLocker_TryDo() {
	store := memorybackend.NewStore() // one store: one simulated cluster
	alice, _ := lock.New(store.Client(), "alice", nil)
	bob, _ := lock.New(store.Client(), "bob", nil)
	defer alice.Close()
	defer bob.Close()
	ctx := context.Background()

	err := alice.TryDo(ctx, "reports/daily", nil, func(ctx context.Context, l *lock.Lock) error {
		fmt.Printf("alice runs the report (fencing term %d)\n", l.Term())
		err := bob.TryDo(ctx, "reports/daily", nil, func(context.Context, *lock.Lock) error {
			fmt.Println("bob runs the report") // not reached
			return nil
		})
		var held *lock.HeldError
		if errors.As(err, &held) {
			fmt.Printf("bob skips it: held by %s (term %d)\n", held.Holder.HolderID, held.Holder.Term)
		}
		return nil
	})
	fmt.Println("alice's TryDo returned", err)
	// Output:
	// alice runs the report (fencing term 1)
	// bob skips it: held by alice (term 1)
	// alice's TryDo returned <nil>
}

// Do waits for the lock: Bob's migration starts as soon as Alice releases
// hers, with a higher fencing term.
func ExampleLocker_Do() {
	store := memorybackend.NewStore()
	alice, _ := lock.New(store.Client(), "alice", nil)
	bob, _ := lock.New(store.Client(), "bob", nil)
	defer alice.Close()
	defer bob.Close()
	ctx := context.Background()

	l, err := alice.TryAcquire(ctx, "migrations", nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("alice migrates (term %d)\n", l.Term())
	done := make(chan error)
	go func() {
		done <- bob.Do(ctx, "migrations", nil, func(ctx context.Context, l *lock.Lock) error {
			// ctx is cancelled the moment the lock is lost: stop then.
			fmt.Printf("bob migrates (term %d)\n", l.Term())
			return nil
		})
	}()
	if err := l.Release(ctx); err != nil { // Bob's Do wakes at once
		panic(err)
	}
	fmt.Println("bob's Do returned", <-done)
	// Output:
	// alice migrates (term 1)
	// bob migrates (term 2)
	// bob's Do returned <nil>
}

// A failed attempt says who holds the lock, since when, under which term,
// and with which metadata, read in the same round trip.
func ExampleHeldError() {
	store := memorybackend.NewStore()
	alice, _ := lock.New(store.Client(), "alice@host-a", nil)
	bob, _ := lock.New(store.Client(), "bob@host-b", nil)
	defer alice.Close()
	defer bob.Close()
	ctx := context.Background()

	l, err := alice.TryAcquire(ctx, lock.Key("tally", "election-42"), &lock.AcquireOptions{
		Metadata: map[string]string{"request": "req-7"},
	})
	if err != nil {
		panic(err)
	}
	defer l.Release(ctx)

	_, err = bob.TryAcquire(ctx, "tally/election-42", nil)
	var held *lock.HeldError
	if errors.As(err, &held) {
		h := held.Holder
		fmt.Println("held:", errors.Is(err, lock.ErrHeld))
		fmt.Printf("already in progress, started by %s (request %s, term %d)\n", h.HolderID, h.Metadata["request"], h.Term)
		// err.Error() reads: lock "tally/election-42" held by "alice@host-a" (term 1) since 10:02:03
	}
	// Output:
	// held: true
	// already in progress, started by alice@host-a (request req-7, term 1)
}

// Readers share a schema lock; a writer waits until they have all left,
// and gets a higher fencing term than any of them.
func ExampleLocker_TryAcquire_shared() {
	store := memorybackend.NewStore()
	r1, _ := lock.New(store.Client(), "reader-1", nil)
	r2, _ := lock.New(store.Client(), "reader-2", nil)
	w, _ := lock.New(store.Client(), "migrator", nil)
	defer r1.Close()
	defer r2.Close()
	defer w.Close()
	ctx := context.Background()

	read := &lock.AcquireOptions{Mode: lock.Shared}
	l1, err := r1.TryAcquire(ctx, "schema/orders", read)
	if err != nil {
		panic(err)
	}
	l2, err := r2.TryAcquire(ctx, "schema/orders", read)
	if err != nil {
		panic(err)
	}
	fmt.Println("both readers hold it:", l1.Held(), l2.Held())

	_, err = w.TryAcquire(ctx, "schema/orders", nil) // Exclusive
	var held *lock.HeldError
	if errors.As(err, &held) {
		fmt.Printf("the migrator waits for %d readers: %s and %s\n",
			len(held.Holders), held.Holders[0].HolderID, held.Holders[1].HolderID)
	}
	l1.Release(ctx)
	l2.Release(ctx)
	lw, err := w.TryAcquire(ctx, "schema/orders", nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("then it migrates (term %d, after the readers' %d and %d)\n", lw.Term(), l1.Term(), l2.Term())
	lw.Release(ctx)
	// Output:
	// both readers hold it: true true
	// the migrator waits for 2 readers: reader-1 and reader-2
	// then it migrates (term 3, after the readers' 1 and 2)
}

// A semaphore: at most 3 extractions per tenant at once. Each permit holder
// has its own lease, so a crashed one frees its permit after its TTL.
func ExampleLocker_TryDo_semaphore() {
	store := memorybackend.NewStore()
	worker, _ := lock.New(store.Client(), "worker-a", nil)
	other, _ := lock.New(store.Client(), "worker-b", nil)
	defer worker.Close()
	defer other.Close()
	ctx := context.Background()

	permit := &lock.AcquireOptions{Mode: lock.Shared, Limit: 3}
	key := lock.Key("extraction", "tenant-1")
	var held []*lock.Lock
	for range 3 {
		l, err := worker.TryAcquire(ctx, key, permit)
		if err != nil {
			panic(err)
		}
		held = append(held, l)
	}
	fmt.Println("worker-a runs 3 extractions")

	err := other.TryDo(ctx, key, permit, func(context.Context, *lock.Lock) error {
		fmt.Println("worker-b extracts") // not reached: no permit left
		return nil
	})
	var full *lock.HeldError
	if errors.As(err, &full) {
		fmt.Printf("worker-b: no permit (%d of %d in use)\n", len(full.Holders), full.Holder.Limit)
	}

	held[0].Release(ctx) // one extraction is done
	err = other.TryDo(ctx, key, permit, func(context.Context, *lock.Lock) error {
		fmt.Println("worker-b extracts")
		return nil
	})
	fmt.Println("worker-b's TryDo returned", err)
	for _, l := range held[1:] {
		l.Release(ctx)
	}
	// Output:
	// worker-a runs 3 extractions
	// worker-b: no permit (3 of 3 in use)
	// worker-b extracts
	// worker-b's TryDo returned <nil>
}
