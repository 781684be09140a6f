package chaos

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Proc is what the checker knows of one candidate process.
type Proc struct {
	// ID is the process's name (its -id, unique per process; processes
	// of a same-ID fault share an instance ID, not this).
	ID string
	// Lines is its log.
	Lines []Line
	// KilledAt, when not zero, is when the checker saw the process dead
	// after sending it SIGKILL (an upper bound of its death).
	KilledAt int64
	// Stops are the [SIGSTOP, SIGCONT] windows of the process.
	Stops [][2]int64
}

// Fault is one injected fault.
type Fault struct {
	// Kind names the fault: kill, stop, cut, drop, latency, redis-restart,
	// redis-crash.
	Kind string
	// Target is the instance ID the fault hit ("" for a server fault).
	Target string
	// At is when it was injected, Healed when it was undone (SIGCONT, proxy
	// healed, server answering again; At for a kill).
	At, Healed int64
	// Short marks a fault shorter than the renew deadline, which the leader
	// may survive.
	Short bool
	// Server marks a fault of the store itself (a restart or a crash).
	// Restarted is then when the server process was started again, and
	// Healed when it was seen answering: the store answered again at some
	// moment between the two (Restarted zero: at Healed).
	Server    bool
	Restarted int64
	// DataLoss marks a server fault after which the store came back empty,
	// as a server without persistence does: every lease, term counter and
	// heartbeat record was gone at Healed.
	DataLoss bool
}

// Run is everything a run produced.
type Run struct {
	Procs  []Proc
	Faults []Fault
	Writes []Write // from the fenced store, in arrival order
	// End is when the checker stopped injecting faults and began shutting
	// the candidates down.
	End int64
	// Bound is the longest time without a leader allowed after a fault
	// (TTL + margin + scheduling slack).
	Bound time.Duration
	// DataLossWindow is how long after a store that lost its data answers
	// again (Fault.Healed, an upper bound) a leader of a lease acquired
	// before may still believe it leads: RenewInterval + RequestTimeout +
	// scheduling slack. See README.md, "The data-loss window".
	DataLossWindow time.Duration
	// ServerBound is the longest time allowed from a restarted store
	// answering again to a leader holding a lease in it (TTL + 1 s).
	ServerBound time.Duration
	// Handover marks a run of the lock mode, in which the holder gives the
	// lock up of its own accord every few seconds: many holds may then
	// begin between two faults, so the cascade check (at most one new
	// leadership after a server restart) does not apply. Every other check
	// does.
	Handover bool
	// Limit is, in the semaphore mode, the number of permits: at most Limit
	// holds may be live at once (0 or 1: one, the election and the lock
	// mode). With Limit > 1 the overlap check counts the holds live at the
	// start of each hold instead of pairs, the fenced store accepts the
	// Limit highest terms (NewSemaphoreStore), terms are checked in the
	// order the store can have granted them (a hold whose Acquire was sent
	// after another's returned has the higher term), the failover after a
	// fault is that of the faulted holder, and its permit must be taken
	// again (Limit holds live at once without it) within Bound.
	Limit int
}

// Interval is one acquisition of the lease, as a process's log tells it.
type Interval struct {
	ID   string
	Term uint64
	// Sent is when the successful Acquire was sent.
	Sent int64
	// Start is when the successful Acquire returned: no later than the
	// moment the elector became leader.
	Start int64
	// End is an upper bound of the moment the process stopped believing it
	// led: the earliest of its renew deadline (derived from the send times
	// of its successful renewals, as the elector computes it), the
	// LeadershipLost event, the leader function's return, the release of
	// the lease, its death.
	End int64
	// Led reports whether the leader function ran (otherwise the
	// acquisition failed double verification, or the process died first).
	Led bool
	// EndedBy says which bound gave End.
	EndedBy string

	deadlines []step // the renew deadline as a step function of time
	lostAt    int64  // when the LeadershipLost event was seen, if it was
	reason    string // its reason
	stops     [][2]int64
}

// step is one piece of a deadline step function: from From on, the deadline
// is D.
type step struct{ From, D int64 }

// deadlineAt returns the renew deadline in force at time t (as far as
// successful calls that had returned by t can tell).
func (iv *Interval) deadlineAt(t int64) int64 {
	d := iv.deadlines[0].D
	for _, s := range iv.deadlines[1:] {
		if s.From > t {
			break
		}
		d = s.D
	}
	return d
}

// Report is the outcome of Analyze.
type Report struct {
	Faults       map[string]int // by kind (short ones as "<kind>(short)")
	Acquisitions int            // successful Acquire calls
	Terms        int            // terms whose leader function ran
	Changes      int            // Terms - 1
	Writes       int            // writes that reached the store
	Accepted     int
	Rejected     int // fenced: term below the highest seen
	// LateWrites are writes that reached the store after their writer's
	// leadership had ended (the pause hit between check and write):
	// LateRejected of them were fenced, LateAccepted reached the store
	// before any newer term had written and are ordered before all of its
	// writes.
	LateAccepted, LateRejected int
	// LiveRejected counts the rejected writes that arrived while their
	// writer's hold was live: with a semaphore, the store's fence rejects
	// an older holder once Limit newer terms have written, although the
	// older one may still hold its permit (a cost in writes, never a stale
	// write let through).
	LiveRejected  int
	StaleAccepted int // accepted writes with a term below an earlier write's: must be 0
	PastDeadline  int // writes whose check passed after the writer's deadline or interval's end: must be 0
	// Overlaps counts the pairs of overlapping intervals that no data loss
	// explains: must be 0. With a semaphore (Run.Limit > 1) it counts the
	// holds whose start made more than Limit holds live at once, other
	// than those data loss explains.
	Overlaps int
	// Limit is Run.Limit (at least 1). MaxHolders is the most holds live
	// at once, not counting holds of leases the store lost inside a
	// data-loss window (which MaxHoldersAll counts); FullN counts the
	// starts of a hold that made Limit holds live at once.
	Limit                     int
	MaxHolders, MaxHoldersAll int
	FullN                     int
	// RefillMax is, with a semaphore, by fault kind, the longest time from
	// the injection of a fault that ended its target's hold to Limit holds
	// of others live at once (the faulted holder's permit taken again);
	// RefillN counts them.
	RefillMax map[string]time.Duration
	RefillN   map[string]int
	// DataLossFaults counts the server faults that lost the store's data.
	// DataLossOverlaps counts the pairs of overlapping intervals inside a
	// data-loss window (README.md, "The data-loss window"), and
	// DataLossOverlapMax is the longest of them.
	DataLossFaults     int
	DataLossOverlaps   int
	DataLossOverlapMax time.Duration
	// StaleRejectedDataLoss counts the rejected (fenced) writes that arrived
	// inside a data-loss window.
	StaleRejectedDataLoss int
	// TermsAcrossDataLoss counts the data-loss faults after which the first
	// new term was checked to be above every term acquired before.
	TermsAcrossDataLoss int
	// DataLossHeld counts the data-loss faults after which the store came
	// back while a leader of a lost lease still believed it led, and
	// DataLossStepDownMax is the longest time from the store seen answering
	// again to the end of such a belief.
	DataLossHeld        int
	DataLossStepDownMax time.Duration
	// ServerFaults counts the restarts and crashes of the store;
	// ServerGapMax is the longest time from the store answering again to a
	// leader holding a lease in it, and NewLeadersMax the most leaderships
	// begun after one of them before the next fault (at most 1: no cascade).
	ServerFaults  int
	ServerGapMax  time.Duration
	NewLeadersMax int
	// SameID counts the same-ID faults (a second process campaigning with
	// the leader's instance ID, stopped, removing the shared member record),
	// SameIDKept those the leader led through.
	SameID, SameIDKept int
	CtxLags            int
	CtxLagMax          time.Duration // IsLeader false → leader context cancelled, running processes only
	// StepDowns counts terms ended by their renew deadline in a process
	// that was not paused around it; StepDownLagMax is the longest time
	// from the derived deadline to the LeadershipLost event among them.
	StepDowns      int
	StepDownLagMax time.Duration
	FailoverMax    map[string]time.Duration
	FailoverN      map[string]int
	HealGapMax     time.Duration // longest time without a leader after a fault healed
	GapMax         time.Duration // longest time without a leader, whole run after the first leader
	Violations     []string
	Intervals      []Interval
}

// OK reports whether the run had no violation.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

func (r *Report) violate(format string, args ...any) {
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

func ms(ns int64) string { return fmt.Sprintf("%.1fms", float64(ns)/1e6) }

// Analyze checks a run. See README.md for the properties and why they are
// the right ones.
func Analyze(run Run) *Report {
	r := &Report{Faults: map[string]int{}, FailoverMax: map[string]time.Duration{}, FailoverN: map[string]int{},
		RefillMax: map[string]time.Duration{}, RefillN: map[string]int{}, Limit: max(run.Limit, 1)}
	sem := r.Limit > 1
	var ivs []*Interval
	byKey := map[string]*Interval{} // id/term
	for _, p := range run.Procs {
		for _, iv := range procIntervals(p, r) {
			ivs = append(ivs, iv)
			byKey[fmt.Sprintf("%s/%d", iv.ID, iv.Term)] = iv
		}
	}
	slices.SortFunc(ivs, func(a, b *Interval) int { return cmp.Compare(a.Start, b.Start) })
	r.Acquisitions = len(ivs)
	for _, iv := range ivs {
		r.Intervals = append(r.Intervals, *iv)
		if iv.Led {
			r.Terms++
		}
	}
	r.Changes = max(r.Terms-1, 0)

	faults := slices.Clone(run.Faults)
	slices.SortFunc(faults, func(a, b Fault) int { return cmp.Compare(a.At, b.At) })
	var lossy []Fault
	for _, f := range faults {
		if f.DataLoss {
			lossy = append(lossy, f)
		}
	}
	r.DataLossFaults = len(lossy)

	// Terms strictly increase with time, and intervals never overlap, except
	// inside a data-loss window. With a semaphore, at most Limit of them do.
	if sem {
		r.semaphoreHolds(ivs, lossy, run.DataLossWindow)
	}
	for i, iv := range ivs {
		if sem {
			break
		}
		if i > 0 && iv.Term <= ivs[i-1].Term {
			prev := ivs[i-1]
			r.violate("term order: %s term %d acquired at %s after %s term %d (acquired at %s)",
				iv.ID, iv.Term, ms(iv.Start), prev.ID, prev.Term, ms(prev.Start))
		}
		for _, old := range ivs[:i] {
			if old.End <= iv.Start {
				continue
			}
			length := time.Duration(min(old.End, iv.End) - iv.Start)
			f, outlasted := dataLossCause(lossy, run.DataLossWindow, old, iv)
			switch {
			case f != nil && !outlasted:
				r.DataLossOverlaps++
				r.DataLossOverlapMax = max(r.DataLossOverlapMax, length)
			case f != nil:
				r.Overlaps++
				r.violate("overlap outlasting the data-loss window: %s term %d started at %s, %s before %s term %d ended (%s) at %s, %s after the store came back empty at %s (window %v)",
					iv.ID, iv.Term, ms(iv.Start), ms(old.End-iv.Start), old.ID, old.Term, old.EndedBy, ms(old.End),
					ms(old.End-f.Healed), ms(f.Healed), run.DataLossWindow)
			default:
				r.Overlaps++
				r.violate("overlap: %s term %d started at %s, %s before %s term %d ended (%s)",
					iv.ID, iv.Term, ms(iv.Start), ms(old.End-iv.Start), old.ID, old.Term, old.EndedBy)
			}
		}
	}

	// Across data loss, the first new term is above every earlier one
	// (already implied by the order above; checked here on its own so that
	// the summary can say it was exercised).
	for _, f := range lossy {
		from, to := f.back()
		held := false
		for _, iv := range ivs {
			if iv.Start < from && iv.End > from {
				held = true
				r.DataLossStepDownMax = max(r.DataLossStepDownMax, time.Duration(iv.End-to))
			}
		}
		if held {
			r.DataLossHeld++
		}
	}
	for _, f := range lossy {
		var top uint64
		from, _ := f.back()
		for _, iv := range ivs {
			if iv.Start >= from {
				if iv.Term <= top {
					r.violate("term after data loss: %s term %d acquired at %s, after the store came back empty at %s, is not above term %d acquired before",
						iv.ID, iv.Term, ms(iv.Start), ms(f.Healed), top)
				} else if top > 0 {
					r.TermsAcrossDataLoss++
				}
				break
			}
			top = max(top, iv.Term)
		}
	}

	// (a) A running process acts only before its deadline, and only
	// before the end of its interval (a check passed after the
	// LeadershipLost event, say, means the overlap check, which trusts that
	// end, may have missed a second leader).
	for _, p := range run.Procs {
		for _, l := range p.Lines {
			switch l.Ev {
			case EvWrite:
				iv := byKey[fmt.Sprintf("%s/%d", p.ID, l.Term)]
				if iv == nil {
					r.violate("write: %s wrote with term %d, which it never acquired", p.ID, l.Term)
					continue
				}
				if d := iv.deadlineAt(l.Post); l.Pre >= d {
					r.PastDeadline++
					r.violate("past deadline: %s term %d seq %d passed its leadership check at %s, %s after its renew deadline",
						p.ID, l.Term, l.Seq, ms(l.Pre), ms(l.Pre-d))
				} else if l.Pre >= iv.End {
					r.PastDeadline++
					r.violate("check after the end: %s term %d seq %d passed its leadership check at %s, %s after its leadership ended (%s)",
						p.ID, l.Term, l.Seq, ms(l.Pre), ms(l.Pre-iv.End), iv.EndedBy)
				}
				if l.Pre < iv.Start {
					r.violate("early write: %s term %d seq %d checked at %s, before its Acquire returned at %s",
						p.ID, l.Term, l.Seq, ms(l.Pre), ms(iv.Start))
				}
			case EvCtxLag:
				if stoppedDuring(p, l.Pre, l.T) {
					continue
				}
				r.CtxLags++
				r.CtxLagMax = max(r.CtxLagMax, time.Duration(l.T-l.Pre))
			}
		}
	}

	for _, iv := range ivs {
		if iv.reason != "renew deadline passed" {
			continue
		}
		d := iv.deadlines[len(iv.deadlines)-1].D
		if stoppedDuring(Proc{Stops: iv.stops}, d-int64(time.Second), iv.lostAt) {
			continue
		}
		r.StepDowns++
		r.StepDownLagMax = max(r.StepDownLagMax, time.Duration(iv.lostAt-d))
	}

	// The fenced store. Every write of a term below that of a write that
	// arrived earlier (accepted or not) must have been rejected.
	// With a semaphore of n permits: every write of a term below the n
	// highest terms of the writes that arrived earlier must have been
	// rejected (n = 1: the highest term).
	writers := map[uint64]string{}
	var top, topAccepted topTerms
	for _, w := range run.Writes {
		r.Writes++
		if w.Accepted {
			r.Accepted++
			if t, ok := top.fence(r.Limit); ok && w.Term < t {
				r.StaleAccepted++
				if sem {
					r.violate("stale write accepted: %s term %d seq %d after writes of %d higher terms (lowest %d)", w.ID, w.Term, w.Seq, r.Limit, t)
				} else {
					r.violate("stale write accepted: %s term %d seq %d after a write of term %d", w.ID, w.Term, w.Seq, t)
				}
			}
			topAccepted.add(w.Term, r.Limit)
		} else {
			r.Rejected++
			if t, ok := topAccepted.fence(r.Limit); !ok || w.Term >= t {
				if sem {
					r.violate("store rejected %s term %d seq %d although it was among the %d highest terms accepted (%v)", w.ID, w.Term, w.Seq, r.Limit, topAccepted)
				} else {
					r.violate("store rejected %s term %d seq %d although the highest term was %d", w.ID, w.Term, w.Seq, t)
				}
			}
			for _, f := range lossy {
				if from, to := f.back(); from <= w.At && w.At < to+int64(run.DataLossWindow) {
					r.StaleRejectedDataLoss++
					break
				}
			}
		}
		top.add(w.Term, r.Limit)
		if id, ok := writers[w.Term]; ok && id != w.ID {
			r.violate("two writers of term %d: %s and %s", w.Term, id, w.ID)
		}
		writers[w.Term] = w.ID
		iv := byKey[fmt.Sprintf("%s/%d", w.ID, w.Term)]
		if iv == nil {
			r.violate("store got a write of %s with term %d, which it never acquired", w.ID, w.Term)
			continue
		}
		switch {
		case w.At >= iv.End && w.Accepted:
			r.LateAccepted++
		case w.At >= iv.End:
			r.LateRejected++
		case !w.Accepted:
			r.LiveRejected++
		}
	}

	// Faults and failover.
	covering := func(t int64) *Interval {
		for _, iv := range ivs {
			if iv.Led && iv.Start <= t && t < iv.End {
				return iv
			}
		}
		return nil
	}
	nextStart := func(t int64) *Interval {
		for _, iv := range ivs {
			if iv.Led && iv.Start >= t {
				return iv
			}
		}
		return nil
	}
	nextOther := func(t int64, inc *Interval) *Interval {
		for _, iv := range ivs {
			if iv.Led && iv.Start >= t && iv != inc {
				return iv
			}
		}
		return nil
	}
	for i, f := range faults {
		kind := f.Kind
		if f.Short {
			kind += "(short)"
		}
		r.Faults[kind]++
		until := run.End
		if i+1 < len(faults) {
			until = faults[i+1].At
		}
		// Failover: from the injection to the next leader, when the
		// incumbent lost its leadership. The next leader may have begun
		// before the incumbent's end only inside a data-loss window.
		inc := covering(f.At)
		if sem {
			// Several holds cover the injection: the fault is the target's.
			inc = nil
			for _, iv := range ivs {
				if iv.Led && iv.ID == f.Target && iv.Start <= f.At && f.At < iv.End {
					inc = iv
					break
				}
			}
			if inc != nil && inc.End < until {
				r.refill(f, kind, inc, ivs, until, run.Bound)
			}
		}
		if inc != nil && inc.End < until {
			if nx := nextOther(f.At, inc); nx != nil {
				d := time.Duration(nx.Start - f.At)
				r.FailoverN[kind]++
				r.FailoverMax[kind] = max(r.FailoverMax[kind], d)
				switch f.Kind {
				case "kill", "stop", "cut", "drop":
					if d > run.Bound {
						r.violate("slow failover: %s of %s at %s: next leader %s term %d after %v, bound %v",
							f.Kind, f.Target, ms(f.At), nx.ID, nx.Term, d, run.Bound)
					}
				}
			}
		}
		if f.Server {
			r.serverFault(f, ivs, until, run.ServerBound, !run.Handover)
		}
		if f.Kind == KindSameID {
			r.sameIDFault(f, covering(f.At))
		}
		// Time without a leader once the fault has healed.
		if covering(f.Healed) == nil {
			nx := nextStart(f.Healed)
			if nx == nil || nx.Start > until {
				// The checker waits for a leader before the next fault, so
				// this is a leader that never came.
				r.violate("no leader after %s of %s healed at %s", f.Kind, f.Target, ms(f.Healed))
				continue
			}
			d := time.Duration(nx.Start - f.Healed)
			r.HealGapMax = max(r.HealGapMax, d)
			if d > run.Bound {
				r.violate("no leader for %v after %s of %s healed at %s (bound %v)", d, f.Kind, f.Target, ms(f.Healed), run.Bound)
			}
		}
	}
	var end int64
	for _, iv := range ivs {
		if !iv.Led {
			continue
		}
		if end != 0 && iv.Start > end {
			r.GapMax = max(r.GapMax, time.Duration(iv.Start-end))
		}
		end = max(end, iv.End)
	}
	return r
}

// KindSameID is the Fault.Kind of a same-ID fault: processes campaigning
// with the leader's instance ID are started and stopped (each stop removes
// the member record they share with the leader) while the leader runs.
const KindSameID = "same-id"

// back returns the bounds of the moment a restarted store answered again:
// no earlier than the restart of its process, no later than Healed.
func (f *Fault) back() (from, to int64) {
	if f.Restarted == 0 {
		return f.Healed, f.Healed
	}
	return f.Restarted, f.Healed
}

// dataLossCause returns the data-loss fault that explains the overlap of
// old (which began first) and iv, or nil: old was acquired before the store
// was restarted empty (so its lease is one the store lost), and iv after
// (the now-empty key), inside the window. outlasted reports that old's
// belief went on past the data-loss window, which data loss does not
// excuse.
func dataLossCause(lossy []Fault, window time.Duration, old, iv *Interval) (f *Fault, outlasted bool) {
	for i := range lossy {
		f := &lossy[i]
		from, to := f.back()
		if old.Start < from && from <= iv.Start && iv.Start < to+int64(window) {
			return f, old.End > to+int64(window)
		}
	}
	return nil, false
}

// serverFault checks what follows a restart or crash of the store: a leader
// holding a lease in the store within bound of it answering again, and, when
// cascade is set, at most one new leadership before the next fault (until).
func (r *Report) serverFault(f Fault, ivs []*Interval, until int64, bound time.Duration, cascade bool) {
	r.ServerFaults++
	from, up := f.back()
	var first *Interval
	started := 0
	for _, iv := range ivs {
		if !iv.Led {
			continue
		}
		// Without data loss, a leader whose lease outlived the outage is
		// still the leader when the store is back.
		if !f.DataLoss && iv.Start < from && up < iv.End && first == nil {
			first = iv
		}
		if iv.Start >= from && iv.Start < until {
			started++
			if first == nil {
				first = iv
			}
		}
	}
	r.NewLeadersMax = max(r.NewLeadersMax, started)
	if cascade && started > 1 {
		r.violate("cascade: %d leaderships began after %s came back at %s, before the next fault; want at most 1", started, f.Kind, ms(up))
	}
	if first == nil {
		r.violate("no leader after %s: the store came back at %s and nobody acquired before the next fault", f.Kind, ms(up))
		return
	}
	gap := time.Duration(max(first.Start-up, 0))
	r.ServerGapMax = max(r.ServerGapMax, gap)
	if bound > 0 && gap > bound {
		r.violate("slow leader after %s: the store came back at %s, %s term %d acquired %v later (bound %v)",
			f.Kind, ms(up), first.ID, first.Term, gap, bound)
	}
}

// sameIDFault checks that the leader led through a same-ID fault, and above
// all that its lease was not taken from it: the backend reporting its lease
// lost means that someone deleted or replaced a live lease.
func (r *Report) sameIDFault(f Fault, inc *Interval) {
	r.SameID++
	if inc == nil || inc.ID != f.Target {
		return
	}
	if inc.End >= f.Healed {
		r.SameIDKept++
		return
	}
	if inc.reason == "lease lost" {
		r.violate("same-id: %s lost its live lease (term %d) at %s during a same-ID fault begun at %s",
			inc.ID, inc.Term, ms(inc.End), ms(f.At))
	}
}

func stoppedDuring(p Proc, from, to int64) bool {
	for _, s := range p.Stops {
		if s[0] < to && from < s[1] {
			return true
		}
	}
	return false
}

// call is one successful renewal.
type call struct {
	term uint64
	sent int64
	done int64
}

// procIntervals derives one process's leadership intervals from its log.
func procIntervals(p Proc, r *Report) []*Interval {
	var (
		ttl, rd  int64
		calls    []call // successful renewals
		acquires []Line
		ends     = map[uint64][]struct {
			t   int64
			why string
		}{}
		led  = map[uint64]bool{}
		exit int64
		lost = map[uint64]Line{}
	)
	addEnd := func(term uint64, t int64, why string) {
		ends[term] = append(ends[term], struct {
			t   int64
			why string
		}{t, why})
	}
	for _, l := range p.Lines {
		switch l.Ev {
		case EvStart:
			ttl, rd = l.OptTTL, l.OptRenewDeadline
		case EvAcquire:
			acquires = append(acquires, l)
		case EvRenew:
			if l.Err == "" {
				calls = append(calls, call{term: l.Term, sent: l.Sent, done: l.Done})
			}
		case EvRelease:
			addEnd(l.Term, l.Sent, "release")
		case EvLost:
			addEnd(l.Term, l.T, "lost event ("+l.Reason+")")
			lost[l.Term] = l
		case EvFnEnd:
			addEnd(l.Term, l.T, "leader function returned")
			led[l.Term] = true
		case EvCtxLag:
			addEnd(l.Term, l.T, "context cancelled")
		case EvLead, EvWrite:
			led[l.Term] = true
		case EvAcquired:
			led[l.Term] = true
		case EvExit:
			exit = l.T
		}
	}
	if ttl == 0 {
		if len(acquires) > 0 {
			r.violate("%s: log without a start line", p.ID)
		}
		return nil
	}
	margin := ttl - rd
	slices.SortStableFunc(calls, func(a, b call) int { return cmp.Compare(a.done, b.done) })
	var out []*Interval
	for _, a := range acquires {
		iv := &Interval{ID: p.ID, Term: a.Term, Sent: a.Sent, Start: a.Done, Led: led[a.Term], stops: p.Stops}
		if l, ok := lost[a.Term]; ok {
			iv.lostAt, iv.reason = l.T, l.Reason
		}
		// As the elector (internal/keeper) computes it: heartbeats never
		// end a lease, so they play no part.
		formula := func(renewSent int64) int64 { return renewSent + min(rd, a.TTL-margin) }
		cur := formula(a.Sent)
		iv.deadlines = []step{{a.Done, cur}}
		for _, c := range calls {
			if c.done <= a.Done || c.term != a.Term {
				continue
			}
			if c.done >= cur {
				break // the deadline passed: the elector never extends it again
			}
			cur = formula(c.sent)
			iv.deadlines = append(iv.deadlines, step{c.done, cur})
		}
		iv.End, iv.EndedBy = cur, "renew deadline"
		for _, e := range ends[a.Term] {
			if e.t < iv.End {
				iv.End, iv.EndedBy = e.t, e.why
			}
		}
		if p.KilledAt != 0 && p.KilledAt < iv.End {
			iv.End, iv.EndedBy = p.KilledAt, "killed"
		}
		if exit != 0 && exit < iv.End {
			iv.End, iv.EndedBy = exit, "exit"
		}
		out = append(out, iv)
	}
	return out
}

// String returns the summary the checker prints.
func (r *Report) String() string {
	var b strings.Builder
	kinds := make([]string, 0, len(r.Faults))
	total := 0
	for k, n := range r.Faults {
		kinds = append(kinds, k)
		total += n
	}
	slices.Sort(kinds)
	fmt.Fprintf(&b, "faults injected: %d\n", total)
	for _, k := range kinds {
		line := fmt.Sprintf("  %-22s %4d", k, r.Faults[k])
		if n := r.FailoverN[k]; n > 0 {
			line += fmt.Sprintf("   leader lost %d times, failover max %v", n, r.FailoverMax[k].Round(time.Millisecond))
		}
		fmt.Fprintln(&b, line)
	}
	fmt.Fprintf(&b, "acquisitions: %d, terms that led: %d, leadership changes: %d\n", r.Acquisitions, r.Terms, r.Changes)
	if r.Limit > 1 {
		fmt.Fprintf(&b, "semaphore of %d permits: most holds live at once %d (with holds of leases lost inside data-loss windows: %d); holds begun with all %d permits taken: %d\n",
			r.Limit, r.MaxHolders, r.MaxHoldersAll, r.Limit, r.FullN)
		fmt.Fprintf(&b, "holds begun with more than %d holds live, outside data-loss windows: %d\n", r.Limit, r.Overlaps)
		for _, k := range slices.Sorted(maps.Keys(r.RefillN)) {
			fmt.Fprintf(&b, "  permit of the faulted holder taken again after %s: %d times, max %v after the injection\n",
				k, r.RefillN[k], r.RefillMax[k].Round(time.Millisecond))
		}
	} else {
		fmt.Fprintf(&b, "overlapping leadership intervals outside data-loss windows: %d\n", r.Overlaps)
	}
	if r.DataLossFaults > 0 {
		fmt.Fprintf(&b, "data loss: %d server faults lost the store's data; overlaps inside data-loss windows: %d, max length %v; stale writes rejected inside them: %d; new term above all earlier ones after %d of them\n",
			r.DataLossFaults, r.DataLossOverlaps, r.DataLossOverlapMax.Round(time.Microsecond), r.StaleRejectedDataLoss, r.TermsAcrossDataLoss)
		fmt.Fprintf(&b, "data loss: %d times a leader of a lost lease still led when the store came back; max time from the store seen answering to its step-down: %v\n",
			r.DataLossHeld, r.DataLossStepDownMax.Round(time.Microsecond))
	}
	if r.ServerFaults > 0 {
		fmt.Fprintf(&b, "server restarts and crashes: %d; max time from the store answering again to a leader: %v; most leaderships begun after one: %d\n",
			r.ServerFaults, r.ServerGapMax.Round(time.Millisecond), r.NewLeadersMax)
	}
	if r.SameID > 0 {
		fmt.Fprintf(&b, "same-ID faults: %d, the leader led through %d\n", r.SameID, r.SameIDKept)
	}
	fmt.Fprintf(&b, "checks passed after the renew deadline or the end of the interval: %d\n", r.PastDeadline)
	fmt.Fprintf(&b, "store: %d writes, %d accepted, %d rejected (fenced); stale-term writes accepted: %d\n",
		r.Writes, r.Accepted, r.Rejected, r.StaleAccepted)
	fmt.Fprintf(&b, "writes arriving after their leadership ended: %d rejected, %d accepted before any newer term wrote\n",
		r.LateRejected, r.LateAccepted)
	if r.Limit > 1 {
		fmt.Fprintf(&b, "writes rejected while their hold was live (%d newer terms had written): %d\n", r.Limit, r.LiveRejected)
	}
	fmt.Fprintf(&b, "leader context cancelled after IsLeader turned false: %d times, max lag %v (running processes)\n",
		r.CtxLags, r.CtxLagMax.Round(time.Microsecond))
	fmt.Fprintf(&b, "step-downs at the renew deadline: %d, max lag from deadline to LeadershipLost event %v (running processes)\n",
		r.StepDowns, r.StepDownLagMax.Round(time.Microsecond))
	fmt.Fprintf(&b, "max time without a leader after a fault healed: %v; longest leaderless gap: %v\n",
		r.HealGapMax.Round(time.Millisecond), r.GapMax.Round(time.Millisecond))
	fmt.Fprintf(&b, "violations: %d\n", len(r.Violations))
	for i, v := range r.Violations {
		if i == 20 {
			fmt.Fprintf(&b, "  ... and %d more\n", len(r.Violations)-20)
			break
		}
		fmt.Fprintf(&b, "  %s\n", v)
	}
	return b.String()
}

// topTerms is the highest distinct terms seen, highest first.
type topTerms []uint64

// add records term, keeping the n highest.
func (t *topTerms) add(term uint64, n int) {
	if slices.Contains(*t, term) {
		return
	}
	i, _ := slices.BinarySearchFunc(*t, term, func(a, b uint64) int { return cmp.Compare(b, a) })
	*t = slices.Insert(*t, i, term)
	*t = (*t)[:min(len(*t), n)]
}

// fence returns the lowest term a write may have to be accepted by a store
// of n permits: the n-th highest term seen; ok is false while fewer than n
// terms have been seen (every term is accepted then).
func (t topTerms) fence(n int) (term uint64, ok bool) {
	if len(t) < n {
		return 0, false
	}
	return t[n-1], true
}

// semaphoreHolds checks the holds of a semaphore of r.Limit permits: at the
// start of each hold, at most r.Limit holds are live, not counting those of
// leases the store lost, whose holders may believe in them up to the end of
// the data-loss window (a hold begun before a data-loss restart and ended
// inside its window, when the new hold begins inside it too); and terms were
// granted in an order the store can have granted them: a hold acquired
// (sent) after another one's Acquire returned has a higher term, and no term
// is granted twice.
func (r *Report) semaphoreHolds(ivs []*Interval, lossy []Fault, window time.Duration) {
	seen := map[uint64]*Interval{}
	for i, iv := range ivs {
		if prev, ok := seen[iv.Term]; ok {
			r.violate("term granted twice: %s and %s both acquired term %d", prev.ID, iv.ID, iv.Term)
		}
		seen[iv.Term] = iv
		for _, old := range ivs[:i] {
			if old.Term > iv.Term && old.Start <= iv.Sent {
				r.violate("term order: %s term %d acquired (sent at %s) after %s term %d had been acquired at %s",
					iv.ID, iv.Term, ms(iv.Sent), old.ID, old.Term, ms(old.Start))
			}
		}

		// The holds live at iv.Start (iv among them).
		var live, ghosts []*Interval
		var outlasting *Interval
		var cause *Fault
		for _, x := range ivs {
			if x.Start > iv.Start || x.End <= iv.Start {
				continue
			}
			live = append(live, x)
			if x == iv {
				continue
			}
			if f, outlasted := dataLossCause(lossy, window, x, iv); f != nil {
				if outlasted {
					outlasting, cause = x, f
				} else {
					ghosts = append(ghosts, x)
				}
			}
		}
		n := len(live) - len(ghosts)
		r.MaxHolders = max(r.MaxHolders, n)
		r.MaxHoldersAll = max(r.MaxHoldersAll, len(live))
		if n == r.Limit {
			r.FullN++
		}
		if len(live) <= r.Limit {
			continue
		}
		end := iv.End
		var names []string
		for _, x := range live {
			end = min(end, x.End)
			names = append(names, fmt.Sprintf("%s term %d [%s, %s) ended by %s", x.ID, x.Term, ms(x.Start), ms(x.End), x.EndedBy))
		}
		length := time.Duration(end - iv.Start)
		switch {
		case n <= r.Limit:
			r.DataLossOverlaps++
			r.DataLossOverlapMax = max(r.DataLossOverlapMax, length)
		case outlasting != nil && n-1 <= r.Limit:
			r.Overlaps++
			r.violate("holders at once outlasting the data-loss window: %s term %d started at %s with %d holds live (limit %d), %s term %d ended (%s) at %s, %s after the store came back empty at %s (window %v): %s",
				iv.ID, iv.Term, ms(iv.Start), len(live), r.Limit, outlasting.ID, outlasting.Term, outlasting.EndedBy, ms(outlasting.End),
				ms(outlasting.End-cause.Healed), ms(cause.Healed), window, strings.Join(names, "; "))
		default:
			r.Overlaps++
			r.violate("holders at once: %s term %d started at %s with %d holds live (limit %d) for %s: %s",
				iv.ID, iv.Term, ms(iv.Start), n, r.Limit, ms(int64(length)), strings.Join(names, "; "))
		}
	}
}

// refill measures, for a fault f that ended inc (its target's hold) before
// until (the next fault), the time from the injection to the first moment
// at which Limit holds other than inc are live: the faulted holder's permit
// has been taken again, so it did not leak. After kill, stop, cut and drop
// it must come within bound.
func (r *Report) refill(f Fault, kind string, inc *Interval, ivs []*Interval, until int64, bound time.Duration) {
	liveAt := func(t int64) int {
		n := 0
		for _, x := range ivs {
			if x != inc && x.Led && x.Start <= t && t < x.End {
				n++
			}
		}
		return n
	}
	at := int64(-1)
	if liveAt(inc.End) >= r.Limit {
		at = inc.End
	} else {
		for _, x := range ivs {
			if x.Led && x.Start >= inc.End && x.Start < until && liveAt(x.Start) >= r.Limit {
				at = x.Start
				break
			}
		}
	}
	switch f.Kind {
	case "kill", "stop", "cut", "drop":
	default:
		if at >= 0 {
			r.RefillN[kind]++
			r.RefillMax[kind] = max(r.RefillMax[kind], time.Duration(at-f.At))
		}
		return
	}
	if at < 0 {
		r.violate("permit not taken again: after %s of %s at %s (its hold term %d ended at %s), never %d holds of others at once before the next fault at %s",
			f.Kind, f.Target, ms(f.At), inc.Term, ms(inc.End), r.Limit, ms(until))
		return
	}
	d := time.Duration(at - f.At)
	r.RefillN[kind]++
	r.RefillMax[kind] = max(r.RefillMax[kind], d)
	if d > bound {
		r.violate("slow refill: after %s of %s at %s, %d holds of others live at once only %v later (bound %v)",
			f.Kind, f.Target, ms(f.At), r.Limit, d, bound)
	}
}
