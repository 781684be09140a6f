// Package memorybackend is an in-process implementation of backend.Backend,
// backend.Watcher and backend.Modes, made for tests.
//
// A Store is the shared state of one simulated cluster; each candidate in a
// test gets its own client of it with Store.Client, so faults can be injected
// into one candidate's connection while the others keep working:
//
//	store := memorybackend.NewStore()
//	a, b := store.Client(), store.Client()
//	a.Partition() // a's calls fail at once with ErrPartitioned
//	a.Heal()
//
// The faults of a client are Partition (every call fails at once), Hang
// (every call blocks until its context ends), SetLatency (every call waits
// before it acts) and Heal (clears them all). Calls reports how many
// operations a client made. The store itself can lose its data with
// Store.Restart, and a heartbeat record can be deleted by hand with
// RemoveMember.
//
// # Time
//
// The store reads the time with time.Now and computes expiry lazily from it
// on every access. It starts no goroutine of its own: the only code that
// runs outside a caller's call is the short callback of a key's expiry timer
// (time.AfterFunc), which delivers EventExpired when a lease expires and
// forgets the key once nothing of it is left (see Bounded state), and that of
// a watch whose context ends (context.AfterFunc), which closes it. Inside a
// testing/synctest bubble time is therefore virtual, and a test can let a
// lease expire with time.Sleep at no cost. Create the store, its clients and
// their watches inside the bubble that uses them: the store's expiry timers
// and channels belong to the bubble they were created in, and the synctest
// package panics when they are used from outside it.
//
// # Terms
//
// Fencing terms come from one counter shared by every key of the store: each
// acquisition, of any key, takes the next value. A key's terms therefore
// strictly increase across release, expiry and re-acquisition without the
// store remembering anything about a key it no longer holds. Terms are not
// consecutive per key: a key acquired after another key was acquired twice
// may get term 3 first. The counter survives Restart unless
// RestartOptions.LoseTerms says otherwise.
//
// # Bounded state
//
// The store keeps a key's state only while the key has a lease, a heartbeat
// record that has not expired, or a watch. A key released with no heartbeat
// records or watches is forgotten at once; otherwise it is forgotten when its
// lease has expired, its last heartbeat record has expired (its expiry timer
// fires then) and its watches are closed. Len reports how many keys the
// store holds state for. The store rebuilds its key map once it has shrunk
// to a quarter of its peak, so a store that once held many keys gives their
// memory back.
//
// # Watch
//
// Watch delivers EventChanged when anyone acquires the key, EventReleased on
// a release and EventExpired when a lease expires. Renewals and SetMetadata
// are not reported. Expiry is noticed by whichever comes first: the key's
// expiry timer, armed for the lease's expiry time (re-armed when a renewal
// has pushed the expiry further), or any call that touches the key after the
// expiry time. Either way, one EventExpired is delivered per expired lease, at
// the lease's expiry time by the store's clock (virtual time in a bubble).
//
// Each watch channel buffers 16 events; when it is full, further events are
// dropped (the buffered ones already tell the receiver to look). While the
// watching client is partitioned or hung, its watches deliver nothing (a
// partition cuts notifications too); when Heal clears the fault, each watch
// that missed events receives one EventChanged so the receiver re-reads the
// state. Latency does not delay events. Watch itself fails on a partitioned
// client and blocks on a hung one, like every other call.
//
// Store.Restart closes every watch channel of every client, the way a
// backend whose connection to the store breaks does; it sends no EventReset.
// A receiver sees its channel closed, watches again, and treats the new
// subscription as a reset: anything may have changed meanwhile.
//
// # Modes
//
// A client implements every part of backend.Modes (shared locks,
// semaphores, hierarchies, fair queueing, writer preference, Exclusive
// waiters on an ancestor blocking new hierarchical locks below it) unless
// SetModeSupport restricts it. Every entry and waiter has its own expiry,
// applied like a lease's: its key's expiry timer fires at the earliest one,
// and EventExpired goes to the watchers of the entry's key and of each of
// its ancestors. A release sends EventReleased to the same watchers;
// CancelWait and a waiter's expiry send EventChanged, so that the waiters
// behind it look again. Terms come from the store-wide counter. Len counts
// a key while it has entries, intents or waiters, and Restart loses them
// all, like leases.
package memorybackend

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// ErrPartitioned is returned (wrapped) by every call of a client on which
// Partition was called, until Heal.
var ErrPartitioned = errors.New("memorybackend: partitioned")

const (
	// watchBuffer is the capacity of each watch channel.
	watchBuffer = 16
	// shrinkMin is the size below which the store never rebuilds its key
	// map: a Go map does not give memory back when entries are deleted, so
	// the store copies its keys to a new map once they have fallen to a
	// quarter of their peak.
	shrinkMin = 1024
)

// Store is the shared state of one simulated cluster: leases, the term
// counter, heartbeat records and watches. It is safe for concurrent use. A
// Store has no resources to free; it is garbage once its clients are.
type Store struct {
	mu   sync.Mutex           // guards the fields below, everything reachable from keys, and Backend.watches
	keys map[string]*keyState // keys with a lease, heartbeat records or watches
	peak int                  // largest len(keys) since keys was last rebuilt
	term uint64               // last term handed out, for any key
	// guardUntil is when the refusal of RestartOptions.Guard ends.
	guardUntil time.Time
	// dirty holds keys whose entries or intents changed while another key
	// was being worked on; flushLocked settles them at the end of the
	// operation, so that no key is forgotten while a caller still uses it.
	dirty []*keyState
}

// keyState is the state of one key. A keyState is dropped from Store.keys as
// soon as it has no lease, no heartbeat records and no watches.
type keyState struct {
	name    string
	lease   *lease              // nil when the key is free
	modes   *modeState          // nil while the key has no entry, intent or waiter
	beats   map[string]*beat    // nil when there are none
	watches map[*watch]struct{} // nil when there are none
	timer   *time.Timer         // the expiry timer; nil until first armed
	timerAt time.Time           // when timer fires; zero when it is not pending
}

type lease struct {
	holder, token string
	term          uint64
	acquiredAt    time.Time
	renewedAt     time.Time
	expires       time.Time
	metadata      map[string]string
}

type beat struct {
	at      time.Time
	expires time.Time
}

type watch struct {
	key    *keyState
	client *Backend
	ch     chan backend.Event
	stop   func() bool // unregisters the context.AfterFunc
	notify func()      // called after each send and after the close; nil for none
	closed bool
	missed bool // an event was withheld because the client was faulted
}

// NewStore returns an empty store.
func NewStore() *Store {
	return &Store{keys: make(map[string]*keyState)}
}

// New returns a client of a fresh store: a Backend for tests that need only
// one candidate.
func New() *Backend {
	return NewStore().Client()
}

// Client returns a new client of the store, with its own fault settings,
// call counts and closed state.
func (s *Store) Client() *Backend {
	return &Backend{
		store:   s,
		done:    make(chan struct{}),
		changed: make(chan struct{}),
		calls:   make(map[string]int64),
		watches: make(map[*watch]struct{}),
	}
}

// RestartOptions says what Store.Restart keeps and loses. The zero value (and
// a nil *RestartOptions) is a restart without persistence that keeps the term
// counter.
type RestartOptions struct {
	// KeepLeases keeps every lease and heartbeat record, as a store restarted
	// with persistence (or a reconnect) does: only the watches break.
	KeepLeases bool
	// LoseTerms resets the term counter, as a store that keeps no term source
	// across a restart does: the next acquisition gets term 1 again, so a
	// key's terms no longer strictly increase across the restart. Use it to
	// show what fencing cannot protect against.
	LoseTerms bool
	// Guard makes the store refuse every free key for this long after the
	// restart, as redisbackend's Options.RestartGuard does for a TTL after
	// a Redis server starts: Acquire and AcquireMode fail with a
	// *backend.HeldError whose MayBeHeld is set, with no holder and the
	// time the refusal still lasts as Holder.TTL, except for a reclaim
	// (AcquireRequest.Reclaim). Use it to test how your code handles that
	// refusal. 0: none.
	Guard time.Duration
}

// Restart simulates a restart of the store, or of the whole simulated
// cluster. Unless opts.KeepLeases is set, every lease and every heartbeat
// record is lost: owners learn it from ErrLeaseLost on their next Renew,
// Release or SetMetadata, nobody receives EventReleased or EventExpired, and
// the keys can be acquired at once. With opts.LoseTerms the term counter is
// reset too (see RestartOptions). In every case every watch channel of every
// client is closed, as a broken connection closes it, so receivers watch
// again; no EventReset is sent. Clients stay open, keep their faults and
// work again at once, as if they had reconnected. The expiry timers of lost
// leases and records are stopped. Restart never blocks on a client and is
// safe to call concurrently with anything; opts may be nil.
func (s *Store) Restart(opts *RestartOptions) {
	if opts == nil {
		opts = &RestartOptions{}
	}
	s.mu.Lock()
	defer s.unlock()
	for _, ks := range s.keys {
		for w := range ks.watches {
			s.closeWatchLocked(w)
		}
	}
	if opts.LoseTerms {
		s.term = 0
	}
	s.guardUntil = time.Now().Add(opts.Guard)
	if opts.KeepLeases {
		s.shrinkLocked() // closing the watches forgot the keys that only had one
		return
	}
	for _, ks := range s.keys {
		ks.stopTimer()
	}
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	s.keys = make(map[string]*keyState)
	s.peak = 0
}

// Len returns the number of keys the store holds any state for: a lease, a
// heartbeat record or a watch. It first applies every expiry that is due by
// the store's clock, so a key whose lease was released or has expired and
// whose heartbeat records have expired, with no watch open, is not counted.
// No term counter or other record outlives that (see Bounded state in the
// package doc). Len is meant for tests of bounded state; it takes time
// proportional to the number of keys.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	for _, ks := range s.keys {
		s.expireLocked(ks, now)
		s.settleLocked(ks, now)
	}
	s.flushLocked()
	s.shrinkLocked()
	return len(s.keys)
}

// Backend is one client of a Store. It implements backend.Backend and
// backend.Watcher and is safe for concurrent use; its fault-injection methods
// may be called at any time, concurrently with calls in flight.
type Backend struct {
	store *Store

	mu          sync.Mutex // guards the fields below up to watches
	closed      bool
	done        chan struct{} // closed by Close
	partitioned bool
	hung        bool
	latency     time.Duration
	changed     chan struct{} // closed and replaced when a fault setting changes
	calls       map[string]int64
	modes       *backend.ModeSupport // set by SetModeSupport; nil: everything

	watches map[*watch]struct{} // guarded by store.mu
}

var (
	_ backend.Backend       = (*Backend)(nil)
	_ backend.Watcher       = (*Backend)(nil)
	_ backend.WatchNotifier = (*Backend)(nil)
)

// Partition makes every call of this client fail at once with an error
// wrapping ErrPartitioned, and stops its watches from delivering events, until
// Heal. Calls blocked by Hang fail at once too; calls waiting out a latency
// fail when it has passed.
func (b *Backend) Partition() {
	b.setFault(func() { b.partitioned = true })
}

// Hang makes every call of this client block until its context ends (it then
// returns an error wrapping the context's error) or the client is closed (it
// then returns ErrClosed), and stops its watches from delivering events,
// until Heal or Partition. Calls blocked by Hang proceed when Heal is called
// before their context ends, like requests delayed by the network.
func (b *Backend) Hang() {
	b.setFault(func() { b.hung = true })
}

// SetLatency makes every call of this client wait d before it acts on the
// store, or until its context ends. Zero removes the latency.
func (b *Backend) SetLatency(d time.Duration) {
	b.setFault(func() { b.latency = d })
}

// Heal clears every fault of this client: partition, hang and latency. Each
// of its watches that withheld events during the fault then receives one
// EventChanged.
func (b *Backend) Heal() {
	b.setFault(func() { b.partitioned, b.hung, b.latency = false, false, 0 })
	s := b.store
	s.mu.Lock()
	defer s.unlock()
	if b.faulted() {
		return // faulted again meanwhile
	}
	for w := range b.watches {
		if w.missed {
			w.missed = false
			w.send(backend.EventChanged)
		}
	}
}

func (b *Backend) setFault(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f()
	close(b.changed)
	b.changed = make(chan struct{})
}

// faulted reports whether the client is partitioned or hung.
func (b *Backend) faulted() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.partitioned || b.hung
}

// Calls returns how many times each method ("Acquire", "Renew", "Release",
// "SetMetadata", "Get", "List", "Heartbeat", "Members", "RemoveMember",
// "Watch", "AcquireMode", "Holders", "CancelWait", "ValidateKey", "MinTTL",
// "ModeSupport") was called on this client, failed calls included. Every
// method but ValidateKey, MinTTL and ModeSupport is an operation on the
// store (a round trip on a real backend); those three do no I/O and are
// counted under their own names only, so leave them out when counting round
// trips.
// The map is a copy; methods never called are absent.
func (b *Backend) Calls() map[string]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.calls)
}

// ResetCalls sets every call count of this client to zero.
func (b *Backend) ResetCalls() {
	b.mu.Lock()
	defer b.mu.Unlock()
	clear(b.calls)
}

// Close closes the client: later calls return ErrClosed, calls blocked by Hang
// or latency return ErrClosed, and its watch channels are closed. Leases it
// holds stay in the store until they expire. Close is idempotent and always
// returns nil.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	close(b.done)
	b.mu.Unlock()

	s := b.store
	s.mu.Lock()
	defer s.unlock()
	for w := range b.watches {
		s.closeWatchLocked(w)
	}
	s.shrinkLocked()
	return nil
}

// begin counts the call and checks that the client is open and ctx alive.
func (b *Backend) begin(ctx context.Context, op string) error {
	b.mu.Lock()
	b.calls[op]++
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return fmt.Errorf("memorybackend: %s: %w", op, backend.ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memorybackend: %s: %w", op, err)
	}
	return nil
}

// network applies the client's faults to a call: it fails on a partition,
// blocks on a hang, and waits out the latency.
func (b *Backend) network(ctx context.Context, op string) error {
	if err := b.faultGate(ctx, op); err != nil {
		return err
	}
	b.mu.Lock()
	latency := b.latency
	b.mu.Unlock()
	if latency > 0 {
		t := time.NewTimer(latency)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("memorybackend: %s: %w", op, ctx.Err())
		case <-b.done:
			return fmt.Errorf("memorybackend: %s: %w", op, backend.ErrClosed)
		}
		// A fault set while the call was in flight applies to it.
		return b.faultGate(ctx, op)
	}
	return nil
}

func (b *Backend) faultGate(ctx context.Context, op string) error {
	for {
		b.mu.Lock()
		closed, partitioned, hung, changed := b.closed, b.partitioned, b.hung, b.changed
		b.mu.Unlock()
		switch {
		case closed:
			return fmt.Errorf("memorybackend: %s: %w", op, backend.ErrClosed)
		case partitioned:
			return fmt.Errorf("memorybackend: %s: %w", op, ErrPartitioned)
		case !hung:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("memorybackend: %s: hung: %w", op, ctx.Err())
		case <-b.done:
			return fmt.Errorf("memorybackend: %s: %w", op, backend.ErrClosed)
		case <-changed:
		}
	}
}

// call runs the common prologue of every operation: count, closed and
// context checks, argument validation, then faults.
func (b *Backend) call(ctx context.Context, op string, validate error) error {
	if err := b.begin(ctx, op); err != nil {
		return err
	}
	if validate != nil {
		return fmt.Errorf("memorybackend: %s: %w", op, validate)
	}
	return b.network(ctx, op)
}

func validateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", backend.ErrInvalid)
	}
	return nil
}

func validateMember(key, id string) error {
	if err := validateKey(key); err != nil {
		return err
	}
	if id == "" {
		return fmt.Errorf("%w: empty instance ID", backend.ErrInvalid)
	}
	return nil
}

// count counts a call of a method that does no I/O: it ignores faults and
// Close.
func (b *Backend) count(op string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls[op]++
}

// ValidateKey implements backend.Backend: the memory store accepts any
// non-empty key, "/", ":", glob characters and NUL bytes included. It does
// no I/O and ignores faults and Close; it is counted in Calls.
func (b *Backend) ValidateKey(key string) error {
	b.count("ValidateKey")
	if err := validateKey(key); err != nil {
		return fmt.Errorf("memorybackend: key %q: %w", key, err)
	}
	return nil
}

// MinTTL implements backend.Backend: the memory store honours any TTL of one
// millisecond or more (it would honour less, but nothing real does). It is
// counted in Calls.
func (b *Backend) MinTTL() time.Duration {
	b.count("MinTTL")
	return time.Millisecond
}

// Acquire implements backend.Backend.
func (b *Backend) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	if err := b.call(ctx, "Acquire", req.Validate()); err != nil {
		return backend.Lease{}, err
	}
	return b.store.acquire(req)
}

// Renew implements backend.Backend.
func (b *Backend) Renew(ctx context.Context, l backend.Lease) error {
	if err := b.call(ctx, "Renew", l.Validate()); err != nil {
		return err
	}
	return b.store.renew(l)
}

// Release implements backend.Backend.
func (b *Backend) Release(ctx context.Context, l backend.Lease) error {
	if err := b.call(ctx, "Release", l.Validate()); err != nil {
		return err
	}
	return b.store.release(l)
}

// SetMetadata implements backend.Backend. The metadata is copied; nil or an
// empty map removes it all. Watches are not notified and the lease is not
// extended.
func (b *Backend) SetMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	if err := b.call(ctx, "SetMetadata", l.Validate()); err != nil {
		return err
	}
	return b.store.setMetadata(l, md)
}

// Get implements backend.Backend.
func (b *Backend) Get(ctx context.Context, key string) (backend.Record, error) {
	if err := b.call(ctx, "Get", validateKey(key)); err != nil {
		return backend.Record{}, err
	}
	return b.store.get(key)
}

// List implements backend.Backend. The prefix is compared byte for byte:
// glob characters have no special meaning. The records are read at one
// instant and each carries its holder's heartbeat, like Get's. List takes
// time proportional to the number of keys in the store.
func (b *Backend) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	if err := b.call(ctx, "List", nil); err != nil {
		return nil, err
	}
	return b.store.list(prefix), nil
}

// Heartbeat implements backend.Backend.
func (b *Backend) Heartbeat(ctx context.Context, key, id string, ttl time.Duration) error {
	if err := b.call(ctx, "Heartbeat", backend.ValidateHeartbeat(key, id, ttl)); err != nil {
		return err
	}
	b.store.heartbeat(key, id, ttl)
	return nil
}

// Members implements backend.Backend.
func (b *Backend) Members(ctx context.Context, key string) ([]backend.Member, error) {
	if err := b.call(ctx, "Members", validateKey(key)); err != nil {
		return nil, err
	}
	return b.store.members(key), nil
}

// RemoveMember implements backend.Backend. It deletes the record at once,
// whether or not it belongs to the key's holder; the holder's lease is not
// affected (the memory store's way to delete a heartbeat record by hand).
func (b *Backend) RemoveMember(ctx context.Context, key, id string) error {
	if err := b.call(ctx, "RemoveMember", validateMember(key, id)); err != nil {
		return err
	}
	b.store.removeMember(key, id)
	return nil
}

// AcquireConfirms implements backend.AcquireConfirmer: Acquire writes and
// answers under the store's lock.
func (b *Backend) AcquireConfirms() bool { return true }

// ReportsExpiry implements backend.ExpiryReporter: watches deliver every
// expiry (EventExpired), and a partitioned client's watch, which withholds
// events, sends an EventChanged when healed.
func (b *Backend) ReportsExpiry() bool { return true }

// Watch implements backend.Watcher. The subscription is registered before
// Watch returns. The channel is closed when ctx ends, when the client is
// closed, or when the store restarts (Store.Restart).
func (b *Backend) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	return b.WatchNotify(ctx, key, nil)
}

// WatchNotify implements backend.WatchNotifier: it is Watch, and it calls
// notify (under the store's lock) after every event it sends or drops on
// the channel and after closing it. A withheld event (a faulted client)
// calls nothing until the one sent at Heal.
func (b *Backend) WatchNotify(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	if err := b.call(ctx, "Watch", validateKey(key)); err != nil {
		return nil, err
	}
	s := b.store
	s.mu.Lock()
	defer s.unlock()
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed { // Close ran after the checks above; it will not see this watch.
		return nil, fmt.Errorf("memorybackend: Watch: %w", backend.ErrClosed)
	}
	now := time.Now()
	ks := s.keyLocked(key, now)
	w := &watch{key: ks, client: b, ch: make(chan backend.Event, watchBuffer), notify: notify}
	if ks.watches == nil {
		ks.watches = make(map[*watch]struct{})
	}
	ks.watches[w] = struct{}{}
	b.watches[w] = struct{}{}
	s.settleLocked(ks, now)
	w.stop = context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.unlock()
		s.closeWatchLocked(w)
		s.shrinkLocked()
	})
	return w.ch, nil
}

// closeWatchLocked unregisters w and closes its channel, once, and forgets
// w's key if nothing else of it is left. s.mu must be held. It never
// rebuilds s.keys, so callers may loop over it; they call shrinkLocked after
// the loop.
func (s *Store) closeWatchLocked(w *watch) {
	if w.closed {
		return
	}
	w.closed = true
	w.stop()
	delete(w.key.watches, w)
	delete(w.client.watches, w)
	close(w.ch)
	if w.notify != nil {
		w.notify()
	}
	s.settleLocked(w.key, time.Now())
}

// send delivers e without blocking, dropping it when the buffer is full.
// s.mu must be held.
func (w *watch) send(t backend.EventType) {
	select {
	case w.ch <- backend.Event{Key: w.key.name, Type: t}:
	default:
	}
	if w.notify != nil {
		w.notify()
	}
}

// lookupLocked returns the state of key with every expiry due at now
// applied, or nil when the store holds nothing for key. s.mu must be held.
func (s *Store) lookupLocked(key string, now time.Time) *keyState {
	ks := s.keys[key]
	if ks != nil {
		s.expireLocked(ks, now)
	}
	return ks
}

// keyLocked returns the state of key with every expiry due at now applied,
// creating it when there is none. The caller must add state to it or call
// settleLocked, so that an empty state is forgotten. s.mu must be held.
func (s *Store) keyLocked(key string, now time.Time) *keyState {
	if ks := s.lookupLocked(key, now); ks != nil {
		return ks
	}
	ks := &keyState{name: key}
	s.keys[key] = ks
	s.peak = max(s.peak, len(s.keys))
	return ks
}

// notifyLocked sends t to every watch of ks whose client is not faulted.
// s.mu must be held.
func (s *Store) notifyLocked(ks *keyState, t backend.EventType) {
	for w := range ks.watches {
		if w.client.faulted() {
			w.missed = true
			continue
		}
		w.send(t)
	}
}

// expireLocked removes the lease of ks and the heartbeat records of ks that
// have expired at now, and reports the lease's expiry to the watches. s.mu
// must be held.
func (s *Store) expireLocked(ks *keyState, now time.Time) {
	if l := ks.lease; l != nil && !now.Before(l.expires) {
		ks.lease = nil
		s.notifyLocked(ks, backend.EventExpired)
	}
	if ks.modes != nil {
		s.expireModesLocked(ks, now)
	}
	for id, hb := range ks.beats {
		if !now.Before(hb.expires) {
			delete(ks.beats, id)
		}
	}
}

// settleLocked is called after every change to ks: it forgets ks when
// nothing of it is left, and otherwise arms its expiry timer for the next
// time something of it expires: the lease's expiry, or, when the key has no
// lease, the expiry of its last heartbeat record. A pending timer that fires
// earlier than needed re-arms itself then. s.mu must be held.
func (s *Store) settleLocked(ks *keyState, now time.Time) {
	if m := ks.modes; m != nil && len(m.entries) == 0 && len(m.intents) == 0 && len(m.waiters) == 0 {
		ks.modes = nil
	}
	var next time.Time
	if ks.lease != nil {
		next = ks.lease.expires
	}
	if ks.modes != nil {
		next = ks.nextModeExpiry(next)
	}
	if next.IsZero() {
		for _, hb := range ks.beats {
			if hb.expires.After(next) {
				next = hb.expires
			}
		}
	}
	if next.IsZero() {
		ks.stopTimer()
		if len(ks.watches) == 0 && len(ks.intents()) == 0 && s.keys[ks.name] == ks {
			delete(s.keys, ks.name)
		}
		return
	}
	if !ks.timerAt.IsZero() && !next.Before(ks.timerAt) {
		return // the pending timer fires first
	}
	ks.timerAt = next
	if ks.timer == nil {
		ks.timer = time.AfterFunc(next.Sub(now), func() { s.onTimer(ks) })
	} else {
		ks.timer.Reset(next.Sub(now))
	}
}

// stopTimer stops the expiry timer of ks. A callback already running finds
// timerAt zero and does nothing.
func (ks *keyState) stopTimer() {
	if ks.timer != nil {
		ks.timer.Stop()
	}
	ks.timerAt = time.Time{}
}

// shrinkLocked rebuilds the key map once it holds a quarter of its peak or
// less, so that a store that once held many keys gives the memory back.
// s.mu must be held, and no loop over s.keys may be running.
func (s *Store) shrinkLocked() {
	if s.peak < shrinkMin || len(s.keys) > s.peak/4 {
		return
	}
	keys := make(map[string]*keyState, len(s.keys))
	maps.Copy(keys, s.keys)
	s.keys = keys
	s.peak = len(keys)
}

// onTimer runs when the expiry timer of ks fires.
func (s *Store) onTimer(ks *keyState) {
	s.mu.Lock()
	defer s.unlock()
	if s.keys[ks.name] != ks {
		return // forgotten, or lost by Restart
	}
	now := time.Now()
	if ks.timerAt.IsZero() || ks.timerAt.After(now) {
		return // stopped, or re-armed for later: that run will act
	}
	ks.timerAt = time.Time{}
	s.expireLocked(ks, now)
	s.settleLocked(ks, now)
	s.flushLocked()
	s.shrinkLocked()
}

func (s *Store) acquire(req backend.AcquireRequest) (backend.Lease, error) {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks := s.keyLocked(req.Key, now)
	if ks.lease != nil {
		return backend.Lease{}, &backend.HeldError{Holder: s.recordLocked(ks, now)}
	}
	if ks.modes != nil && (len(ks.entries()) > 0 || len(ks.intents()) > 0) {
		// Held by entries of AcquireMode: every holder and intent conflicts.
		held := s.heldErrorLocked(ks.name, append(s.holdersLocked(ks, now), s.intentRecordsLocked(ks, now, false)...), 0)
		s.flushLocked()
		return backend.Lease{}, held
	}
	if err := s.guardLocked(req, now); err != nil {
		s.settleLocked(ks, now)
		return backend.Lease{}, err
	}
	s.term++
	l := &lease{
		holder:     req.HolderID,
		token:      backend.NewToken(),
		term:       s.term,
		acquiredAt: now,
		renewedAt:  now,
		expires:    now.Add(req.TTL),
		metadata:   maps.Clone(req.Metadata),
	}
	ks.lease = l
	s.settleLocked(ks, now)
	s.notifyLocked(ks, backend.EventChanged)
	return backend.Lease{Key: req.Key, HolderID: l.holder, Token: l.token, Term: l.term, TTL: req.TTL}, nil
}

// guardLocked returns the refusal of RestartOptions.Guard for an
// acquisition of a free key, or nil once it has ended or for a reclaim
// (req.Reclaim). s.mu must be held.
func (s *Store) guardLocked(req backend.AcquireRequest, now time.Time) error {
	if d := s.guardUntil.Sub(now); d > 0 && !req.Reclaim {
		return &backend.HeldError{Holder: backend.Record{Key: req.Key, TTL: d}, MayBeHeld: true}
	}
	return nil
}

// ownedLocked returns the key state of l when the store holds exactly l.
// Otherwise it settles the key (an expiry may have emptied it) and returns
// an error wrapping ErrLeaseLost. s.mu must be held.
func (s *Store) ownedLocked(l backend.Lease, now time.Time) (*keyState, error) {
	ks := s.lookupLocked(l.Key, now)
	if ks != nil {
		if cur := ks.lease; cur != nil && cur.holder == l.HolderID && cur.token == l.Token {
			return ks, nil
		}
		s.settleLocked(ks, now)
	}
	s.flushLocked()
	s.shrinkLocked()
	return nil, fmt.Errorf("memorybackend: %q term %d: %w", l.Key, l.Term, backend.ErrLeaseLost)
}

func (s *Store) renew(l backend.Lease) error {
	if l.Entry != nil {
		return s.renewEntry(l)
	}
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks, err := s.ownedLocked(l, now)
	if err != nil {
		return err
	}
	ks.lease.renewedAt = now
	ks.lease.expires = now.Add(l.TTL)
	s.settleLocked(ks, now) // a shorter TTL brings the timer forward
	return nil
}

func (s *Store) release(l backend.Lease) error {
	if l.Entry != nil {
		return s.releaseEntry(l)
	}
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks, err := s.ownedLocked(l, now)
	if err != nil {
		return err
	}
	ks.lease = nil
	s.notifyLocked(ks, backend.EventReleased)
	s.settleLocked(ks, now)
	s.shrinkLocked()
	return nil
}

func (s *Store) setMetadata(l backend.Lease, md map[string]string) error {
	if l.Entry != nil {
		return s.setEntryMetadata(l, md)
	}
	s.mu.Lock()
	defer s.unlock()
	ks, err := s.ownedLocked(l, time.Now())
	if err != nil {
		return err
	}
	ks.lease.metadata = maps.Clone(md)
	return nil
}

func (s *Store) get(key string) (backend.Record, error) {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks := s.lookupLocked(key, now)
	if ks != nil && ks.lease == nil && len(ks.entries()) > 0 {
		return s.entryRecordLocked(ks.entries()[0], now), nil // the oldest holder
	}
	if ks == nil || ks.lease == nil {
		if ks != nil {
			s.settleLocked(ks, now)
			s.shrinkLocked()
		}
		return backend.Record{}, fmt.Errorf("memorybackend: %q: %w", key, backend.ErrNotHeld)
	}
	return s.recordLocked(ks, now), nil
}

func (s *Store) list(prefix string) []backend.Record {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	var recs []backend.Record
	for name, ks := range s.keys {
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		s.expireLocked(ks, now)
		if ks.lease != nil {
			recs = append(recs, s.recordLocked(ks, now))
		}
		for _, e := range ks.entries() {
			recs = append(recs, s.entryRecordLocked(e, now))
		}
		if ks.lease == nil && len(ks.entries()) == 0 {
			s.settleLocked(ks, now) // deleting during the loop is safe
		}
	}
	s.flushLocked()
	s.shrinkLocked()
	slices.SortFunc(recs, func(a, b backend.Record) int {
		if c := strings.Compare(a.Key, b.Key); c != 0 {
			return c
		}
		return cmp.Compare(a.Term, b.Term)
	})
	return recs
}

// recordLocked returns the record of the live lease of ks.
func (s *Store) recordLocked(ks *keyState, now time.Time) backend.Record {
	l := ks.lease
	r := backend.Record{
		Key:        ks.name,
		HolderID:   l.holder,
		Token:      l.token,
		Term:       l.term,
		AcquiredAt: l.acquiredAt.Round(0),
		RenewedAt:  l.renewedAt.Round(0),
		TTL:        l.expires.Sub(now),
		Metadata:   maps.Clone(l.metadata),
	}
	if hb := ks.beats[l.holder]; hb != nil {
		r.HeartbeatAt = hb.at.Round(0)
		r.HeartbeatAge = now.Sub(hb.at)
	}
	return r
}

func (s *Store) heartbeat(key, id string, ttl time.Duration) {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks := s.keyLocked(key, now)
	if ks.beats == nil {
		ks.beats = make(map[string]*beat)
	}
	ks.beats[id] = &beat{at: now, expires: now.Add(ttl)}
	s.settleLocked(ks, now)
}

func (s *Store) members(key string) []backend.Member {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks := s.lookupLocked(key, now)
	if ks == nil {
		return nil
	}
	ms := make([]backend.Member, 0, len(ks.beats))
	for id, hb := range ks.beats {
		ms = append(ms, backend.Member{
			ID:          id,
			HeartbeatAt: hb.at.Round(0),
			Age:         now.Sub(hb.at),
			TTL:         hb.expires.Sub(now),
		})
	}
	s.settleLocked(ks, now)
	s.shrinkLocked()
	slices.SortFunc(ms, func(a, b backend.Member) int { return strings.Compare(a.ID, b.ID) })
	return ms
}

func (s *Store) removeMember(key, id string) {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	if ks := s.lookupLocked(key, now); ks != nil {
		delete(ks.beats, id)
		s.settleLocked(ks, now)
		s.shrinkLocked()
	}
}
