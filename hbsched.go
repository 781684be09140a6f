package sovereign

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/coalesce"
)

// maxHeartbeatBatch bounds the records of one HeartbeatBatch call.
var maxHeartbeatBatch = coalesce.MaxBatch // a variable for tests

// hbKey identifies the electors whose heartbeats are sent together: one
// backend that records heartbeats in batches, one HeartbeatInterval, one
// RequestTimeout.
type hbKey struct {
	b        backend.Backend
	interval time.Duration
	timeout  time.Duration
}

// hbScheduler sends the heartbeats of every elector of a process with the
// same hbKey. They fall due on one grid of instants (multiples of the
// interval), and one timer sends those due with one HeartbeatBatch call per
// instant (per maxHeartbeatBatch records; up to coalesce.MaxInFlight of
// those calls in flight at once). An elector never wakes for its
// heartbeats, and at rest the scheduler costs no goroutine: the timer's
// callback runs only while a batch is sent. A failed heartbeat is retried
// after the elector's backoff rather than at the next instant.
type hbScheduler struct {
	key     hbKey
	send    func(context.Context, []backend.HeartbeatRequest) []error
	grouper backend.BatchGrouper // the backend's, when it places keys in groups

	mu       sync.Mutex
	members  map[*Elector]*hbMember
	timer    *time.Timer   // armed for the earliest next of a member; nil when none
	due      time.Time     // when timer fires, while it is armed
	inflight chan struct{} // closed when the batch being sent has been answered; nil when none

	// Buffers of fire, kept from one batch to the next (used by the
	// running fire only), so that an idle batch allocates next to nothing.
	batch []*hbMember
	reqs  []backend.HeartbeatRequest
	errs  []error
}

type hbMember struct {
	e        *Elector
	req      backend.HeartbeatRequest // what its heartbeat asks for
	group    uint32                   // the key's group (backend.BatchGrouper), or 0
	next     time.Time                // when its next heartbeat is due
	failures int                      // consecutive failed heartbeats
	gone     bool                     // unscheduled
}

var (
	hbSchedsMu sync.Mutex
	hbScheds   = map[hbKey]*hbScheduler{}
)

// scheduleHeartbeats registers e with the scheduler of its key, made on
// demand; its first heartbeat goes out at once (gathered with those of
// electors starting at the same moment).
func (e *Elector) scheduleHeartbeats(hb backend.BatchHeartbeater) {
	key := hbKey{e.b, e.opts.HeartbeatInterval, e.opts.RequestTimeout}
	hbSchedsMu.Lock()
	s := hbScheds[key]
	if s == nil {
		s = &hbScheduler{key: key, send: hb.HeartbeatBatch, members: make(map[*Elector]*hbMember)}
		s.grouper, _ = e.b.(backend.BatchGrouper)
		hbScheds[key] = s
	}
	s.mu.Lock()
	next := time.Now().Add(coalesce.Gather)
	m := &hbMember{e: e, req: backend.HeartbeatRequest{Key: e.name, ID: e.id, TTL: e.opts.HeartbeatTTL}, next: next}
	if s.grouper != nil {
		m.group = s.grouper.BatchGroup(e.name)
	}
	s.members[e] = m
	// Only an earlier instant moves the timer: no scan of every member for
	// each of thousands of electors starting together.
	if s.inflight == nil && (s.timer == nil || next.Before(s.due)) {
		s.setLocked(next)
	}
	s.mu.Unlock()
	hbSchedsMu.Unlock()
}

// unscheduleHeartbeats removes e from its scheduler. It returns once no
// heartbeat of e is in flight, so that a record removed afterwards is not
// written again by a late batch.
func (e *Elector) unscheduleHeartbeats() {
	key := hbKey{e.b, e.opts.HeartbeatInterval, e.opts.RequestTimeout}
	hbSchedsMu.Lock()
	s := hbScheds[key]
	if s == nil {
		hbSchedsMu.Unlock()
		return
	}
	s.mu.Lock()
	if m := s.members[e]; m != nil {
		m.gone = true
		delete(s.members, e)
	}
	inflight := s.inflight
	if len(s.members) == 0 {
		if s.timer != nil {
			s.timer.Stop()
			s.timer = nil
		}
		delete(hbScheds, key)
	}
	s.mu.Unlock()
	hbSchedsMu.Unlock()
	if inflight != nil {
		<-inflight // a channel, not a lock: durably blocking inside synctest
	}
}

// armLocked sets the timer for the earliest heartbeat due, unless a batch is
// being sent (its end arms the timer).
func (s *hbScheduler) armLocked() {
	if s.inflight != nil || len(s.members) == 0 {
		return
	}
	var first time.Time
	for _, m := range s.members {
		if first.IsZero() || m.next.Before(first) {
			first = m.next
		}
	}
	s.setLocked(first)
}

// setLocked arms the timer for t.
func (s *hbScheduler) setLocked(t time.Time) {
	s.due = t
	if s.timer == nil {
		s.timer = time.AfterFunc(time.Until(t), s.fire)
		return
	}
	s.timer.Reset(time.Until(t))
}

// fire sends the heartbeats due, reports each result to its elector and
// arms the timer for the next.
func (s *hbScheduler) fire() {
	s.mu.Lock()
	if s.inflight != nil || len(s.members) == 0 {
		s.mu.Unlock()
		return
	}
	now := time.Now()
	batch, reqs := s.batch[:0], s.reqs[:0]
	for _, m := range s.members {
		// Heartbeats due within the gathering window go now, with the others.
		if !m.next.After(now.Add(coalesce.Gather)) {
			batch = append(batch, m)
		}
	}
	if s.grouper != nil && len(batch) > maxHeartbeatBatch {
		// Whole groups per call (see backend.BatchGrouper).
		slices.SortFunc(batch, func(a, b *hbMember) int { return cmp.Compare(a.group, b.group) })
	}
	for _, m := range batch {
		reqs = append(reqs, m.req)
	}
	done := make(chan struct{})
	s.inflight = done
	s.mu.Unlock()

	errs := slices.Grow(s.errs[:0], len(reqs))[:len(reqs)]
	// The calls of one instant go out with up to coalesce.MaxInFlight in
	// flight at once, as the lease keeper's renewals do: each writes only
	// its own range of errs, so a slow or hung call delays no other.
	coalesce.Chunks((len(reqs)+maxHeartbeatBatch-1)/maxHeartbeatBatch, func(_, c int) {
		i := c * maxHeartbeatBatch
		j := min(i+maxHeartbeatBatch, len(reqs))
		ctx, cancel := context.WithTimeout(context.Background(), s.key.timeout)
		res := s.send(ctx, reqs[i:j])
		cancel()
		for k := i; k < j; k++ {
			if len(res) != j-i {
				errs[k] = fmt.Errorf("sovereign: the backend answered %d heartbeats of a batch of %d", len(res), j-i)
				continue
			}
			errs[k] = res[k-i]
		}
	})

	s.mu.Lock()
	now = time.Now()
	next := now.Add(coalesce.Grid(now, s.key.interval))
	for i, m := range batch {
		if m.gone {
			continue // unscheduled meanwhile: its result no longer matters
		}
		e := m.e
		if err := errs[i]; err != nil {
			m.failures++
			m.next = now.Add(e.backoff(m.failures))
			e.heartbeatFailed(m.failures, err)
			continue
		}
		m.failures = 0
		m.next = next
		e.backendOKAt(now)
	}
	// Keep the buffers, without pointers into electors that may go.
	clear(batch[:cap(batch)])
	clear(reqs[:cap(reqs)])
	clear(errs[:cap(errs)])
	s.batch, s.reqs, s.errs = batch[:0], reqs[:0], errs[:0]
	s.inflight = nil
	close(done)
	s.armLocked()
	s.mu.Unlock()
}
