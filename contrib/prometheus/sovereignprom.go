// Package sovereignprom exports the measurements of Sovereign's electors
// (package sovereign) and lockers (package lock) to Prometheus.
//
// New returns a *Metrics registered with a prometheus.Registerer; pass it as
// sovereign.Options.Metrics to any number of electors (of different
// elections):
//
//	reg := prometheus.NewRegistry()
//	m, err := sovereignprom.New(reg, nil)
//	...
//	e, err := sovereign.New(b, "billing-cron", id, &sovereign.Options{Metrics: m})
//	m.Init("billing-cron") // export is_leader 0 before the first leadership
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// The package keeps no global state: New registers with the Registerer it is
// given, never with the default one, and two registries may each have their
// own Metrics. Wrap the registerer with
// prometheus.WrapRegistererWith or WrapRegistererWithPrefix to add constant
// labels or a prefix.
//
// # Metrics
//
// Every elector metric carries the label election, the election's name:
//
//   - sovereign_is_leader (gauge): 1 while this process leads the
//     election, else 0. It is computed at scrape time against the last
//     renew deadline, like Elector.IsLeader, so a leader past its deadline
//     reads 0 even before it has stepped down.
//   - sovereign_term (gauge): the fencing term while leading, else 0.
//     Prometheus values are float64, exact for integers up to 2^53 (about
//     9.0e15). Redis terms are the server clock in microseconds, about
//     1.7e15 today, so they are exact (the Redis scripts have the same 2^53
//     bound); etcd and memory terms are small counters.
//   - sovereign_lease_seconds_left (gauge): seconds until the renew
//     deadline, computed at scrape time; 0 when not leading.
//   - sovereign_leadership_transitions_total (counter, label reason):
//     reason "acquired" counts terms begun; every other reason counts terms
//     ended, by sovereign.LossReason.String ("resigned", "closed",
//     "leader function returned", "renew deadline passed", "lease lost").
//   - sovereign_renew_failures_total (counter): failed lease renewals
//     (each one is retried until the renew deadline).
//   - sovereign_events_dropped_total (counter): events lost by listeners
//     that fell more than 1024 events behind.
//
// With Options.ClientGoCompat, leader_election_master_status{name} (gauge)
// is exported too, with the election's name as name: the metric of
// Kubernetes' client-go leader election, so that existing dashboards and
// alerts keep working.
//
// # Lock metrics
//
// *Metrics also implements lock.Metrics: pass it as lock.Options.Metrics to
// any number of Lockers. Every lock metric carries the label class, the
// lock's class (lock.Options.Class, by default the key's first segment:
// "tally" for "tally/42"), never the key, so that per-entity keys do not
// make unbounded series:
//
//   - sovereign_lock_acquisitions_total (counter, label result): TryAcquire
//     and Acquire calls (and those of TryDo and Do) by outcome: "acquired",
//     "held", "error" or "cancelled".
//   - sovereign_lock_wait_seconds (histogram): how long the calls that
//     acquired took, waiting included (Options.LockWaitBuckets).
//   - sovereign_lock_hold_seconds (histogram): how long locks were held, from
//     acquisition to release, lost ones included (Options.LockHoldBuckets).
//   - sovereign_locks_held (gauge): locks acquired and not yet released. A
//     lost lock counts until its holder calls Release (Do and TryDo call it
//     when their function returns).
//   - sovereign_locks_lost_total (counter, label reason): locks lost while
//     held: "deadline", "lease lost" or "max hold".
//
// A class's series appear at its first acquisition attempt, at zero for
// every result and reason, so that increase() sees the first loss.
//
// # Series
//
// Series of an election appear at its first leadership, or at once after
// Init. A replica that never led exports no is_leader series unless Init was
// called, so call Init for every election a process campaigns in: an alert on
// "no replica leads" then sees zeros rather than absent series. Forget
// removes an election's series.
//
// The labels are bounded: election names, lock classes, fixed sets of
// results and reasons. One Metrics may serve electors of many elections;
// electors of the same election in one process share its series, which then
// describe the last term acquired by any of them.
//
// # Alerts
//
// alerts.yaml, beside this package's source, holds example Prometheus
// alerting rules over these metrics (no leader, no replica reporting, more
// than one leader, flapping, involuntary loss, renew failures, a fencing
// term that went back, dropped events, lost locks), with promtool unit tests
// in testdata.
package sovereignprom

import (
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/lock"
)

// ReasonAcquired is the reason label of sovereign_leadership_transitions_total
// that counts terms begun; the other reasons count terms ended.
const ReasonAcquired = "acquired"

// Options configure a Metrics. A nil *Options means every default.
type Options struct {
	// ClientGoCompat also exports client-go's leader election gauge,
	// leader_election_master_status{name}: 1 while leading, 0 otherwise,
	// with the election's name as name. New fails on a registry that already
	// has it (registered by client-go's component-base or by
	// controller-runtime).
	// Default: false.
	ClientGoCompat bool

	// LockWaitBuckets are the upper bounds, in seconds, of the buckets of
	// sovereign_lock_wait_seconds.
	// Default: DefaultLockWaitBuckets (1 ms to 5 min).
	LockWaitBuckets []float64

	// LockHoldBuckets are the upper bounds, in seconds, of the buckets of
	// sovereign_lock_hold_seconds.
	// Default: DefaultLockHoldBuckets (10 ms to 1 h).
	LockHoldBuckets []float64
}

// Default histogram buckets of the lock metrics, in seconds.
var (
	// DefaultLockWaitBuckets go from a lock acquired at once (one round
	// trip) to a waiter queued for minutes.
	DefaultLockWaitBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	// DefaultLockHoldBuckets go from a short critical section to an hour-long
	// job.
	DefaultLockHoldBuckets = []float64{.01, .1, .5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600}
)

// Lock acquisition results and loss reasons, as package lock reports them;
// each class's series are created at zero for all of them.
var (
	lockResults     = []string{"acquired", "held", "error", "cancelled"}
	lockLossReasons = []string{"deadline", "lease lost", "max hold"}
)

// Metrics adapts sovereign.Metrics and lock.Metrics to Prometheus. It is a
// prometheus.Collector, registered by New. Its methods are safe for
// concurrent use and never block.
type Metrics struct {
	// NopMetrics supplies the methods of hooks added to sovereign.Metrics
	// after this adapter was written.
	sovereign.NopMetrics

	opts Options

	isLeader, term, leaseLeft, masterStatus *prometheus.Desc

	transitions, renewFailures, eventsDropped *prometheus.CounterVec

	lockAcquisitions, locksLost *prometheus.CounterVec
	lockWait, lockHold          *prometheus.HistogramVec
	locksHeld                   *prometheus.GaugeVec

	// vecs are the vectors above, each described and collected with m.
	vecs []prometheus.Collector

	mu          sync.Mutex                // guards elections, lockClasses
	elections   map[string]*electionState // by election name
	lockClasses map[string]bool           // classes whose series exist
}

// electionState is what Metrics knows of one election in this process.
type electionState struct {
	leading  bool
	term     uint64
	deadline time.Time // the renew deadline of term, while leading
}

// lossReasons are the reasons pre-initialised at zero for every election,
// so that rate() and increase() see the first increment.
var lossReasons = []sovereign.LossReason{
	sovereign.ReasonResigned, sovereign.ReasonClosed, sovereign.ReasonReturned,
	sovereign.ReasonDeadline, sovereign.ReasonLeaseLost,
}

// New returns a Metrics registered with reg. reg may be nil: then register
// the Metrics (a prometheus.Collector) yourself. New fails, with an error
// that errors.As finds a prometheus.AlreadyRegisteredError in, when reg
// already has metrics of the same names.
func New(reg prometheus.Registerer, opts *Options) (*Metrics, error) {
	m := &Metrics{elections: make(map[string]*electionState), lockClasses: make(map[string]bool)}
	if opts != nil {
		m.opts = *opts
	}
	if m.opts.LockWaitBuckets == nil {
		m.opts.LockWaitBuckets = DefaultLockWaitBuckets
	}
	if m.opts.LockHoldBuckets == nil {
		m.opts.LockHoldBuckets = DefaultLockHoldBuckets
	}
	el := []string{"election"}
	m.isLeader = prometheus.NewDesc("sovereign_is_leader",
		"1 while this process leads the election (checked against its renew deadline at scrape time), else 0.", el, nil)
	m.term = prometheus.NewDesc("sovereign_term",
		"The fencing term while this process leads the election, else 0 (exact up to 2^53).", el, nil)
	m.leaseLeft = prometheus.NewDesc("sovereign_lease_seconds_left",
		"Seconds until this leader's renew deadline, computed at scrape time; 0 when not leading.", el, nil)
	if m.opts.ClientGoCompat {
		m.masterStatus = prometheus.NewDesc("leader_election_master_status",
			"Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. "+
				"'name' is the string used to identify the lease. Please make sure to group by name.",
			[]string{"name"}, nil)
	}
	m.transitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sovereign_leadership_transitions_total",
		Help: `Leadership transitions of this process: reason "acquired" counts terms begun, the other reasons terms ended.`,
	}, []string{"election", "reason"})
	m.renewFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sovereign_renew_failures_total",
		Help: "Failed lease renewals (each retried until the renew deadline).",
	}, el)
	m.eventsDropped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sovereign_events_dropped_total",
		Help: "Events lost by listeners that fell too far behind.",
	}, el)
	cl := []string{"class"}
	m.lockAcquisitions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sovereign_lock_acquisitions_total",
		Help: `Lock acquisition calls by result: "acquired", "held", "error" or "cancelled".`,
	}, []string{"class", "result"})
	m.lockWait = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sovereign_lock_wait_seconds",
		Help:    "How long the lock acquisition calls that acquired took, waiting included.",
		Buckets: m.opts.LockWaitBuckets,
	}, cl)
	m.lockHold = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sovereign_lock_hold_seconds",
		Help:    "How long locks were held, from acquisition to release.",
		Buckets: m.opts.LockHoldBuckets,
	}, cl)
	m.locksHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "sovereign_locks_held",
		Help: "Locks acquired and not yet released (a lost lock counts until released).",
	}, cl)
	m.locksLost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sovereign_locks_lost_total",
		Help: `Locks lost while held, by reason: "deadline", "lease lost" or "max hold".`,
	}, []string{"class", "reason"})
	m.vecs = []prometheus.Collector{
		m.transitions, m.renewFailures, m.eventsDropped,
		m.lockAcquisitions, m.lockWait, m.lockHold, m.locksHeld, m.locksLost,
	}
	if reg != nil {
		if err := reg.Register(m); err != nil {
			return nil, fmt.Errorf("sovereignprom: register: %w", err)
		}
	}
	return m, nil
}

// Init exports the series of election at zero before its first leadership,
// so that a replica that never led shows sovereign_is_leader 0 rather than
// no series, and counters start from 0. Call it once per election a process
// campaigns in; calling it again does nothing.
func (m *Metrics) Init(election string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stateLocked(election)
}

// Forget removes every series of election, for a process that stops
// campaigning in it for good (per-tenant elections, say). A later call for
// the election exports it again, with counters from 0.
func (m *Metrics) Forget(election string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.elections, election)
	l := prometheus.Labels{"election": election}
	m.transitions.DeletePartialMatch(l)
	m.renewFailures.DeletePartialMatch(l)
	m.eventsDropped.DeletePartialMatch(l)
}

// stateLocked returns the state of election, creating it and its counters
// at zero. It belongs to m.mu.
func (m *Metrics) stateLocked(election string) *electionState {
	st, ok := m.elections[election]
	if !ok {
		st = &electionState{}
		m.elections[election] = st
		m.transitions.WithLabelValues(election, ReasonAcquired)
		for _, r := range lossReasons {
			m.transitions.WithLabelValues(election, r.String())
		}
		m.renewFailures.WithLabelValues(election)
		m.eventsDropped.WithLabelValues(election)
	}
	return st
}

// LeadershipAcquired implements sovereign.Metrics.
func (m *Metrics) LeadershipAcquired(election string, term uint64, deadline time.Time) {
	m.mu.Lock()
	st := m.stateLocked(election)
	st.leading, st.term, st.deadline = true, term, deadline
	m.mu.Unlock()
	m.transitions.WithLabelValues(election, ReasonAcquired).Inc()
}

// LeaseRenewed implements sovereign.Metrics. It moves the deadline of the
// current term; it is ignored when not leading (a renewal that raced with
// a step-down).
func (m *Metrics) LeaseRenewed(election string, deadline time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.stateLocked(election); st.leading && deadline.After(st.deadline) {
		st.deadline = deadline
	}
}

// LeadershipLost implements sovereign.Metrics. The election's gauges turn 0
// unless a later term has been acquired since (by another elector of the
// same election in this process); the transition is counted either way.
func (m *Metrics) LeadershipLost(election string, term uint64, reason sovereign.LossReason) {
	m.mu.Lock()
	if st := m.stateLocked(election); st.term == term {
		*st = electionState{}
	}
	m.mu.Unlock()
	m.transitions.WithLabelValues(election, reason.String()).Inc()
}

// RenewFailed implements sovereign.Metrics.
func (m *Metrics) RenewFailed(election string) {
	m.init(election)
	m.renewFailures.WithLabelValues(election).Inc()
}

// EventsDropped implements sovereign.Metrics.
func (m *Metrics) EventsDropped(election string, count int) {
	m.init(election)
	if count > 0 {
		m.eventsDropped.WithLabelValues(election).Add(float64(count))
	}
}

func (m *Metrics) init(election string) {
	m.mu.Lock()
	m.stateLocked(election)
	m.mu.Unlock()
}

// lockClass creates the series of class at zero, once.
func (m *Metrics) lockClass(class string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lockClasses[class] {
		return
	}
	m.lockClasses[class] = true
	for _, r := range lockResults {
		m.lockAcquisitions.WithLabelValues(class, r)
	}
	for _, r := range lockLossReasons {
		m.locksLost.WithLabelValues(class, r)
	}
	m.lockWait.WithLabelValues(class)
	m.lockHold.WithLabelValues(class)
	m.locksHeld.WithLabelValues(class)
}

// Acquired implements lock.Metrics: it counts the call by result and, when
// it acquired, observes its duration and counts the lock as held.
func (m *Metrics) Acquired(class, result string, wait time.Duration) {
	m.lockClass(class)
	m.lockAcquisitions.WithLabelValues(class, result).Inc()
	if result == "acquired" {
		m.lockWait.WithLabelValues(class).Observe(wait.Seconds())
		m.locksHeld.WithLabelValues(class).Inc()
	}
}

// Released implements lock.Metrics: it observes how long the lock was held
// and no longer counts it as held.
func (m *Metrics) Released(class string, held time.Duration) {
	m.lockClass(class)
	m.lockHold.WithLabelValues(class).Observe(held.Seconds())
	m.locksHeld.WithLabelValues(class).Dec()
}

// Lost implements lock.Metrics.
func (m *Metrics) Lost(class, reason string) {
	m.lockClass(class)
	m.locksLost.WithLabelValues(class, reason).Inc()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.isLeader
	ch <- m.term
	ch <- m.leaseLeft
	if m.masterStatus != nil {
		ch <- m.masterStatus
	}
	for _, v := range m.vecs {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector. The gauges are computed from the
// time of the scrape: past its renew deadline a leader reads as not leading.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	type snap struct {
		election string
		st       electionState
	}
	m.mu.Lock()
	now := time.Now()
	snaps := make([]snap, 0, len(m.elections))
	for name, st := range m.elections {
		snaps = append(snaps, snap{name, *st})
	}
	m.mu.Unlock()
	for _, s := range snaps {
		var leading, term, left float64
		if s.st.leading && now.Before(s.st.deadline) {
			leading, term, left = 1, float64(s.st.term), s.st.deadline.Sub(now).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(m.isLeader, prometheus.GaugeValue, leading, s.election)
		ch <- prometheus.MustNewConstMetric(m.term, prometheus.GaugeValue, term, s.election)
		ch <- prometheus.MustNewConstMetric(m.leaseLeft, prometheus.GaugeValue, left, s.election)
		if m.masterStatus != nil {
			ch <- prometheus.MustNewConstMetric(m.masterStatus, prometheus.GaugeValue, leading, s.election)
		}
	}
	for _, v := range m.vecs {
		v.Collect(ch)
	}
}

// Interface checks.
var (
	_ sovereign.Metrics    = (*Metrics)(nil)
	_ lock.Metrics         = (*Metrics)(nil)
	_ prometheus.Collector = (*Metrics)(nil)
)
