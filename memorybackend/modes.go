package memorybackend

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sovereign-go/sovereign/backend"
)

// This file implements backend.Modes: shared locks, semaphores, hierarchies
// (intent locks) and fair queueing.
//
// A key's state holds, besides the lease of a plain Acquire, the entries
// granted by AcquireMode (its holders, in term order), the intents of
// hierarchical locks below it (pointers to those locks' entries, so that an
// intent lives, is renewed and ends with its lock) and its registered
// waiters (in registration order). Each entry and waiter expires on its own
// at its own expiry time, by the store's clock, lazily on every access and
// by the key's expiry timer, armed for the earliest of them.

var _ backend.Modes = (*Backend)(nil)

// entry is a holder granted by AcquireMode.
type entry struct {
	ks            *keyState // the key it holds
	holder, token string
	term          uint64
	mode          backend.Mode
	limit         int
	ancestors     []string // the keys it holds intent on, outermost first
	acquiredAt    time.Time
	renewedAt     time.Time
	expires       time.Time
	metadata      map[string]string
}

// modeState is the state of a key under Modes.
type modeState struct {
	entries []*entry  // holders from AcquireMode, in term order
	intents []*entry  // hierarchical locks below the key holding intent on it, in term order
	waiters []*waiter // registered waiters, in registration order
}

// m returns the mode state of ks, creating it when there is none. Use it
// to change the state; the readers below accept a key without one.
func (ks *keyState) m() *modeState {
	if ks.modes == nil {
		ks.modes = &modeState{}
	}
	return ks.modes
}

// entries returns the holders of ks from AcquireMode, in term order.
func (ks *keyState) entries() []*entry {
	if ks.modes == nil {
		return nil
	}
	return ks.modes.entries
}

// intents returns the entries of the locks below ks holding intent on it.
func (ks *keyState) intents() []*entry {
	if ks.modes == nil {
		return nil
	}
	return ks.modes.intents
}

// waiters returns the registered waiters of ks, in registration order.
func (ks *keyState) waiters() []*waiter {
	if ks.modes == nil {
		return nil
	}
	return ks.modes.waiters
}

// waiter is a registration of AcquireMode's ModeRequest.WaitID.
type waiter struct {
	id      string
	mode    backend.Mode
	expires time.Time
}

// allModes is what a client supports unless SetModeSupport says otherwise.
var allModes = backend.ModeSupport{Shared: true, Hierarchical: true, Fair: true, WriterFirst: true, AncestorWaiters: true}

// ModeSupport implements backend.Modes: a client supports every part of
// Modes unless SetModeSupport restricted it. It does no I/O and ignores
// faults and Close; it is counted in Calls.
func (b *Backend) ModeSupport() backend.ModeSupport {
	b.count("ModeSupport")
	return b.modeSupport()
}

func (b *Backend) modeSupport() backend.ModeSupport {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.modes == nil {
		return allModes
	}
	return *b.modes
}

// SetModeSupport makes this client report ms from ModeSupport and refuse,
// with an error wrapping backend.ErrUnsupported, every AcquireMode request
// that needs what ms lacks, as a backend without those capabilities does.
// It is a test hook for code that must cope with such backends. Without
// WriterFirst, Exclusive waiters do not block this client's Shared
// acquisitions, and without AncestorWaiters, Exclusive waiters on an
// ancestor do not block this client's hierarchical acquisitions (the store
// still registers them).
func (b *Backend) SetModeSupport(ms backend.ModeSupport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.modes = &ms
}

// AcquireMode implements backend.Modes. The request is validated
// (ErrInvalid) and checked against ModeSupport (ErrUnsupported) before the
// client's faults apply. On a conflict the *HeldError lists in Holders every
// conflicting live holder, in term order (for an intent, the record of the
// lock below); when the acquisition only had to yield to waiters, Holders is
// empty, Waiting counts them and Holder is the key's oldest holder, or a
// record with only Key set when the key has none. When those waiters are the
// Exclusive waiters of an ancestor (the first of req.Ancestors, outermost
// first, that has any), Holder is that ancestor's oldest holder or a record
// with only the ancestor's Key.
func (b *Backend) AcquireMode(ctx context.Context, req backend.ModeRequest) (backend.Lease, error) {
	err := req.Validate()
	ms := b.modeSupport()
	if err == nil {
		err = ms.Check(req)
	}
	if err := b.call(ctx, "AcquireMode", err); err != nil {
		return backend.Lease{}, err
	}
	return b.store.acquireMode(req, ms.WriterFirst, ms.AncestorWaiters)
}

// Holders implements backend.Modes. A plain Acquire lease is listed as an
// Exclusive holder.
func (b *Backend) Holders(ctx context.Context, key string) ([]backend.Record, error) {
	if err := b.call(ctx, "Holders", validateKey(key)); err != nil {
		return nil, err
	}
	return b.store.holders(key), nil
}

// CancelWait implements backend.Modes. Watchers of the key receive
// EventChanged when a registration was withdrawn, so that the waiters behind
// it look again.
func (b *Backend) CancelWait(ctx context.Context, key, waitID string) error {
	var err error
	if err = validateKey(key); err == nil && waitID == "" {
		err = fmt.Errorf("%w: empty wait ID", backend.ErrInvalid)
	}
	if err := b.call(ctx, "CancelWait", err); err != nil {
		return err
	}
	b.store.cancelWait(key, waitID)
	return nil
}

// live reports whether e has not expired at now.
func (e *entry) live(now time.Time) bool { return now.Before(e.expires) }

// expireModesLocked removes the entries, intents and waiters of ks that have
// expired at now. An expired entry is removed from its key and from the
// intents of its ancestors, each of which receives EventExpired. s.mu must
// be held; the caller settles ks.
func (s *Store) expireModesLocked(ks *keyState, now time.Time) {
	for _, list := range [][]*entry{ks.entries(), ks.intents()} {
		for _, e := range slices.Clone(list) {
			if !e.live(now) {
				s.dropEntryLocked(e, backend.EventExpired)
			}
		}
	}
	n := len(ks.waiters())
	ks.m().waiters = slices.DeleteFunc(ks.waiters(), func(w *waiter) bool { return !now.Before(w.expires) })
	if len(ks.waiters()) < n {
		s.notifyLocked(ks, backend.EventChanged) // the waiters behind it may go
	}
}

// dropEntryLocked removes e from its key and its intents from its
// ancestors, and sends t to the watchers of each. It settles none of them
// itself (a caller may be using one): they go to s.dirty, which
// flushLocked settles. s.mu must be held.
func (s *Store) dropEntryLocked(e *entry, t backend.EventType) {
	ks := e.ks
	n := len(ks.entries())
	ks.m().entries = slices.DeleteFunc(ks.entries(), func(x *entry) bool { return x == e })
	if len(ks.entries()) == n {
		return // already dropped
	}
	s.notifyLocked(ks, t)
	s.dirty = append(s.dirty, ks)
	for _, a := range e.ancestors {
		as := s.keys[a]
		if as == nil {
			continue
		}
		as.m().intents = slices.DeleteFunc(as.intents(), func(x *entry) bool { return x == e })
		s.notifyLocked(as, t)
		s.dirty = append(s.dirty, as)
	}
}

// unlock flushes s.dirty and unlocks s.mu. Every operation that locks s.mu
// unlocks it with unlock.
func (s *Store) unlock() {
	s.flushLocked()
	s.mu.Unlock()
}

// flushLocked settles the keys in s.dirty that the store still holds.
// s.mu must be held, and no loop over s.keys may be running.
func (s *Store) flushLocked() {
	if len(s.dirty) == 0 {
		return
	}
	now := time.Now()
	for _, ks := range s.dirty {
		if s.keys[ks.name] == ks {
			s.settleLocked(ks, now)
		}
	}
	clear(s.dirty)
	s.dirty = s.dirty[:0]
	s.shrinkLocked()
}

// nextModeExpiry returns the earliest of next (when not zero) and the
// expiry times of the entries and waiters of ks.
func (ks *keyState) nextModeExpiry(next time.Time) time.Time {
	earlier := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	for _, e := range ks.entries() {
		earlier(e.expires)
	}
	for _, w := range ks.waiters() {
		earlier(w.expires)
	}
	return next
}

// entryRecordLocked returns the record of e. s.mu must be held.
func (s *Store) entryRecordLocked(e *entry, now time.Time) backend.Record {
	r := backend.Record{
		Key:        e.ks.name,
		HolderID:   e.holder,
		Token:      e.token,
		Term:       e.term,
		AcquiredAt: e.acquiredAt.Round(0),
		RenewedAt:  e.renewedAt.Round(0),
		TTL:        e.expires.Sub(now),
		Metadata:   maps.Clone(e.metadata),
		Mode:       e.mode,
		Limit:      e.limit,
	}
	if hb := e.ks.beats[e.holder]; hb != nil {
		r.HeartbeatAt = hb.at.Round(0)
		r.HeartbeatAge = now.Sub(hb.at)
	}
	return r
}

// holdersLocked returns the records of every live holder of ks (its lease
// or its entries), in term order, expiries at now applied. s.mu must be
// held.
func (s *Store) holdersLocked(ks *keyState, now time.Time) []backend.Record {
	var recs []backend.Record
	if ks.lease != nil {
		recs = append(recs, s.recordLocked(ks, now))
	}
	for _, e := range ks.entries() {
		recs = append(recs, s.entryRecordLocked(e, now))
	}
	return recs
}

// intentRecordsLocked returns the records of the locks below ks holding
// intent on it (only the Exclusive ones when exclusiveOnly). s.mu must be
// held.
func (s *Store) intentRecordsLocked(ks *keyState, now time.Time, exclusiveOnly bool) []backend.Record {
	var recs []backend.Record
	for _, e := range ks.intents() {
		if !exclusiveOnly || e.mode == backend.Exclusive {
			recs = append(recs, s.entryRecordLocked(e, now))
		}
	}
	return recs
}

// heldErrorLocked returns the HeldError of a failed acquisition of key
// that conflicts with recs and had to yield to waiting waiters.
func (s *Store) heldErrorLocked(key string, recs []backend.Record, waiting int) *backend.HeldError {
	slices.SortStableFunc(recs, func(a, b backend.Record) int { return cmp.Compare(a.Term, b.Term) })
	recs = slices.CompactFunc(recs, func(a, b backend.Record) bool { return a.Key == b.Key && a.Token == b.Token })
	held := &backend.HeldError{Holders: recs, Waiting: waiting}
	if len(recs) > 0 {
		held.Holder = recs[0]
	} else if ks := s.keys[key]; ks != nil && (ks.lease != nil || len(ks.entries()) > 0) {
		held.Holder = s.holdersLocked(ks, time.Now())[0]
	} else {
		held.Holder = backend.Record{Key: key}
	}
	return held
}

// conflictsLocked returns the records of the live holders and intents of
// ks that an acquisition in mode m (with limit, for Shared) conflicts with.
// s.mu must be held.
func (s *Store) conflictsLocked(ks *keyState, m backend.Mode, limit int, now time.Time) []backend.Record {
	if m == backend.Exclusive {
		return append(s.holdersLocked(ks, now), s.intentRecordsLocked(ks, now, false)...)
	}
	var recs []backend.Record
	if ks.lease != nil {
		recs = append(recs, s.recordLocked(ks, now))
	}
	shared := 0
	for _, e := range ks.entries() {
		if e.mode == backend.Exclusive {
			recs = append(recs, s.entryRecordLocked(e, now))
		} else {
			shared++
		}
	}
	recs = append(recs, s.intentRecordsLocked(ks, now, true)...)
	if limit > 0 && shared >= limit {
		for _, e := range ks.entries() {
			if e.mode == backend.Shared {
				recs = append(recs, s.entryRecordLocked(e, now))
			}
		}
	}
	return recs
}

// ancestorConflictsLocked returns the records of the holders of ancestor as
// that a hierarchical acquisition in mode m below it conflicts with: an
// Exclusive holder, and for an Exclusive acquisition a Shared one too.
// s.mu must be held.
func (s *Store) ancestorConflictsLocked(as *keyState, m backend.Mode, now time.Time) []backend.Record {
	var recs []backend.Record
	if as.lease != nil {
		recs = append(recs, s.recordLocked(as, now))
	}
	for _, e := range as.entries() {
		if e.mode == backend.Exclusive || m == backend.Exclusive {
			recs = append(recs, s.entryRecordLocked(e, now))
		}
	}
	return recs
}

func (s *Store) acquireMode(req backend.ModeRequest, writerFirst, ancestorWaiters bool) (backend.Lease, error) {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks := s.keyLocked(req.Key, now)
	// Apply the expiries of the ancestors too, before anything is decided.
	for _, a := range req.Ancestors {
		if as := s.lookupLocked(a, now); as != nil {
			s.dirty = append(s.dirty, as)
		}
	}
	if s.keys[ks.name] != ks { // an expiry below forgot it: start afresh
		ks = s.keyLocked(req.Key, now)
	}
	defer s.settleLocked(ks, now)

	if req.Mode == backend.Shared {
		for _, e := range ks.entries() {
			if e.mode == backend.Shared && e.limit != req.Limit {
				return backend.Lease{}, fmt.Errorf("memorybackend: %q: limit %d, live shared holders agreed on %d: %w",
					req.Key, req.Limit, e.limit, backend.ErrLimitMismatch)
			}
		}
	}

	conflicts := s.conflictsLocked(ks, req.Mode, req.Limit, now)
	for _, a := range req.Ancestors {
		if as := s.keys[a]; as != nil {
			conflicts = append(conflicts, s.ancestorConflictsLocked(as, req.Mode, now)...)
		}
	}

	// Waiters this acquisition must yield to.
	own := -1
	if req.WaitID != "" {
		own = slices.IndexFunc(ks.waiters(), func(w *waiter) bool { return w.id == req.WaitID })
	}
	waiting := 0
	switch {
	case req.Fair:
		waiting = len(ks.waiters())
		if own >= 0 {
			waiting = own
		}
	case req.Mode == backend.Shared && writerFirst:
		for i, w := range ks.waiters() {
			if w.mode == backend.Exclusive && i != own {
				waiting++
			}
		}
	}
	// The Exclusive waiters of an ancestor block a non-fair hierarchical
	// acquisition, whatever its mode: those of the first ancestor,
	// outermost first, that has any.
	aboveKey := ""
	if ancestorWaiters && !req.Fair {
		for _, a := range req.Ancestors {
			n := 0
			if as := s.keys[a]; as != nil {
				for _, w := range as.waiters() {
					if w.mode == backend.Exclusive {
						n++
					}
				}
			}
			if n > 0 {
				aboveKey, waiting = a, waiting+n
				break
			}
		}
	}

	if len(conflicts) > 0 || waiting > 0 || req.RegisterOnly {
		if req.WaitID != "" && (req.Mode == backend.Exclusive || req.Fair) {
			if own >= 0 {
				ks.m().waiters[own].expires = now.Add(req.TTL)
				ks.m().waiters[own].mode = req.Mode
			} else {
				ks.m().waiters = append(ks.waiters(), &waiter{id: req.WaitID, mode: req.Mode, expires: now.Add(req.TTL)})
			}
		}
		if len(conflicts) == 0 && waiting == 0 {
			return backend.Lease{}, fmt.Errorf("memorybackend: acquire %q: %w", req.Key, backend.ErrRegisteredOnly)
		}
		held := s.heldErrorLocked(req.Key, conflicts, waiting)
		if aboveKey != "" && len(held.Holders) == 0 {
			held.Holder = s.heldErrorLocked(aboveKey, nil, 0).Holder
		}
		return backend.Lease{}, held
	}

	if err := s.guardLocked(req.AcquireRequest, now); err != nil {
		return backend.Lease{}, err
	}
	if own >= 0 {
		ks.m().waiters = slices.Delete(ks.waiters(), own, own+1)
	}
	s.term++
	e := &entry{
		ks:         ks,
		holder:     req.HolderID,
		token:      backend.NewToken(),
		term:       s.term,
		mode:       req.Mode,
		limit:      req.Limit,
		ancestors:  slices.Clone(req.Ancestors),
		acquiredAt: now,
		renewedAt:  now,
		expires:    now.Add(req.TTL),
		metadata:   maps.Clone(req.Metadata),
	}
	ks.m().entries = append(ks.entries(), e)
	for _, a := range e.ancestors {
		as := s.keyLocked(a, now)
		as.m().intents = append(as.intents(), e)
		s.dirty = append(s.dirty, as)
	}
	s.notifyLocked(ks, backend.EventChanged)
	return backend.Lease{
		Key:      req.Key,
		HolderID: e.holder,
		Token:    e.token,
		Term:     e.term,
		TTL:      req.TTL,
		Entry:    &backend.Entry{Mode: e.mode, Limit: e.limit, Ancestors: slices.Clone(e.ancestors)},
	}, nil
}

// ownedEntryLocked returns the live entry l stands for, or an error wrapping
// ErrLeaseLost. s.mu must be held; the caller flushes.
func (s *Store) ownedEntryLocked(l backend.Lease, now time.Time) (*entry, error) {
	if ks := s.lookupLocked(l.Key, now); ks != nil {
		for _, e := range ks.entries() {
			if e.holder == l.HolderID && e.token == l.Token {
				return e, nil
			}
		}
		s.dirty = append(s.dirty, ks)
	}
	return nil, fmt.Errorf("memorybackend: %q term %d (%v): %w", l.Key, l.Term, l.Entry.Mode, backend.ErrLeaseLost)
}

func (s *Store) renewEntry(l backend.Lease) error {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	e, err := s.ownedEntryLocked(l, now)
	if err != nil {
		return err
	}
	e.renewedAt = now
	e.expires = now.Add(l.TTL)
	s.settleLocked(e.ks, now) // a shorter TTL brings the timer forward
	return nil
}

func (s *Store) releaseEntry(l backend.Lease) error {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	e, err := s.ownedEntryLocked(l, now)
	if err != nil {
		return err
	}
	s.dropEntryLocked(e, backend.EventReleased)
	return nil
}

func (s *Store) setEntryMetadata(l backend.Lease, md map[string]string) error {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	e, err := s.ownedEntryLocked(l, now)
	if err != nil {
		return err
	}
	e.metadata = maps.Clone(md)
	return nil
}

func (s *Store) holders(key string) []backend.Record {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks := s.lookupLocked(key, now)
	if ks == nil {
		return []backend.Record{}
	}
	s.dirty = append(s.dirty, ks)
	recs := s.holdersLocked(ks, now)
	if recs == nil {
		recs = []backend.Record{}
	}
	return recs
}

func (s *Store) cancelWait(key, waitID string) {
	s.mu.Lock()
	defer s.unlock()
	now := time.Now()
	ks := s.lookupLocked(key, now)
	if ks == nil {
		return
	}
	s.dirty = append(s.dirty, ks)
	n := len(ks.waiters())
	ks.m().waiters = slices.DeleteFunc(ks.waiters(), func(w *waiter) bool { return w.id == waitID })
	if len(ks.waiters()) < n {
		s.notifyLocked(ks, backend.EventChanged)
	}
}
