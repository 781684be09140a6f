package keeper

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/coalesce"
)

// scheduler drives the periodic renewals of every hold of a process with
// one backend (that renews in batches) and one RenewInterval, and watches
// their deadlines:
//
//   - one renewal timer (gridT) wakes it at the next instant of the grid
//     of the interval, or at the earliest retry of a failed renewal; its
//     callback (run) is the scheduler's goroutine, and exists only while it
//     runs: it sends every hold due with one BatchRenewer call per chunk of
//     coalesce.MaxBatch, then re-arms the timer. When the holds due fill
//     more than one chunk, run starts up to coalesce.MaxInFlight-1 more
//     goroutines for that instant, so that that many calls are in flight at
//     once (a hung call does not delay the other chunks), and waits for
//     them: those goroutines exist only while the instant's calls do;
//   - one deadline timer (dlT) fires at the earliest deadline among the
//     buckets of holds, and steps down each hold whose own deadline has
//     passed. It does not wait for run, so a batch that hangs does not keep
//     any hold past its deadline.
//
// A bucket holds the holds whose deadline was last set together: those a
// batch call renewed (they share its send time), or those started in one
// interval. Its time is no later than any of its holds' deadlines. In
// steady state every hold moves to a new bucket at each renewal and buckets
// never fire; a bucket that fires sorts what is left of it by deadline and
// steps its holds down one by one, each at its own deadline.
//
// A scheduler with no holds left is dropped (its timers stopped), so that
// a backend no longer used is not kept, nor timers armed for nothing,
// unless it is pinned (Pin): an owner that starts and releases short holds
// one after another (a Locker taking lock after lock) then reuses one
// scheduler, instead of making one (two timers, a registry entry) for each
// hold and dropping it at the hold's release. A pinned scheduler without
// holds re-arms neither timer: each fires at most once more, for nothing.
type scheduler struct {
	key      schedKey
	br       backend.BatchRenewer
	grouper  backend.BatchGrouper // br's, when it places keys in groups
	interval time.Duration

	mu      sync.Mutex // guards the fields below and every member's Hold.m
	dead    bool       // dropped from the registry: add must find another
	pins    int        // Pin calls not yet undone: not dropped when idle
	members []*Hold
	running bool        // run is sending batches
	gridT   *time.Timer // wakes run
	gridAt  time.Time   // when gridT fires; zero when it is not armed
	buckets bucketHeap
	startB  *bucket     // the bucket holds started in the current interval join
	startAt time.Time   // the grid instant that ends startB's interval
	dlT     *time.Timer // fires at buckets[0].at
	dlAt    time.Time   // when dlT fires; zero when it is not armed

	// Buffers of run, kept from one run to the next (used by the running
	// run only), so that an instant allocates next to nothing.
	due  []*Hold
	down []*Hold
	// slots are the buffers of the calls in flight at once, one per worker
	// of coalesce.Chunks (slot 0 run's own).
	slots [coalesce.MaxInFlight]slot
}

// slot is the buffers of one batch call in flight, reused by the calls
// that worker sends one after another.
type slot struct {
	leases  []backend.Lease
	results []outcome
}

// member is a hold's place in its scheduler, guarded by the scheduler's mu.
type member struct {
	idx    int       // index in members; -1 once removed
	due    time.Time // the next renewal is due (zero: at once)
	flight *flight   // the batch call covering the hold, while in flight
	group  uint32    // the key's group (backend.BatchGrouper), or 0
	kick   bool      // RenewNow during that call: renew again after it
	dl     time.Time // the deadline as last set here; Extend may have moved it later
	b      *bucket   // the bucket watching the hold's deadline; nil when none
	bidx   int       // index in b.holds
}

// flight is one batch call in flight.
type flight struct {
	done chan struct{} // closed once its results are recorded
}

// bucket is a set of holds whose deadlines are no earlier than at. A hold
// leaving it leaves a nil entry (so that leaving touches no other hold);
// a bucket lives until its last hold has left, at most until the latest
// deadline among them.
type bucket struct {
	at    time.Time
	holds []*Hold
	dls   []time.Time // sorted: the deadline of each entry
	live  int
	head  int  // sorted: the first entry not yet stepped down
	sort  bool // sorted by deadline (dls)
	hidx  int  // index in the heap; -1 when not in it
}

type schedKey struct {
	b        backend.Backend
	interval time.Duration
}

// schedulers holds the schedulers of the process by backend and interval.
var schedulers sync.Map // schedKey → *scheduler

// schedulerFor returns the scheduler of b and interval, made on demand, or
// nil when b does not renew in batches (or its value cannot key a map).
func schedulerFor(b backend.Backend, interval time.Duration) *scheduler {
	br, ok := b.(backend.BatchRenewer)
	if !ok || !reflect.TypeOf(b).Comparable() {
		return nil
	}
	k := schedKey{b, interval}
	if v, ok := schedulers.Load(k); ok {
		return v.(*scheduler)
	}
	s := &scheduler{key: k, br: br, interval: interval}
	s.grouper, _ = br.(backend.BatchGrouper)
	s.gridT = time.AfterFunc(time.Hour, s.run)
	s.gridT.Stop()
	s.dlT = time.AfterFunc(time.Hour, s.fireDeadlines)
	s.dlT.Stop()
	v, _ := schedulers.LoadOrStore(k, s)
	return v.(*scheduler)
}

// add makes h a member, due at the next grid instant, with its deadline
// watched. It returns false, doing nothing, when s was dropped.
func (s *scheduler) add(h *Hold, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		schedulers.CompareAndDelete(s.key, s)
		return false
	}
	h.sch = s
	h.m.idx = len(s.members)
	if s.grouper != nil {
		h.m.group = s.grouper.BatchGroup(h.lease.Key)
	}
	s.members = append(s.members, h)
	// The next grid instant: the one the holds started in this interval
	// wait for, while now is in that interval (computed once per interval,
	// and the same instant, monotonic reading included, so the hold joins
	// their bucket), else the next multiple of the interval.
	next := s.startAt
	if next.IsZero() || !now.Before(next) || next.Sub(now) >= s.interval {
		next = now.Add(coalesce.Grid(now, s.interval))
	}
	h.m.due = next
	switch b := s.startB; {
	case b == nil || b.sort || !next.Equal(s.startAt):
		s.startB, s.startAt = &bucket{at: h.deadline, hidx: -1}, next
	case b.hidx < 0 && b.live == 0:
		// Every hold that joined it has left (short holds, one after
		// another): nothing refers to it any more, so it is reused.
		clear(b.holds)
		b.holds = b.holds[:0]
	case b.hidx < 0:
		s.startB = &bucket{at: h.deadline, hidx: -1}
	}
	h.m.dl = h.deadline
	s.watchLocked(h, s.startB, h.deadline)
	if !s.running {
		s.armGridLocked(next, now)
	}
	return true
}

// remove ends h's membership (release, loss, MaxHold) and returns the done
// channel of the batch call covering h, if one is in flight.
func (s *scheduler) remove(h *Hold) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := h.m.idx; i >= 0 {
		last := len(s.members) - 1
		s.members[i] = s.members[last]
		s.members[i].m.idx = i
		s.members[last] = nil
		s.members = s.members[:last]
		h.m.idx = -1
		s.unwatchLocked(h)
	}
	var f <-chan struct{}
	if h.m.flight != nil {
		f = h.m.flight.done
	}
	if len(s.members) == 0 && !s.running && s.pins == 0 {
		s.dropLocked()
	}
	return f
}

// Pin keeps the scheduler of b and interval, the one holds started with
// that backend and RenewInterval join, registered while it is not
// unpinned, even while it has no hold. Without a pin a scheduler is
// dropped with its timers when its last hold leaves, so an owner that
// starts and releases one short hold after another would make and drop one
// per hold. Its methods are safe for concurrent use.
type Pin struct {
	s    *scheduler // nil when the backend does not renew in batches
	done atomic.Bool
}

// NewPin pins the scheduler of b and interval (making it if need be). It
// pins nothing when b does not renew in batches.
func NewPin(b backend.Backend, interval time.Duration) *Pin {
	for {
		s := schedulerFor(b, interval)
		if s == nil || s.pin() {
			return &Pin{s: s}
		}
	}
}

// Unpin undoes the pin; later calls do nothing. A scheduler left without
// hold or pin is dropped, its timers stopped.
func (p *Pin) Unpin() { p.unpin(true) }

// Forget is Unpin for a cleanup (runtime.AddCleanup) of an owner that was
// never closed: a scheduler left without hold or pin leaves the registry,
// but its timers are left to fire once, for nothing, rather than stopped,
// since a cleanup runs outside any synctest bubble they may belong to (and
// touching them from there is fatal).
func (p *Pin) Forget() { p.unpin(false) }

func (p *Pin) unpin(stop bool) {
	if p.s == nil || p.done.Swap(true) {
		return
	}
	s := p.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pins--
	if s.pins > 0 || len(s.members) > 0 || s.running {
		return
	}
	if stop {
		s.dropLocked()
		return
	}
	// run returns at once on a dead scheduler, and fireDeadlines, with no
	// bucket, re-arms nothing.
	s.dead = true
	schedulers.CompareAndDelete(s.key, s)
}

// pin counts a pin; it returns false, doing nothing, when s was dropped.
func (s *scheduler) pin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		schedulers.CompareAndDelete(s.key, s)
		return false
	}
	s.pins++
	return true
}

// dropLocked takes s, which has no member left, out of the registry and
// stops its timers; a later hold makes a new scheduler. s.mu must be held.
func (s *scheduler) dropLocked() {
	s.dead = true
	schedulers.CompareAndDelete(s.key, s)
	s.gridT.Stop()
	s.dlT.Stop()
	s.gridAt, s.dlAt = time.Time{}, time.Time{}
}

// renewNow makes h due at once and wakes run.
func (s *scheduler) renewNow(h *Hold) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case h.m.idx < 0:
	case h.m.flight != nil:
		h.m.kick = true
	default:
		h.m.due = time.Time{}
		if !s.running {
			now := time.Now()
			s.armGridLocked(now, now)
		}
	}
}

// armGridLocked has run called at at, unless it is called no later already.
func (s *scheduler) armGridLocked(at, now time.Time) {
	if !s.gridAt.IsZero() && !at.Before(s.gridAt) {
		return
	}
	s.gridAt = at
	s.gridT.Reset(at.Sub(now))
}

// outcome is what a batch call did for one hold.
type outcome struct {
	moved time.Time // renewed: the new deadline; zero when it did not move
	ok    bool      // renewed
	lost  bool      // the store no longer holds the lease
}

// run is the renewal timer's callback: it renews every hold due, in
// batches, until none is, then re-arms the timer, or drops the scheduler
// when it has no member left.
//
// The holds due at once go in chunks of coalesce.MaxBatch (whole groups
// per chunk, but where a chunk boundary cuts one, when the backend groups
// keys), at most coalesce.MaxInFlight calls in flight (coalesce.Chunks:
// run sends chunks itself and, when there are more than one, starts a
// goroutine for each further call in flight; each takes the next chunk not
// yet sent whenever its call returns), and run waits for them all before it
// looks for holds due again. Each call has its own send time,
// deadline context and buffers (a slot). A hold released before its chunk's
// call starts is not sent.
func (s *scheduler) run() {
	s.mu.Lock()
	if s.running || s.dead {
		s.mu.Unlock()
		return
	}
	s.running = true
	s.gridAt = time.Time{}
	due, down := s.due[:0], s.down[:0]
	var next time.Time // the earliest due time of a member not due now
	for {
		now := time.Now()
		wall := wallNow()
		due, down, next = due[:0], down[:0], time.Time{}
		for _, h := range s.members {
			if h.m.flight != nil {
				continue
			}
			if h.m.due.After(now) {
				if next.IsZero() || h.m.due.Before(next) {
					next = h.m.due
				}
				continue
			}
			due = append(due, h)
			// A wall clock past the deadline (a suspended machine) steps
			// the hold down before its renewal could move the deadline.
			// Held checks the deadline itself (Extend may have moved it).
			if !now.Before(h.m.dl) || !wall.Before(h.m.dl.Round(0)) {
				down = append(down, h)
			}
		}
		if len(due) == 0 {
			break
		}
		s.mu.Unlock()
		for _, h := range down {
			h.Held()
		}
		s.mu.Lock()
		if s.grouper != nil && len(due) > coalesce.MaxBatch {
			// Whole groups per call: one request per group, not one per
			// call and group.
			slices.SortFunc(due, func(a, b *Hold) int { return cmp.Compare(a.m.group, b.m.group) })
		}
		s.mu.Unlock()
		coalesce.Chunks((len(due)+coalesce.MaxBatch-1)/coalesce.MaxBatch, func(w, c int) {
			hi := min((c+1)*coalesce.MaxBatch, len(due))
			chunk := due[c*coalesce.MaxBatch : hi : hi]
			sl := &s.slots[w]
			s.mu.Lock()
			sl.leases, sl.results = s.send(chunk, sl.leases, sl.results)
			s.mu.Unlock()
		})
		s.mu.Lock()
	}
	// Keep the buffers, without pointers into holds that may go.
	clear(due[:cap(due)])
	clear(down[:cap(down)])
	for i := range s.slots {
		clear(s.slots[i].leases[:cap(s.slots[i].leases)])
	}
	s.due, s.down = due[:0], down[:0]
	s.running = false
	if len(s.members) == 0 {
		if s.pins == 0 {
			s.dropLocked()
		}
		s.mu.Unlock()
		return
	}
	now := time.Now()
	if next.IsZero() { // cannot happen: every member is due some time
		next = now.Add(s.interval)
	}
	s.armGridLocked(next, now)
	s.mu.Unlock()
}

// send renews chunk with one batch call and records the results. s.mu is
// held on entry and on return, not during the call. Holds of chunk that
// left s while s.mu was not held (a release during another chunk's call)
// are skipped. leases and results are buffers to reuse.
func (s *scheduler) send(chunk []*Hold, leases []backend.Lease, results []outcome) ([]backend.Lease, []outcome) {
	live := chunk[:0]
	for _, h := range chunk {
		if h.m.idx >= 0 {
			live = append(live, h)
		}
	}
	clear(chunk[len(live):])
	chunk = live
	if len(chunk) == 0 {
		return leases, results
	}
	f := &flight{done: make(chan struct{})}
	leases, results = leases[:0], results[:0]
	sent := time.Now()
	timeout := time.Duration(0)
	for _, h := range chunk {
		h.m.flight = f
		leases = append(leases, h.lease)
		timeout = max(timeout, AttemptBound(s.interval, h.cfg.RequestTimeout, h.m.dl.Sub(sent)))
	}
	s.mu.Unlock()

	ctx, cancel := context.WithDeadline(context.Background(), sent.Add(timeout))
	errs := s.br.RenewBatch(ctx, leases)
	cancel()
	back := time.Now() // the answers arrived by then
	for i, h := range chunk {
		var err error
		if i < len(errs) {
			err = errs[i]
		} else {
			err = fmt.Errorf("keeper: renew %q: the batch returned %d results for %d leases", h.lease.Key, len(errs), len(leases))
		}
		var o outcome
		switch {
		case err == nil:
			o.ok, o.moved = true, h.renewed(sent, back)
		case errors.Is(err, backend.ErrLeaseLost):
			o.lost = true
			h.markLost(err) // leaves the scheduler
		default:
			h.failed(err)
		}
		results = append(results, o)
	}

	s.mu.Lock()
	now := time.Now()
	next := now.Add(coalesce.Grid(now, s.interval))
	// A quarter interval after the failed call was sent, or at once when
	// it failed later than that (it timed out): see NoRetryBudget.
	retry := maxTime(now, sent.Add(s.interval/4))
	var b *bucket // the bucket of the holds whose deadline moved to b.at
	for i, h := range chunk {
		o := results[i]
		h.m.flight = nil
		if h.m.idx < 0 || o.lost {
			h.m.kick = false
			continue
		}
		switch {
		case h.m.kick:
			h.m.due = time.Time{}
		case o.ok:
			h.m.due = next
		default:
			h.m.due = retry
		}
		h.m.kick = false
		if !o.moved.IsZero() {
			if b == nil || !b.at.Equal(o.moved) {
				b = &bucket{at: o.moved, hidx: -1}
			}
			h.m.dl = o.moved
			s.unwatchLocked(h)
			s.watchLocked(h, b, o.moved)
		}
	}
	close(f.done)
	return leases, results
}

// watchLocked puts h in bucket b, whose time becomes no later than dl, h's
// deadline, and arms the deadline timer when b fires first.
func (s *scheduler) watchLocked(h *Hold, b *bucket, dl time.Time) {
	h.m.b, h.m.bidx = b, len(b.holds)
	b.holds = append(b.holds, h)
	if b.sort {
		b.dls = append(b.dls, dl) // only single holds join a sorted bucket
	}
	b.live++
	switch {
	case b.hidx < 0:
		b.at = dl
		heap.Push(&s.buckets, b)
	case dl.Before(b.at):
		b.at = dl
		heap.Fix(&s.buckets, b.hidx)
	default:
		return
	}
	if s.buckets[0] == b && (s.dlAt.IsZero() || b.at.Before(s.dlAt)) {
		s.dlAt = b.at
		s.dlT.Reset(time.Until(b.at))
	}
}

// unwatchLocked takes h out of its bucket, and the bucket out of the heap
// when it is empty.
func (s *scheduler) unwatchLocked(h *Hold) {
	b := h.m.b
	if b == nil {
		return
	}
	b.holds[h.m.bidx] = nil
	h.m.b = nil
	b.live--
	if b.live == 0 && b.hidx >= 0 {
		heap.Remove(&s.buckets, b.hidx)
	}
}

// fireDeadlines is the deadline timer's callback: it steps down every hold
// whose deadline has passed, in every bucket due, and re-arms the timer.
func (s *scheduler) fireDeadlines() {
	s.mu.Lock()
	now := time.Now()
	s.dlAt = time.Time{}
	var down []*Hold
	for len(s.buckets) > 0 && !s.buckets[0].at.After(now) {
		b := s.buckets[0]
		if !b.sort {
			s.sortLocked(b)
		}
		for b.head < len(b.holds) {
			h := b.holds[b.head]
			if h == nil {
				b.head++
				continue
			}
			if b.dls[b.head].After(now) {
				break
			}
			b.head++
			h.m.b = nil
			b.live--
			h.mu.Lock()
			stepped, dl := h.stepped, h.deadline
			h.mu.Unlock()
			switch {
			case stepped:
			case !dl.After(now):
				down = append(down, h)
			default:
				// Extend moved it since: watch it at its new deadline.
				h.m.dl = dl
				s.watchLocked(h, &bucket{hidx: -1}, dl)
			}
		}
		if b.live == 0 {
			heap.Remove(&s.buckets, b.hidx)
			continue
		}
		b.at = b.dls[b.head]
		heap.Fix(&s.buckets, b.hidx)
	}
	if len(s.buckets) > 0 {
		s.dlAt = s.buckets[0].at
		s.dlT.Reset(s.dlAt.Sub(now))
	}
	s.mu.Unlock()
	for _, h := range down {
		h.stepDown(Deadline, nil, nil)
	}
}

// sortLocked sorts b's holds by deadline and makes removals leave holes, so
// that each hold steps down at its own deadline, in order.
func (s *scheduler) sortLocked(b *bucket) {
	type entry struct {
		h  *Hold
		dl time.Time
	}
	es := make([]entry, 0, b.live)
	for _, h := range b.holds {
		if h == nil {
			continue
		}
		h.mu.Lock()
		es = append(es, entry{h, h.deadline})
		h.mu.Unlock()
	}
	slices.SortFunc(es, func(a, b entry) int { return a.dl.Compare(b.dl) })
	b.holds = b.holds[:0]
	b.dls = make([]time.Time, 0, len(es))
	for i, e := range es {
		e.h.m.bidx = i
		b.holds = append(b.holds, e.h)
		b.dls = append(b.dls, e.dl)
	}
	b.sort, b.head = true, 0
}

// bucketHeap orders buckets by time.
type bucketHeap []*bucket

func (q bucketHeap) Len() int           { return len(q) }
func (q bucketHeap) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q bucketHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].hidx, q[j].hidx = i, j
}
func (q *bucketHeap) Push(x any) {
	b := x.(*bucket)
	b.hidx = len(*q)
	*q = append(*q, b)
}
func (q *bucketHeap) Pop() any {
	old := *q
	b := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	b.hidx = -1
	return b
}
