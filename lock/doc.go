// Package lock is a distributed lock over the same backends as Sovereign's
// elector (Redis, etcd, memory), with the same safety model: a lock is a lease
// kept alive in the background, its holder gets a context cancelled the
// moment the lock is lost or no longer certain, and every acquisition carries
// a fencing term.
//
//	lk, err := lock.New(b, id, nil) // id: unique per replica (hostname-pid); nil: default options
//	if err != nil { ... }
//	defer lk.Close()
//	err = lk.Do(ctx, lock.Key("tally", electionID), nil, func(ctx context.Context, l *lock.Lock) error {
//		// Holds the lock. ctx is cancelled the moment the lock is lost.
//		return tally(ctx, l.Term()) // pass the fencing term downstream
//	})
//
// A Locker acquires locks for one holder ID. TryAcquire and TryDo make one
// attempt and return a *HeldError naming the holder (who, since when, term,
// metadata) when the lock is taken; Acquire and Do wait until it is free,
// woken by the backend's watch when the holder releases it, or by a
// re-check scheduled from the holder's remaining TTL. Goroutines of one
// Locker waiting for the same key queue locally, first come first served,
// and only the head of the queue talks to the backend.
//
// Lock key K is stored under the backend key "lock/" + K, apart from
// elections. Keys may contain "/" and ":"; Key joins parts with "/". A key
// must not be empty, nor contain an empty "/"-separated segment, and must be
// accepted by the backend (etcd refuses "/heartbeat/", say); the Locker
// checks it on every call and returns an error wrapping ErrInvalidKey
// otherwise. Records returned by this package show lock keys, without the
// prefix.
//
// # Shared locks, semaphores, hierarchies and fair queueing
//
// On a backend that implements backend.Modes (memory, Redis and etcd do),
// AcquireOptions also asks for:
//
//   - Mode Shared: many holders at once (readers), excluding Exclusive
//     holders; with Limit, at most Limit of them (a semaphore). Each holder
//     has its own token, term, TTL and metadata, so a crashed reader or
//     permit holder frees its place after its own TTL; Holders and List
//     return one record per holder, and a *HeldError lists every
//     conflicting holder in Holders. An Exclusive Acquire that waits for
//     Shared holders registers, and new Shared holders are refused until it
//     is served (writer preference).
//   - Hierarchical: "/" in the key are levels. A lock on "a/b/c" takes
//     intent on "a" and "a/b" atomically with itself, so it conflicts with
//     an Exclusive lock on "a" or "a/b", and an Exclusive lock on "a" waits
//     for every hierarchical lock below it. While it waits, it refuses new
//     hierarchical locks below "a" (when ModeSupport has AncestorWaiters:
//     memory, Redis and etcd), so a stream of locks below cannot starve it;
//     as with any writer-preferring reader-writer lock, a goroutine that
//     holds "a/b" and then waits for "a/c" waits for that Exclusive waiter,
//     which waits for "a/b", until one of them gives up: bound such waits
//     with a context.
//   - Fair: waiters are served first come, first served, across processes.
//
// A backend without the capability an option needs makes the acquisition
// fail with ErrUnsupported before any store call; the Locker never falls
// back to an exclusive lock. Options.Policy refuses acquisitions that break
// a team's rules before they reach the store (ErrPolicy), and Stats counts
// held locks per subject for dashboards.
//
// # What is guaranteed
//
// A held lock is renewed every RenewInterval. The holder counts its lock from
// the moment it sent the last acquire or renewal that succeeded, and steps
// down by itself RenewDeadline later unless a renewal has succeeded since:
// Held turns false and the lock's context is cancelled with a cause wrapping
// ErrLockLost, by a timer, even if the holder's goroutines are stuck. The
// store keeps the lease for TTL after it received that request, which is
// later, so the holder stops before anyone else can acquire, provided the
// store keeps leases for their TTL and the clocks' rates drift apart by less
// than TTL - RenewDeadline over one TTL (3 s in 10 s with the defaults).
// Renewals and releases are owner-checked by a random per-acquisition token:
// a lock is owned by its *Lock, not by a goroutine, and any goroutine may
// release it; a second acquisition of a key by the same Locker is refused
// like anyone else's (locks are not reentrant).
//
// Do and TryDo release the lock only after the function has returned, and
// keep renewing it while the function winds down after its context was
// cancelled, so nobody else acquires the lock while it still runs (unless
// the lock was lost at the store, which the result then reports). The
// exception is AcquireOptions.MaxHold, which stops renewals when it passes:
// the lock then expires at the store one TTL after its last renewal,
// running function or not.
//
// While it holds a lock, a Locker also watches the lock's key (when the
// backend can watch) and renews at once when the watch reports anything or
// breaks, so a store that restarted and lost the lease is noticed within a
// round trip rather than at the next renewal.
//
// A waiter in Acquire (or Do) that lost contact with the store (its watch
// broke, or an attempt failed) does not take a free key for one TTL: the
// store may have restarted and lost a lease whose holder still holds it,
// until its renew deadline. It reads the keys in its way instead, and
// attempts again at once when it finds a lease it saw before there (the
// store kept its data). An acquisition during which its watch broke is
// released, never returned, and waited out the same way. TryAcquire and
// TryDo make one attempt and cannot wait, unless the store refuses for them:
// redisbackend's Options.RestartGuard refuses every free key until the
// server has been up for the caller's TTL, and the refusal is a HeldError
// with MayBeHeld (Acquire attempts again when it ends). See "When the store
// loses data" in the README.
//
// On a backend whose watches tell of renewals (backend.RenewalWatcher:
// redisbackend), a waiter in Acquire, Do or WaitFree does not take the key
// before a TTL has passed since the last renewal it heard of each holder in
// its way (or since the TTL the store last reported for it), by its own
// clock, even when the store shows the key free sooner: Redis expires keys
// by its wall clock, so a step of its clock forward ends leases early, as
// an eviction does. It tells holders apart by their terms, so a Shared
// holder's release does not end the wait for the others (a Shared waiter
// with a Limit waits for the Limit-th of them only). A waiter registered
// through backend.Modes (Fair, or Exclusive behind Shared holders or locks
// below) meanwhile refreshes its registration with
// backend.ModeRequest.RegisterOnly, which never takes the key. The holder
// learns of such a loss at its next renewal. TryAcquire and TryDo do not
// watch, so they may take such a key at once. See "When the store's clock
// is stepped" in the README.
//
// No lock can stop a paused process from acting late on a decision it took
// before the pause. Pass Lock.Term, the fencing term, with every write to a
// downstream store and have the store refuse terms lower than the highest it
// has seen (for SQL: UPDATE ... SET fencing_term = $term WHERE id = $id AND
// fencing_term <= $term). Terms strictly increase across release, expiry and
// re-acquisition of a key.
//
// # Testing
//
// Use memorybackend in tests: its clients can be partitioned, hung or slowed
// down, and inside a testing/synctest bubble every TTL and renewal runs on
// virtual time. Create the store, and close every Locker, inside the bubble:
// a Locker's goroutines and timers belong to it. A holder that crashed is a
// client that was partitioned: its lock is free one TTL after its last
// renewal, and its context was cancelled at its renew deadline before that
// (examples/tally/main_test.go tests an HTTP service this way).
package lock
