package sovereign

import (
	"time"
)

// staleState is what an elector knows of the current leader's heartbeats.
// It belongs to e.mu.
type staleState struct {
	holder       string
	term         uint64
	missingSince time.Time // when this elector first saw the record missing; zero when seen
	stale        bool
	age          time.Duration
}

// observeHolder notes the heartbeat of the holder in rec (read from the
// store) and publishes LeaderStale when it has been missing for longer than
// HeartbeatTTL. It never acts on it.
func (e *Elector) observeHolder(rec Record) {
	if rec.HolderID == "" || rec.HolderID == e.id && rec.Term == e.Term() {
		return
	}
	now := time.Now()
	e.mu.Lock()
	st := &e.stale
	if st.holder != rec.HolderID || st.term != rec.Term {
		*st = staleState{holder: rec.HolderID, term: rec.Term}
	}
	if rec.HasHeartbeat() {
		st.missingSince, st.stale, st.age = time.Time{}, false, 0
		e.mu.Unlock()
		return
	}
	if st.missingSince.IsZero() {
		st.missingSince = now
	}
	st.age = now.Sub(st.missingSince)
	report := !st.stale && st.age > e.opts.HeartbeatTTL
	if report {
		st.stale = true
		e.bus.publish(LeaderStale{Leader: rec, Age: st.age})
	}
	age := st.age
	e.mu.Unlock()
	if report {
		e.log.Warn("sovereign: leader's heartbeat record is missing; its lease still stands until its TTL ends",
			"leader", rec.HolderID, "term", rec.Term, "missing_for", age)
	}
}

// Status is a snapshot of an elector, for health checks and status pages.
type Status struct {
	// State is the elector's state (Follower past a leader's renew deadline).
	State State
	// Term is the fencing term while leading, else 0.
	Term uint64
	// Deadline is when leadership ends unless a renewal succeeds; zero when
	// not leading.
	Deadline time.Time
	// LastRenewal is the send time of the last successful acquisition or
	// renewal of the current term; zero when not leading.
	LastRenewal time.Time
	// RenewFailures counts consecutive failed renewals of the current term.
	RenewFailures int
	// Leader is the last leader this elector knows of (HolderID empty when
	// none).
	Leader Record
	// LeaderStale reports that the leader's heartbeat record has been
	// missing for longer than HeartbeatTTL (see LeaderStale).
	LeaderStale bool
	// LeaderStaleFor is how long it has been missing, by this elector's
	// clock.
	LeaderStaleFor time.Duration
}

// Status returns a snapshot of the elector. It does no I/O.
func (e *Elector) Status() Status {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := Status{State: e.state, Leader: e.leader}
	if e.state == Leader && !e.leadingLocked() {
		s.State = Follower
	}
	if e.hold != nil {
		hs := e.hold.Status()
		if s.State == Leader {
			s.Term = e.term
			s.Deadline = hs.Deadline
		}
		s.LastRenewal, s.RenewFailures = hs.LastRenewal, hs.Failures
	}
	if e.stale.holder == e.leader.HolderID && e.stale.term == e.leader.Term {
		s.LeaderStale, s.LeaderStaleFor = e.stale.stale, e.stale.age
	}
	return s
}
