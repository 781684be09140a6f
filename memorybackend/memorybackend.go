// Package memorybackend is an in-process implementation of backend.Backend
// and backend.Watcher, made for tests.
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
// The faults are Partition (every call fails at once), Hang (every call blocks
// until its context ends), SetLatency (every call waits before it acts) and
// Heal (clears them all). Calls reports how many operations a client made.
//
// # Time
//
// The store reads the time with time.Now and computes expiry lazily from it
// on every access; it runs no background goroutine (only the short callback
// of a lease's expiry timer, see Watch). Inside a
// testing/synctest bubble time is therefore virtual, and a test can let a
// lease expire with time.Sleep at no cost. Create the store, its clients and
// their watches inside the bubble that uses them: the store's expiry timers
// and channels belong to the bubble they were created in, and the synctest
// package panics when they are used from outside it.
//
// # Watch
//
// Watch delivers EventChanged when anyone acquires the key (takeovers
// included), EventReleased on a release and EventExpired when a lease
// expires. Renewals are not reported. Expiry is noticed by whichever comes
// first: a time.AfterFunc timer armed for the lease's expiry time (re-armed
// when a renewal has pushed the expiry further), or any call that touches the
// key after the expiry time. Either way, one EventExpired is delivered per
// expired lease, at the lease's expiry time by the store's clock (virtual
// time in a bubble).
//
// Each watch channel buffers 16 events; when it is full, further events are
// dropped (the buffered ones already tell the receiver to look). While the
// watching client is partitioned or hung, its watches deliver nothing (a
// partition cuts notifications too); when Heal clears the fault, each watch
// that missed events receives one EventChanged so the receiver re-reads the
// state. Latency does not delay events. Watch itself fails on a partitioned
// client and blocks on a hung one, like every other call.
package memorybackend

import (
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

// watchBuffer is the capacity of each watch channel.
const watchBuffer = 16

// Store is the shared state of one simulated cluster: leases, term counters,
// heartbeat records and watches. It is safe for concurrent use. A Store has no
// resources to free; it is garbage once its clients are.
type Store struct {
	mu   sync.Mutex           // guards keys and everything reachable from it, and Backend.watches
	keys map[string]*keyState // never shrinks, so term counters survive
}

// keyState is the state of one key.
type keyState struct {
	name    string
	term    uint64 // last term handed out for this key
	lease   *lease // nil when the key is free
	beats   map[string]*beat
	watches map[*watch]struct{}
}

type lease struct {
	holder, token string
	term          uint64
	acquiredAt    time.Time
	renewedAt     time.Time
	expires       time.Time
	metadata      map[string]string
	timer         *time.Timer // fires at or after expires
	timerAt       time.Time   // when timer fires
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

	watches map[*watch]struct{} // guarded by store.mu
}

var (
	_ backend.Backend = (*Backend)(nil)
	_ backend.Watcher = (*Backend)(nil)
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
	defer s.mu.Unlock()
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

// Calls returns how many times each operation ("Acquire", "Renew",
// "Release", "Get", "Heartbeat", "Members", "RemoveMember", "Watch") was
// called on this client, failed calls included. The map is a copy.
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
	defer s.mu.Unlock()
	for w := range b.watches {
		w.closeLocked()
	}
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

// Get implements backend.Backend.
func (b *Backend) Get(ctx context.Context, key string) (backend.Record, error) {
	if err := b.call(ctx, "Get", validateKey(key)); err != nil {
		return backend.Record{}, err
	}
	return b.store.get(key)
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

// RemoveMember implements backend.Backend.
func (b *Backend) RemoveMember(ctx context.Context, key, id string) error {
	if err := b.call(ctx, "RemoveMember", validateMember(key, id)); err != nil {
		return err
	}
	b.store.removeMember(key, id)
	return nil
}

// Watch implements backend.Watcher. The subscription is registered before
// Watch returns. The channel is closed when ctx ends or the client is closed.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan backend.Event, error) {
	if err := b.call(ctx, "Watch", validateKey(key)); err != nil {
		return nil, err
	}
	s := b.store
	s.mu.Lock()
	defer s.mu.Unlock()
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed { // Close ran after the checks above; it will not see this watch.
		return nil, fmt.Errorf("memorybackend: Watch: %w", backend.ErrClosed)
	}
	ks := s.keyLocked(key)
	s.expireLocked(ks, time.Now())
	w := &watch{key: ks, client: b, ch: make(chan backend.Event, watchBuffer)}
	ks.watches[w] = struct{}{}
	b.watches[w] = struct{}{}
	w.stop = context.AfterFunc(ctx, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		w.closeLocked()
	})
	return w.ch, nil
}

// closeLocked unregisters w and closes its channel, once. s.mu must be held.
func (w *watch) closeLocked() {
	if w.closed {
		return
	}
	w.closed = true
	w.stop()
	delete(w.key.watches, w)
	delete(w.client.watches, w)
	close(w.ch)
}

// send delivers e without blocking, dropping it when the buffer is full.
// s.mu must be held.
func (w *watch) send(t backend.EventType) {
	select {
	case w.ch <- backend.Event{Key: w.key.name, Type: t}:
	default:
	}
}

// keyLocked returns the state of key, creating it. s.mu must be held.
func (s *Store) keyLocked(key string) *keyState {
	ks := s.keys[key]
	if ks == nil {
		ks = &keyState{
			name:    key,
			beats:   make(map[string]*beat),
			watches: make(map[*watch]struct{}),
		}
		s.keys[key] = ks
	}
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
// have expired at now. s.mu must be held.
func (s *Store) expireLocked(ks *keyState, now time.Time) {
	if l := ks.lease; l != nil && !now.Before(l.expires) {
		l.timer.Stop()
		ks.lease = nil
		s.notifyLocked(ks, backend.EventExpired)
	}
	for id, hb := range ks.beats {
		if !now.Before(hb.expires) {
			delete(ks.beats, id)
		}
	}
}

// onTimer runs when the expiry timer of l fires.
func (s *Store) onTimer(ks *keyState, l *lease) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks.lease != l {
		return // released, replaced or already expired
	}
	now := time.Now()
	if rest := l.expires.Sub(now); rest > 0 { // renewed since the timer was armed
		l.timerAt = l.expires
		l.timer.Reset(rest)
		return
	}
	s.expireLocked(ks, now)
}

func (s *Store) acquire(req backend.AcquireRequest) (backend.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	ks := s.keyLocked(req.Key)
	s.expireLocked(ks, now)
	if ks.lease != nil {
		return backend.Lease{}, &backend.HeldError{Holder: s.recordLocked(ks, now)}
	}
	ks.term++
	l := &lease{
		holder:     req.HolderID,
		token:      backend.NewToken(),
		term:       ks.term,
		acquiredAt: now,
		renewedAt:  now,
		expires:    now.Add(req.TTL),
		metadata:   maps.Clone(req.Metadata),
	}
	l.timerAt = l.expires
	l.timer = time.AfterFunc(req.TTL, func() { s.onTimer(ks, l) })
	ks.lease = l
	s.notifyLocked(ks, backend.EventChanged)
	return backend.Lease{Key: req.Key, HolderID: l.holder, Token: l.token, Term: l.term, TTL: req.TTL}, nil
}

// ownedLocked returns the key state of l when the store holds exactly l.
func (s *Store) ownedLocked(l backend.Lease, now time.Time) (*keyState, error) {
	ks := s.keys[l.Key]
	if ks != nil {
		s.expireLocked(ks, now)
		if cur := ks.lease; cur != nil && cur.holder == l.HolderID && cur.token == l.Token {
			return ks, nil
		}
	}
	return nil, fmt.Errorf("memorybackend: %q term %d: %w", l.Key, l.Term, backend.ErrLeaseLost)
}

func (s *Store) renew(l backend.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	ks, err := s.ownedLocked(l, now)
	if err != nil {
		return err
	}
	cur := ks.lease
	cur.renewedAt = now
	cur.expires = now.Add(l.TTL)
	if cur.expires.Before(cur.timerAt) { // shortened: fire earlier
		cur.timerAt = cur.expires
		cur.timer.Reset(l.TTL)
	}
	return nil
}

func (s *Store) release(l backend.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks, err := s.ownedLocked(l, time.Now())
	if err != nil {
		return err
	}
	ks.lease.timer.Stop()
	ks.lease = nil
	s.notifyLocked(ks, backend.EventReleased)
	return nil
}

func (s *Store) get(key string) (backend.Record, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	ks := s.keys[key]
	if ks != nil {
		s.expireLocked(ks, now)
	}
	if ks == nil || ks.lease == nil {
		return backend.Record{}, fmt.Errorf("memorybackend: %q: %w", key, backend.ErrNotHeld)
	}
	return s.recordLocked(ks, now), nil
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
	defer s.mu.Unlock()
	now := time.Now()
	ks := s.keyLocked(key)
	s.expireLocked(ks, now)
	ks.beats[id] = &beat{at: now, expires: now.Add(ttl)}
}

func (s *Store) members(key string) []backend.Member {
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.keys[key]
	if ks == nil {
		return nil
	}
	now := time.Now()
	s.expireLocked(ks, now)
	ms := make([]backend.Member, 0, len(ks.beats))
	for id, hb := range ks.beats {
		ms = append(ms, backend.Member{
			ID:          id,
			HeartbeatAt: hb.at.Round(0),
			Age:         now.Sub(hb.at),
			TTL:         hb.expires.Sub(now),
		})
	}
	slices.SortFunc(ms, func(a, b backend.Member) int { return strings.Compare(a.ID, b.ID) })
	return ms
}

func (s *Store) removeMember(key, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks := s.keys[key]; ks != nil {
		delete(ks.beats, id)
	}
}

// ValidateKey implements backend.Backend: the memory store accepts any
// non-empty key.
func (b *Backend) ValidateKey(key string) error { return validateKey(key) }

// MinTTL implements backend.Backend: one millisecond.
func (b *Backend) MinTTL() time.Duration { return time.Millisecond }

// SetMetadata implements backend.Backend.
func (b *Backend) SetMetadata(ctx context.Context, l backend.Lease, md map[string]string) error {
	if err := b.call(ctx, "SetMetadata", l.Validate()); err != nil {
		return err
	}
	s := b.store
	s.mu.Lock()
	defer s.mu.Unlock()
	ks, err := s.ownedLocked(l, time.Now())
	if err != nil {
		return err
	}
	ks.lease.metadata = maps.Clone(md)
	return nil
}

// List implements backend.Backend.
func (b *Backend) List(ctx context.Context, prefix string) ([]backend.Record, error) {
	if err := b.call(ctx, "List", nil); err != nil {
		return nil, err
	}
	s := b.store
	s.mu.Lock()
	defer s.mu.Unlock()
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
	}
	slices.SortFunc(recs, func(a, b backend.Record) int { return strings.Compare(a.Key, b.Key) })
	return recs, nil
}
