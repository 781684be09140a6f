package backend

import (
	"context"
	"errors"
	"fmt"
)

// This file is the contract of shared locks, semaphores, hierarchies (intent
// locks) and fair queueing: the optional capability Modes.
//
// # Model
//
// Without Modes a key has at most one holder (a lease from Acquire). With
// Modes a key also has a set of entries, each with its own token, fencing
// term (from the key's one term counter, shared with Acquire), holder ID,
// TTL and metadata:
//
//   - holders: an Exclusive holder (alone on its key) or Shared holders
//     (any number, or at most a limit: a semaphore);
//   - intents: when an acquisition is hierarchical it also takes intent on
//     each ancestor key it names, atomically with the lock itself, for as
//     long as the lock lives (renewed and released with it);
//   - waiters: an acquirer that failed and gave a WaitID is registered as
//     waiting, with its own TTL, in registration order.
//
// Every entry expires on its own at its own TTL (a crashed reader or permit
// holder frees its place after its TTL; a crashed waiter stops blocking
// others after its TTL), by the store's clock. Plain Acquire and AcquireMode
// see each other: a key with a live holder or intent is held for Acquire
// (its HeldError names the oldest of them; waiters do not block Acquire),
// and a key with a lease from Acquire is an Exclusive holder for
// AcquireMode.
//
// # Conflicts
//
// An acquisition of key K in mode M fails with a *HeldError (errors.Is
// ErrHeld) listing the conflicting live holders in Holders when:
//
//   - M is Exclusive and K has any live holder or any live intent;
//   - M is Shared and K has a live Exclusive holder, a live intent taken by
//     an Exclusive lock below K, or Limit live Shared holders already;
//   - M is Shared, the acquisition is not Fair, and K has a live waiter in
//     Exclusive mode (writer preference: readers cannot starve a writer);
//   - the acquisition is Fair and K has a live waiter registered before this
//     acquirer's own registration (or any live waiter, when it has none);
//   - it is hierarchical and an ancestor has a live Exclusive holder, or, for
//     an Exclusive lock, a live Shared holder;
//   - it is hierarchical, not Fair, and an ancestor has a live waiter in
//     Exclusive mode, whatever the acquisition's own mode (writer preference
//     across the tree: a stream of locks below cannot starve an Exclusive
//     lock above). Only Exclusive waiters count; Shared waiters on an
//     ancestor do not. Backends implementing this rule set
//     ModeSupport.AncestorWaiters.
//
// For a conflict with an intent, Holders carries the record of the lock
// below (its Key is that lock's key). When only waiters stand in the way,
// Holders is empty, Waiting counts them, and Holder is the key's oldest
// holder (or a record with just Key when it has none). When only an
// ancestor's Exclusive waiters stand in the way, Holders is empty, Waiting
// counts the Exclusive waiters of that ancestor (the first of Ancestors,
// outermost first, that has any) and Holder is a record whose Key is the
// ancestor's key (its oldest holder when it has one). ErrLimitMismatch
// takes precedence over ErrHeld.
// A non-fair Exclusive acquisition does not yield to fair waiters (it may
// jump the line). A Shared acquisition whose Limit differs from the limit of
// the key's live Shared holders fails with an error wrapping
// ErrLimitMismatch and writes nothing.
//
// The ancestor-waiter rule has the usual caveat of writer-preferring
// reader-writer locks: a holder of a lock below that takes a second lock
// below while an Exclusive waiter above is registered waits for that waiter,
// which itself waits for the first lock. The waiter's registration TTL
// bounds it once either side gives up: a waiter that stops re-trying stops
// blocking after its TTL (at once if it withdraws with CancelWait). Plain
// Acquire (no Modes), acquisitions without Ancestors and Fair acquisitions
// (which keep their own line) are not affected.
//
// Hierarchy is a protocol every acquirer of a tree follows: a lock taken
// without Ancestors takes no intent, so an ancestor's Exclusive lock does
// not see it.
//
// # Leases
//
// AcquireMode returns a Lease whose Entry is set. Renew, Release and
// SetMetadata (the Backend methods) go by Entry: a lease without it never
// matches an entry, nor one with it a plain lease (ErrLeaseLost). They act
// on that entry alone, owner-checked by token: renewing extends the entry and its intents, releasing deletes them
// (and publishes the release to watchers of the key and of its ancestors).
// Get returns one record of a key's live holders (the oldest) and List one
// record per live holder, in key order and, within a key, term order.
// Neither reports intents or waiters: a key held only by intents of locks
// below it is free for Get (ErrNotHeld) while Acquire on it fails.
// Watchers of a key see EventReleased when an entry of it is released and,
// where the store can tell, EventExpired when one expires; a waiter must in
// any case re-try before its own registration's TTL runs out.

// Mode says how a lease holds its key.
type Mode uint8

const (
	// Exclusive is the default: the holder is alone on its key.
	Exclusive Mode = iota
	// Shared lets many holders (or at most a limit of them) hold a key at
	// once, excluding Exclusive holders.
	Shared
)

// String returns "exclusive" or "shared".
func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	default:
		return fmt.Sprintf("Mode(%d)", int(m))
	}
}

var (
	// ErrUnsupported is returned when a backend lacks a capability a request
	// needs (Shared mode, a limit, hierarchy, fair queueing). It is never
	// answered with a silent exclusive lock.
	ErrUnsupported = errors.New("backend: unsupported")

	// ErrLimitMismatch is returned by AcquireMode when a Shared acquisition's
	// Limit differs from the limit the key's live Shared holders agreed on.
	ErrLimitMismatch = errors.New("backend: shared lock limit mismatch")

	// ErrRegisteredOnly is returned by AcquireMode with
	// ModeRequest.RegisterOnly when the acquisition would have succeeded:
	// the registration was written (for a request that registers), the key
	// was not taken. It does not match ErrHeld.
	ErrRegisteredOnly = errors.New("backend: registered only, the key was not taken")
)

// ModeSupport says which parts of Modes a backend implements.
type ModeSupport struct {
	Shared       bool // Mode Shared, with and without Limit
	Hierarchical bool // ModeRequest.Ancestors
	Fair         bool // ModeRequest.Fair
	WriterFirst  bool // exclusive waiters block new Shared holders
	// AncestorWaiters says the backend implements the ancestor-waiter rule
	// (see Conflicts): Exclusive waiters on an ancestor block new
	// hierarchical locks below it.
	AncestorWaiters bool
}

// ModeRequest describes an acquisition by AcquireMode.
type ModeRequest struct {
	AcquireRequest
	// Mode is Exclusive (the zero value) or Shared.
	Mode Mode
	// Limit is, for Shared, the most live Shared holders the key may have
	// (0: no limit). Every Shared holder of a key must give the same limit.
	Limit int
	// Ancestors are the keys, outermost first, on which the acquisition
	// takes intent (a lock on "lock/a/b/c" names "lock/a" and "lock/a/b").
	// Empty: not hierarchical. Every ancestor must pass ValidateKey and be
	// a proper prefix of Key; a backend places a tree's keys so that one
	// atomic operation reaches them all (Redis Cluster: one hash slot). A
	// sharded store may refuse, with ErrInvalid, ancestors it cannot place
	// with the key (on Redis Cluster only trees under "lock/" work).
	Ancestors []string
	// Fair orders acquisitions first come, first served among registered
	// waiters across processes.
	Fair bool
	// WaitID, when not empty, registers (or refreshes) the caller as a
	// waiter of the key, with TTL, if the acquisition fails with ErrHeld;
	// a success removes the registration. Waiters in Exclusive mode block
	// new Shared holders; with Fair every waiter keeps its place in line.
	// A caller keeps its registration by trying again before TTL runs out,
	// and withdraws it with CancelWait. WaitID is random per wait.
	WaitID string
	// RegisterOnly makes the call a refresh of the WaitID registration
	// that never takes the key: it registers (or refreshes) WaitID as a
	// failed acquisition would (Exclusive or Fair requests only), and
	// answers a *HeldError when the acquisition would have failed, or
	// ErrRegisteredOnly when it would have succeeded, writing no entry or
	// intent either way. A waiter uses it when it knows that a holder in
	// its way may still hold the key although the store may show it free
	// (see RenewalWatcher), so that its registration does not lapse
	// meanwhile. It needs WaitID.
	RegisterOnly bool
}

// Entry is set on a Lease granted by AcquireMode.
type Entry struct {
	// Mode is the mode the lease holds its key in.
	Mode Mode
	// Limit is the Shared limit the lease was acquired with.
	Limit int
	// Ancestors are the keys the lease holds intent on.
	Ancestors []string
}

// Modes is an optional capability of a Backend: shared locks, semaphores,
// hierarchies and fair queueing (see the model above). Each method is one
// atomic operation in the store (one script on Redis, one transaction on
// etcd; a Fair retry through another client than the one that registered
// the waiter may take two). A backend may cap what one operation can hold
// (etcd: a limit of 64, fewer ancestors with a larger limit, from etcd's
// transaction size) and refuses larger requests with ErrUnsupported before
// any I/O.
type Modes interface {
	// ModeSupport says which requests AcquireMode accepts; it does no I/O.
	ModeSupport() ModeSupport

	// AcquireMode acquires req.Key in req.Mode, taking intent on
	// req.Ancestors, atomically. On a conflict it returns a *HeldError
	// with every conflicting holder in Holders (and registers req.WaitID).
	// A request the backend cannot serve fails with ErrUnsupported.
	AcquireMode(ctx context.Context, req ModeRequest) (Lease, error)

	// Holders returns the record of every live holder of key (Shared
	// holders each with their own), in term order; an empty slice when the
	// key is free. Records carry Mode and Limit.
	Holders(ctx context.Context, key string) ([]Record, error)

	// CancelWait withdraws the waiter registration waitID of key (an empty
	// waitID is ErrInvalid). It is not an error when there is none.
	// Watchers of the key see an EventChanged when a registration is
	// withdrawn or, where the store can tell, expires, so the waiters
	// behind it look again.
	CancelWait(ctx context.Context, key, waitID string) error
}

// Validate checks a ModeRequest's fields beyond AcquireRequest.Validate and
// returns an error wrapping ErrInvalid when one is out of range.
func (r ModeRequest) Validate() error {
	if err := r.AcquireRequest.Validate(); err != nil {
		return err
	}
	switch {
	case r.Mode != Exclusive && r.Mode != Shared:
		return fmt.Errorf("%w: unknown mode %v", ErrInvalid, r.Mode)
	case r.Limit < 0:
		return fmt.Errorf("%w: limit %d is negative", ErrInvalid, r.Limit)
	case r.Limit > 0 && r.Mode != Shared:
		return fmt.Errorf("%w: limit %d given for an exclusive lock", ErrInvalid, r.Limit)
	case r.RegisterOnly && r.WaitID == "":
		return fmt.Errorf("%w: register only without a wait ID", ErrInvalid)
	}
	for i, a := range r.Ancestors {
		if a == "" || a == r.Key {
			return fmt.Errorf("%w: ancestor %d is %q", ErrInvalid, i, a)
		}
		if len(a) >= len(r.Key) || r.Key[:len(a)] != a {
			return fmt.Errorf("%w: ancestor %q is not a prefix of key %q", ErrInvalid, a, r.Key)
		}
		if i > 0 && len(a) <= len(r.Ancestors[i-1]) {
			return fmt.Errorf("%w: ancestors are not outermost first", ErrInvalid)
		}
	}
	return nil
}

// Check reports whether s supports req, and an error wrapping
// ErrUnsupported naming what is missing otherwise.
func (s ModeSupport) Check(req ModeRequest) error {
	switch {
	case req.Mode == Shared && !s.Shared:
		return fmt.Errorf("%w: shared locks", ErrUnsupported)
	case len(req.Ancestors) > 0 && !s.Hierarchical:
		return fmt.Errorf("%w: hierarchical locks", ErrUnsupported)
	case req.Fair && !s.Fair:
		return fmt.Errorf("%w: fair queueing", ErrUnsupported)
	}
	return nil
}
