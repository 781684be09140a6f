// Package backend defines the contract between Sovereign's elector and the
// stores that hold its leases: an in-memory store (package memorybackend),
// Redis (package redisbackend) and etcd (package etcdbackend).
//
// Application code should use package sovereign. This package is for people
// who write or test a backend.
//
// # The contract
//
// A Backend holds leases on arbitrary string keys, so one Backend value serves
// many elections (and locks) at once. Every method takes a context first and
// performs one short operation against the store; it never retries, sleeps or
// runs timers on the caller's behalf. Retries, jitter, timers and events
// belong to the elector.
//
// A lease is acquired atomically and only when its key is free. Only the
// lease's own TTL (or its owner's release) ends it: nothing in this contract
// lets one holder remove another's live lease, and the absence of any other
// record (a heartbeat, a member entry) is never proof that a holder is dead.
// Each acquisition carries:
//
//   - a fencing term, strictly greater than every term ever handed out for that
//     key by the store, across release, expiry and re-acquisition;
//   - a random token, fresh for each acquisition, so that two processes
//     configured with the same holder ID can never renew or release each
//     other's lease.
//
// Renew and Release are owner-checked: they act only on the exact lease
// (key, holder ID, token) passed in, and report ErrLeaseLost otherwise.
//
// Heartbeats are liveness records, one per instance and key, each with its
// own TTL, independent of the lease. A record's age is measured by the store's
// clock, never by comparing wall clocks of different machines. They are
// information (membership, the holder's last sign of life, stale-leader
// reports), never a reason to end a lease.
//
// Per-key state is bounded in time: once a key's lease is released or has
// expired and its heartbeat records have expired, the store returns to its
// size before the key was first used, apart from a term counter that may
// outlive the key's last acquisition for a bounded retention (the backend
// documents it, and how terms keep increasing after the counter is gone) and
// bookkeeping of a deleted heartbeat record that lasts no longer than that
// record's TTL would have.
//
// The package backend/backendtest holds the conformance suite that every
// implementation must pass.
package backend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// LockKeyPrefix begins the backend key of every lock of package lock, so that
// locks and elections live in separate key spaces: a lock "billing" is stored
// under "lock/billing", and election names must not begin with the prefix.
const LockKeyPrefix = "lock/"

// Sentinel errors. Implementations return these (possibly wrapped, with %w)
// so callers can test for them with errors.Is.
var (
	// ErrHeld is returned by Acquire when the key is held by another lease.
	// The returned error is a *HeldError carrying the holder's record.
	ErrHeld = errors.New("backend: lease held by another holder")

	// ErrNotHeld is returned by Get when the key has no holder.
	ErrNotHeld = errors.New("backend: no holder")

	// ErrLeaseLost is returned by Renew and Release when the lease passed in
	// is no longer the one stored under its key: it expired, was released, or
	// was replaced by another acquisition (even one with the same holder ID).
	ErrLeaseLost = errors.New("backend: lease lost")

	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("backend: closed")

	// ErrInvalid is returned (wrapped, with detail) for arguments a backend
	// cannot accept: an empty key or holder ID, a TTL that is not positive, a
	// lease with no token.
	ErrInvalid = errors.New("backend: invalid argument")
)

// Record is the state of a key as read from the store: who holds it, since
// when, under which term, and how recently the holder proved it is alive.
type Record struct {
	// Key is the key the record was read from.
	Key string
	// HolderID is the configured ID of the instance holding the lease.
	HolderID string
	// Token is the random per-acquisition token of the lease.
	Token string
	// Term is the fencing term of the lease.
	Term uint64
	// AcquiredAt is when the lease was acquired, by the store's clock where
	// the store has one (otherwise the acquirer's). Informational: never use
	// it to compute expiry.
	AcquiredAt time.Time
	// RenewedAt is when the lease was last acquired or renewed, with the same
	// caveat as AcquiredAt.
	RenewedAt time.Time
	// TTL is the time the lease has left, as measured by the store when the
	// record was read.
	TTL time.Duration
	// Metadata is whatever the holder attached when acquiring.
	Metadata map[string]string
	// HeartbeatAt is the wall-clock time of the holder's last heartbeat for
	// this key, or the zero time if the holder has no live heartbeat record.
	HeartbeatAt time.Time
	// HeartbeatAge is how long ago the holder's last live heartbeat was
	// recorded, measured by the store's clock. It is meaningful only when
	// HeartbeatAt is not zero.
	HeartbeatAge time.Duration
	// Mode is how the holder holds the key: Exclusive for a lease from
	// Acquire, or the mode given to Modes.AcquireMode.
	Mode Mode
	// Limit is the Shared limit the holder acquired with (0: none).
	Limit int
}

// HasHeartbeat reports whether the holder had a live heartbeat record when
// the record was read.
func (r Record) HasHeartbeat() bool { return !r.HeartbeatAt.IsZero() }

// String formats the record for logs and %v, without its Token: the token
// proves ownership of the lease, and nobody needs it in a log line.
func (r Record) String() string {
	if r.HolderID == "" && r.Term == 0 {
		return fmt.Sprintf("{Key:%s free}", r.Key)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "{Key:%s HolderID:%s Term:%d", r.Key, r.HolderID, r.Term)
	if r.Mode != Exclusive || r.Limit != 0 {
		fmt.Fprintf(&b, " Mode:%v Limit:%d", r.Mode, r.Limit)
	}
	if !r.AcquiredAt.IsZero() {
		fmt.Fprintf(&b, " AcquiredAt:%s", r.AcquiredAt.Format(time.RFC3339Nano))
	}
	if !r.RenewedAt.IsZero() {
		fmt.Fprintf(&b, " RenewedAt:%s", r.RenewedAt.Format(time.RFC3339Nano))
	}
	fmt.Fprintf(&b, " TTL:%v", r.TTL)
	if r.HasHeartbeat() {
		fmt.Fprintf(&b, " HeartbeatAge:%v", r.HeartbeatAge)
	}
	if len(r.Metadata) > 0 {
		fmt.Fprintf(&b, " Metadata:%v", r.Metadata)
	}
	b.WriteString("}")
	return b.String()
}

// Lease is a lease held by the caller. It is a plain value: keep it and pass it
// back to Renew and Release.
type Lease struct {
	// Key is the key the lease is held on.
	Key string
	// HolderID is the holder ID given to Acquire.
	HolderID string
	// Token is the random per-acquisition token. Implementations may encode a
	// store-specific handle in it (an etcd lease ID, say); callers treat it
	// as opaque.
	Token string
	// Term is the fencing term: strictly greater than every earlier term of
	// the key.
	Term uint64
	// TTL is the time to live the store actually granted, which may be longer
	// than the one requested (etcd rounds up to whole seconds). Renew extends
	// the lease by this TTL.
	TTL time.Duration
	// Entry is nil for a lease from Acquire, and says how the lease holds
	// its key for one from Modes.AcquireMode: Renew, Release and
	// SetMetadata then act on that entry alone.
	Entry *Entry
}

// AcquireRequest describes an acquisition.
type AcquireRequest struct {
	// Key is the key to acquire. Required.
	Key string
	// HolderID identifies the instance. Required.
	HolderID string
	// TTL is the requested time to live. Required, positive.
	TTL time.Duration
	// Metadata is stored with the lease and returned in Records.
	Metadata map[string]string
	// Detached asks for a lease that nothing but its own Renew keeps
	// alive: it ends at its TTL once its holder stops renewing it. A
	// backend that keeps the leases of an instance alive together (etcd's
	// session: one store lease for many keys) gives such a lease one of
	// its own. The lock package sets it for NoRenew and MaxHold locks.
	Detached bool
	// Reclaim says that the caller held a lease of this key until a
	// renewal found it gone before the caller's renew deadline: the store
	// lost it (a restart), so nobody else can have held the key since. A
	// backend that refuses free keys after a restart (redisbackend's
	// Options.RestartGuard, memorybackend's RestartOptions.Guard) lets such
	// an acquisition through; it changes nothing else. The elector sets it
	// on its attempts after losing its lease that way, until the store
	// answers one or the old deadline passes (decided when the attempt is
	// sent, not when it was scheduled).
	Reclaim bool
}

// Member is the live heartbeat record of one instance for a key.
type Member struct {
	// ID is the instance's ID.
	ID string
	// HeartbeatAt is the wall-clock time the instance sent with its last
	// heartbeat. Informational.
	HeartbeatAt time.Time
	// Age is how long ago the last heartbeat was recorded, by the store's
	// clock.
	Age time.Duration
	// TTL is the time the record has left, by the store's clock.
	TTL time.Duration
}

// Backend is a store of leases. Implementations must be safe for concurrent
// use by multiple goroutines.
type Backend interface {
	// Acquire atomically creates a lease on req.Key if the key is free: on
	// a backend with Modes, a key is held while it has a live holder or a
	// live intent (registered waiters do not block Acquire). When
	// the key is held by another lease it returns a *HeldError
	// (errors.Is(err, ErrHeld)) whose Holder is the current record, so a
	// failed attempt doubles as a read.
	Acquire(ctx context.Context, req AcquireRequest) (Lease, error)

	// Renew extends the lease by lease.TTL if, and only if, the store still
	// holds that exact lease (key, holder ID and token). Otherwise it returns
	// ErrLeaseLost.
	Renew(ctx context.Context, lease Lease) error

	// Release deletes the lease if, and only if, the store still holds that
	// exact lease; otherwise it returns ErrLeaseLost and changes nothing. The
	// key's term counter survives the release.
	Release(ctx context.Context, lease Lease) error

	// SetMetadata replaces the metadata stored with the lease if, and only
	// if, the store still holds that exact lease (key, holder ID and token);
	// otherwise it returns ErrLeaseLost and changes nothing. It does not
	// extend the lease. Watchers may or may not see an EventChanged for it.
	SetMetadata(ctx context.Context, lease Lease, metadata map[string]string) error

	// Get returns the current record of key, or ErrNotHeld when the key has no
	// holder.
	Get(ctx context.Context, key string) (Record, error)

	// List returns the records of every held key that begins with prefix
	// (every held key when prefix is empty), sorted by key. It lists leases
	// only, never heartbeat or bookkeeping records, and it does not block
	// the store (no KEYS on Redis: SCAN on every primary). Records may be
	// read at slightly different instants, and need not carry the heartbeat
	// fields. The prefix is matched literally and is not validated.
	List(ctx context.Context, prefix string) ([]Record, error)

	// Heartbeat records that instance id is alive, under its own record for
	// key, which expires after ttl unless refreshed.
	Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error

	// Members returns the live heartbeat records of key, sorted by ID.
	Members(ctx context.Context, key string) ([]Member, error)

	// RemoveMember deletes the heartbeat record of instance id for key. It is
	// not an error if there is none.
	RemoveMember(ctx context.Context, key, id string) error

	// ValidateKey reports, without I/O, whether the backend can store key:
	// nil, or an error wrapping ErrInvalid that says why not (etcd rejects
	// keys containing "/heartbeat/", say). Callers check names up front so a
	// bad one is refused at construction instead of failing every call.
	ValidateKey(key string) error

	// MinTTL returns the smallest lease TTL the backend can honour. Acquire
	// may grant more than requested (Lease.TTL says what was granted), but a
	// TTL below MinTTL is refused by the elector and the lock package.
	MinTTL() time.Duration

	// Close releases the backend's own resources (not the leases it handed
	// out, and not a client the user passed in). Methods called after Close
	// return ErrClosed, except ValidateKey and MinTTL, which do no I/O.
	// Close is idempotent.
	Close() error
}

// EventType says what a watch event reports.
type EventType int

const (
	// EventChanged reports that the key was acquired, renewed by a new
	// holder, or otherwise changed.
	EventChanged EventType = iota + 1
	// EventReleased reports that the holder released the key.
	EventReleased
	// EventExpired reports that the key's lease expired.
	EventExpired
	// EventReset reports that the watch's connection to the store was
	// re-established, or that the store restarted: changes may have been
	// missed and the store may have lost data (a restart without
	// persistence, a failover). A holder renews at once when it sees it, so
	// that it learns within a round trip whether its lease survived; a
	// waiter re-reads. A backend whose watch channel closes when its
	// connection breaks need not send it: the elector and the lock package
	// treat a re-subscription after a closed channel the same way. After a
	// restart that lost data a watch must either close or send EventReset;
	// after one that kept it, a watch that resumes without missing a change
	// may simply go on delivering.
	EventReset
	// EventRenewed reports that the key's lease was renewed, and Event.TTL
	// the TTL it was renewed for: the store received the renewal before the
	// event left, so the lease lives at least that long from the event's
	// arrival, by the receiver's clock (see RenewalWatcher). Only
	// RenewalWatcher.WatchRenewals delivers it.
	EventRenewed
)

// String returns the name of the event type.
func (t EventType) String() string {
	switch t {
	case EventChanged:
		return "changed"
	case EventReleased:
		return "released"
	case EventExpired:
		return "expired"
	case EventReset:
		return "reset"
	case EventRenewed:
		return "renewed"
	default:
		return fmt.Sprintf("EventType(%d)", int(t))
	}
}

// Event is a watch notification. Events are hints that something changed:
// the receiver reads the current state with Get or Acquire.
type Event struct {
	Key  string
	Type EventType
	// TTL is, for EventRenewed, the TTL the lease was renewed for; zero
	// otherwise.
	TTL time.Duration
	// Term is, for EventRenewed and, where the store tells it,
	// EventReleased, the fencing term of the lease or entry renewed or
	// released (several entries of Modes may hold one key); zero when
	// unknown.
	Term uint64
}

// Watcher is an optional capability of a Backend: a Backend that also
// implements Watcher lets waiting candidates learn of a release (and, where the
// store can tell, an expiry) without polling.
type Watcher interface {
	// Watch subscribes to changes of key. It returns only once the
	// subscription is established, so any change made after Watch returns is
	// delivered. Events are delivered on the returned channel without ever
	// blocking the backend: when the receiver falls behind, events may be
	// coalesced, never lost entirely (at least one event follows any change).
	// The channel is closed when ctx ends, when the backend is closed, or
	// when the subscription breaks; the caller then watches again.
	Watch(ctx context.Context, key string) (<-chan Event, error)
}

// WatchNotifier is an optional capability of a Watcher: a subscription that
// also tells its receiver, by a function call, that the channel has
// something to read, so that the receiver need not keep a goroutine blocked
// on the channel while it waits. The elector uses it to cost no goroutine
// while it waits with nothing to do.
type WatchNotifier interface {
	// WatchNotify is Watch (the same subscription: same channel, events,
	// coalescing and close rules), and it calls notify after every event
	// it sends on the channel (or drops because the channel is full) and
	// after it closes the channel, so that a receiver woken by notify finds
	// the event, or the closed channel, with a receive that does not block.
	// notify may be called from any goroutine, concurrently with itself,
	// with the backend's locks held, and more often than there are events
	// (a receiver must take a call as "look", not as "one event"); it must
	// return promptly and must not call the backend. A nil notify makes
	// WatchNotify the same as Watch.
	WatchNotify(ctx context.Context, key string, notify func()) (<-chan Event, error)
}

// RenewalWatcher is an optional capability of a Watcher whose watches can
// also tell of every renewal of a key's lease, as Redis's can (the renewal
// script publishes it). A waiter that hears of each renewal knows, by its
// own clock, how long the lease lives at least, so it does not take the key
// before then even when the store shows it free earlier: a store whose
// clock was stepped forward (Redis times key expiry by its wall clock), an
// evicted key, a lease deleted by hand. Only the lease's own TTL ends it.
// A store that times expiry by a clock that is never stepped and reports
// every expiry (etcd, memory) has no need of it.
type RenewalWatcher interface {
	// WatchRenewals is WatchNotify (the same subscription: same events,
	// coalescing and close rules), and it also delivers an EventRenewed,
	// with the TTL and the term, for each renewal of the key's lease from
	// Acquire (by Renew or a BatchRenewer), of an entry of Modes on the
	// key, and of an entry below the key whose intent on it the renewal
	// extends; its EventReleased carry the released lease's or entry's
	// term too (several Shared entries may hold a key, and a waiter tells
	// by the term which one is gone). A renewal event
	// dropped because the channel was full leaves the receiver with an
	// earlier renewal's, so it may look at the key early, as it would
	// without renewal events; one received late makes it look late.
	WatchRenewals(ctx context.Context, key string, notify func()) (<-chan Event, error)
}

// RenewalMuter is an optional capability of a RenewalWatcher: a watch
// whose renewal events its receiver can turn off and on again. The holder
// of a key has no use for the renewals of its own lease, and on Redis each
// would come back to its process as a message: a process leading 10,000
// elections would get 3,000 a second, each waking the elector that renewed
// it. A backend that can stops receiving them while the watch is muted (the
// Redis backend publishes renewals on a channel of their own, which a muted
// watch leaves), and the elector mutes its watch while it leads.
type RenewalMuter interface {
	// WatchRenewalsMuted is WatchRenewals, except that while muted is set
	// (Mute.Load) it delivers no EventRenewed (and calls notify for none);
	// its other events are unchanged. The receiver sets it at any time,
	// from any goroutine; several watches may share one. Renewal events
	// resume a short while after it is cleared, once the backend listens
	// to them again: a renewal published in between is not delivered,
	// which costs a receiver that has just stopped holding the key nothing
	// (the next holder's first renewal comes a renew interval after an
	// acquisition that follows its release). If listening again fails, the
	// watch's channel is closed, as when its subscription breaks: a watch
	// never stays open without the renewal events it was asked for.
	WatchRenewalsMuted(ctx context.Context, key string, notify func(), muted *Mute) (<-chan Event, error)
}

// Mute is the switch of a RenewalMuter's watches: their renewal events are
// off while it is set. Its zero value is clear and ready to use; it must
// not be copied after first use. Store and Load are atomic, as those of an
// atomic.Bool; OnChange lets a backend act on a change (the Redis backend
// leaves or rejoins a pub/sub channel).
type Mute struct {
	on    atomic.Bool
	mu    sync.Mutex // guards hooks and next
	hooks map[uint64]func()
	next  uint64
}

// Store sets (true: muted) or clears the switch. When that changes it, it
// calls each function registered with OnChange before it returns.
func (m *Mute) Store(muted bool) {
	m.mu.Lock()
	if m.on.Swap(muted) == muted || len(m.hooks) == 0 {
		m.mu.Unlock()
		return
	}
	hooks := make([]func(), 0, len(m.hooks))
	for _, f := range m.hooks {
		hooks = append(hooks, f)
	}
	m.mu.Unlock()
	for _, f := range hooks {
		f()
	}
}

// Load reports whether the switch is set.
func (m *Mute) Load() bool { return m.on.Load() }

// OnChange registers f, which Store calls after each change of the
// switch, from the goroutine that called Store, without holding any lock
// of m: f reads the new state with Load (two Stores racing may call it in
// either order), must not block, and may call m's methods. It returns a
// function that unregisters f; a Store already under way may still call f
// once after it returns.
func (m *Mute) OnChange(f func()) (cancel func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hooks == nil {
		m.hooks = make(map[uint64]func())
	}
	id := m.next
	m.next++
	m.hooks[id] = f
	return func() {
		m.mu.Lock()
		delete(m.hooks, id)
		m.mu.Unlock()
	}
}

// AcquireConfirmer is an optional capability of a Backend whose Acquire
// reply is the store's own record of the lease it wrote, written and read
// in one atomic step (a Redis script, an etcd transaction, the memory
// store under its lock): a read right after it would tell nothing more. The
// elector's double verification then checks that reply, the store's answer
// to the compare-and-set, instead of sending a second request.
type AcquireConfirmer interface {
	// AcquireConfirms reports whether Acquire's reply confirms the lease.
	AcquireConfirms() bool
}

// ExpiryReporter is an optional capability of a Watcher whose watches
// deliver every expiry of a watched key's lease (EventExpired, or another
// event) while they live, as etcd's and the memory store's do and Redis's
// (without keyspace notifications) do not. A follower whose watch is
// established then need not poll for the leader's expiry: it looks again
// when an event arrives, and when the watch breaks (the re-subscription is
// a reset).
type ExpiryReporter interface {
	// ReportsExpiry reports whether watches deliver every expiry.
	ReportsExpiry() bool
}

// HeldError is returned by Acquire when the key is held by another lease.
// errors.Is(err, ErrHeld) reports true for it.
type HeldError struct {
	// Holder is the record of the current holder; of the oldest
	// conflicting holder when there are several.
	Holder Record
	// Holders is every conflicting live holder, in term order, when the
	// key is held by entries of Modes (Shared holders, intents of locks
	// below); nil or just Holder otherwise.
	Holders []Record
	// Waiting is the number of live waiters registered on the key that
	// the failed acquisition had to yield to (writer preference, fair
	// order); 0 when none or when the backend does not say.
	Waiting int
	// MayBeHeld reports a refusal without a holder: the store found the
	// key free but may have lost a live lease of it (it restarted less than
	// a TTL ago; see redisbackend's Options.RestartGuard), so it does not
	// hand it out yet. Holder then has only Key and TTL, the time until it
	// stops refusing, and Holders is nil.
	MayBeHeld bool
}

// Error returns a message naming the holder, its term and since when it holds.
func (e *HeldError) Error() string {
	if e.MayBeHeld {
		return fmt.Sprintf("backend: %q may be held: the store restarted less than a TTL ago and may have lost its lease; refused for %v more",
			e.Holder.Key, e.Holder.TTL)
	}
	return fmt.Sprintf("backend: %q held by %q (term %d) since %s",
		e.Holder.Key, e.Holder.HolderID, e.Holder.Term, e.Holder.AcquiredAt.Format(time.RFC3339Nano))
}

// Is reports whether target is ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Validate checks the fields every backend requires of an AcquireRequest and
// returns an error wrapping ErrInvalid when one is missing or out of range.
func (r AcquireRequest) Validate() error {
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: empty key", ErrInvalid)
	case r.HolderID == "":
		return fmt.Errorf("%w: empty holder ID", ErrInvalid)
	case r.TTL <= 0:
		return fmt.Errorf("%w: TTL %v is not positive", ErrInvalid, r.TTL)
	}
	return nil
}

// Validate checks the fields every backend requires of a Lease passed to Renew
// or Release and returns an error wrapping ErrInvalid when one is missing.
func (l Lease) Validate() error {
	switch {
	case l.Key == "":
		return fmt.Errorf("%w: lease has an empty key", ErrInvalid)
	case l.HolderID == "":
		return fmt.Errorf("%w: lease has an empty holder ID", ErrInvalid)
	case l.Token == "":
		return fmt.Errorf("%w: lease has no token", ErrInvalid)
	case l.TTL <= 0:
		return fmt.Errorf("%w: lease TTL %v is not positive", ErrInvalid, l.TTL)
	}
	return nil
}

// NewToken returns a fresh random token of 128 bits, hex-encoded, for use as a
// Lease token. It panics only if the operating system's random source fails.
func NewToken() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("backend: crypto/rand failed: " + err.Error())
	}
	return hex.EncodeToString(b[:])
}

// ValidateHeartbeat checks the arguments of Heartbeat and returns an error
// wrapping ErrInvalid when one is missing or out of range.
func ValidateHeartbeat(key, id string, ttl time.Duration) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalid)
	case id == "":
		return fmt.Errorf("%w: empty instance ID", ErrInvalid)
	case ttl <= 0:
		return fmt.Errorf("%w: heartbeat TTL %v is not positive", ErrInvalid, ttl)
	}
	return nil
}
