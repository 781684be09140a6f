// Package electortest holds the test scaffolding shared by the elector tests
// of the root package and of the backends: a Recorder of leadership
// intervals, the safety check CheckNoOverlap, polling helpers for real
// servers, a quiet logger, and stores with behaviour of their own: Refusing
// (a restart guard's refusals) and Renewals (renewal events, silent lease
// loss). It is imported only from _test.go files.
//
// Eventually, Recorder.Started, Recorder.Ended and WaitLeader poll in real
// time, for tests against real servers. Inside a testing/synctest bubble use
// virtual sleeps instead; Recorder.Attach, Recorder.Intervals,
// CheckNoOverlap and Leaders work in both.
package electortest

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sovereign-go/sovereign"
)

// bound is how long Eventually waits for a condition before failing.
const bound = 20 * time.Second

// poll is how often Eventually checks its condition.
const poll = 5 * time.Millisecond

// Event is an event with the time it was delivered and the ID of the elector
// that published it. In a synctest bubble listeners run before time
// advances, so the delivery time is the time of the event.
type Event struct {
	At    time.Time
	ID    string
	Event sovereign.Event
}

// Interval is one leadership term of one elector.
type Interval struct {
	ID    string
	Term  uint64
	Start time.Time // term acquired, or leader function entered
	End   time.Time // term lost, or leader context seen cancelled; zero while leading
	// Reason is why the term ended, as its LeadershipLost event tells; zero
	// for terms recorded by a leader function.
	Reason sovereign.LossReason
}

// Recorder records leadership intervals, from the events of electors
// (Attach) or from leader functions (Campaign). Its zero value is ready to
// use; it is safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	evs  []Event
	ivs  []Interval
	open map[*sovereign.Elector]int // index in ivs of the term e leads
}

// Attach records every event of e, and the terms its LeadershipAcquired and
// LeadershipLost events tell.
func (r *Recorder) Attach(e *sovereign.Elector) {
	e.Subscribe(func(ev sovereign.Event) {
		r.mu.Lock()
		defer r.mu.Unlock()
		now := time.Now()
		r.evs = append(r.evs, Event{At: now, ID: e.ID(), Event: ev})
		switch ev := ev.(type) {
		case sovereign.LeadershipAcquired:
			if r.open == nil {
				r.open = make(map[*sovereign.Elector]int)
			}
			r.open[e] = len(r.ivs)
			r.ivs = append(r.ivs, Interval{ID: e.ID(), Term: ev.Term, Start: now})
		case sovereign.LeadershipLost:
			if i, ok := r.open[e]; ok {
				r.ivs[i].End, r.ivs[i].Reason = now, ev.Reason
				delete(r.open, e)
			}
		}
	})
}

// Campaign runs e.Run in a goroutine with a leader function that records
// each term in r and holds leadership until its leader context is
// cancelled; it fails t if that context carries no term. The returned stop
// ends Run and waits for it; it is idempotent and also runs when the test
// ends, so register the clean-up of e's backend before calling Campaign.
func (r *Recorder) Campaign(t testing.TB, e *sovereign.Elector) (stop func()) {
	id := e.ID()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = e.Run(ctx, func(leaderCtx context.Context) error {
			n, ok := sovereign.TermFromContext(leaderCtx)
			if !ok {
				t.Errorf("%s: leader context carries no term", id)
			}
			r.mu.Lock()
			i := len(r.ivs)
			r.ivs = append(r.ivs, Interval{ID: id, Term: n, Start: time.Now()})
			r.mu.Unlock()
			<-leaderCtx.Done()
			r.mu.Lock()
			r.ivs[i].End = time.Now()
			r.mu.Unlock()
			return nil
		})
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return stop
}

// Events returns the events recorded by Attach, in order of delivery.
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// Intervals returns the recorded terms in order of start (ties in the order
// they were recorded), including those still led.
func (r *Recorder) Intervals() []Interval {
	r.mu.Lock()
	ivs := slices.Clone(r.ivs)
	r.mu.Unlock()
	sortByStart(ivs)
	return ivs
}

// Started waits (in real time) until term n of the elector id has begun,
// and returns it.
func (r *Recorder) Started(t testing.TB, id string, n uint64) Interval {
	t.Helper()
	return r.wait(t, fmt.Sprintf("start of term %d of %s", n, id), func(iv Interval) bool {
		return iv.ID == id && iv.Term == n
	})
}

// Ended waits (in real time) until term n of the elector id has ended, and
// returns it.
func (r *Recorder) Ended(t testing.TB, id string, n uint64) Interval {
	t.Helper()
	return r.wait(t, fmt.Sprintf("end of term %d of %s", n, id), func(iv Interval) bool {
		return iv.ID == id && iv.Term == n && !iv.End.IsZero()
	})
}

func (r *Recorder) wait(t testing.TB, what string, match func(Interval) bool) Interval {
	t.Helper()
	var got Interval
	Eventually(t, what, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		i := slices.IndexFunc(r.ivs, match)
		if i < 0 {
			return false
		}
		got = r.ivs[i]
		return true
	})
	return got
}

// CheckNoOverlap fails t if two of the intervals overlap in time (a term
// still led overlaps every later one) or if terms do not strictly increase
// in order of start.
func CheckNoOverlap(t testing.TB, ivs []Interval) {
	t.Helper()
	ivs = slices.Clone(ivs)
	sortByStart(ivs)
	for i, a := range ivs {
		if i > 0 && a.Term <= ivs[i-1].Term {
			p := ivs[i-1]
			t.Errorf("term %d of %s began after term %d of %s: got no increase, want a higher term", a.Term, a.ID, p.Term, p.ID)
		}
		for _, b := range ivs[i+1:] {
			if a.End.IsZero() || b.Start.Before(a.End) {
				t.Errorf("term %d of %s began at %s while term %d of %s (%s..%s) still led",
					b.Term, b.ID, clock(b.Start), a.Term, a.ID, clock(a.Start), clock(a.End))
			}
		}
	}
}

func sortByStart(ivs []Interval) {
	slices.SortStableFunc(ivs, func(a, b Interval) int { return a.Start.Compare(b.Start) })
}

// clock formats a time of an interval; the zero time is an open end.
func clock(tm time.Time) string {
	if tm.IsZero() {
		return "now"
	}
	return tm.Format("15:04:05.000")
}

// Eventually polls cond (in real time) until it holds, failing t after a
// generous bound. It is for observable conditions on real servers; inside a
// synctest bubble, sleep in virtual time instead.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, what, bound, cond)
}

func eventuallyWithin(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v", what, limit)
			return
		}
		<-tick.C // polling a real server's state
	}
}

// Leaders returns the electors among es that report IsLeader.
func Leaders(es ...*sovereign.Elector) []*sovereign.Elector {
	var out []*sovereign.Elector
	for _, e := range es {
		if e.IsLeader() {
			out = append(out, e)
		}
	}
	return out
}

// Candidate is a test's handle on one campaigning elector.
type Candidate interface {
	comparable
	Elector() *sovereign.Elector
}

// WaitLeader waits (in real time) until one of cands other than except
// leads, and returns it; it fails t at once if two lead at once. Pass the
// zero C as except to accept any leader.
func WaitLeader[C Candidate](t testing.TB, except C, cands []C) C {
	t.Helper()
	var got C
	Eventually(t, "one leader", func() bool {
		var zero C
		got = zero
		for _, c := range cands {
			if !c.Elector().IsLeader() {
				continue
			}
			if got != zero {
				t.Fatalf("%s and %s lead at once", got.Elector().ID(), c.Elector().ID())
			}
			got = c
		}
		return got != zero && got != except
	})
	return got
}

// Logger returns a logger for electors under test: slog.Default with -v,
// otherwise one that discards everything.
func Logger() *slog.Logger {
	if testing.Verbose() {
		return slog.Default()
	}
	return slog.New(slog.DiscardHandler)
}
