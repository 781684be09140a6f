package sovereignprom_test

import (
	"errors"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	sovereignprom "github.com/sovereign-go/sovereign/contrib/prometheus"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newMetrics returns a Metrics registered with a fresh registry.
func newMetrics(t *testing.T, opts *sovereignprom.Options) (*sovereignprom.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	m, err := sovereignprom.New(reg, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m, reg
}

// scrape gathers reg and returns every sample, keyed by metric name and
// then by its labels rendered as `k="v",k="v"` in label-name order. A
// histogram's value is its sample count; its sum is under name + "_sum".
func scrape(t *testing.T, reg prometheus.Gatherer) map[string]map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := make(map[string]map[string]float64)
	for _, mf := range mfs {
		series := make(map[string]float64)
		sums := make(map[string]float64)
		for _, m := range mf.GetMetric() {
			series[labelString(m)] = sampleValue(mf.GetType(), m)
			if mf.GetType() == dto.MetricType_HISTOGRAM {
				sums[labelString(m)] = m.GetHistogram().GetSampleSum()
			}
		}
		out[mf.GetName()] = series
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			out[mf.GetName()+"_sum"] = sums
		}
	}
	return out
}

func labelString(m *dto.Metric) string {
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+`="`+l.GetValue()+`"`)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func sampleValue(t dto.MetricType, m *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return m.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return m.GetGauge().GetValue()
	case dto.MetricType_HISTOGRAM:
		return float64(m.GetHistogram().GetSampleCount())
	default:
		return math.NaN()
	}
}

// value returns one sample, failing the test when it is absent.
func value(t *testing.T, s map[string]map[string]float64, name, labels string) float64 {
	t.Helper()
	v, ok := s[name][labels]
	if !ok {
		t.Fatalf("no sample %s{%s}; have %v", name, labels, s[name])
	}
	return v
}

func wantValue(t *testing.T, s map[string]map[string]float64, name, labels string, want float64) {
	t.Helper()
	if got := value(t, s, name, labels); got != want {
		t.Errorf("%s{%s}: got %v, want %v", name, labels, got, want)
	}
}

// electorOpts are fast options without jitter: TTL 1 s, renew deadline
// 700 ms, renew interval 200 ms.
func electorOpts(m sovereign.Metrics) *sovereign.Options {
	return &sovereign.Options{
		TTL:             time.Second,
		RenewInterval:   200 * time.Millisecond, // the figures below count on it
		NoStartupJitter: true,
		Logger:          slog.New(slog.DiscardHandler),
		Metrics:         m,
	}
}

// startElector starts candidate "a" of election over cl, with
// electorOpts(m). The caller closes it.
func startElector(t *testing.T, cl backend.Backend, election string, m sovereign.Metrics) *sovereign.Elector {
	t.Helper()
	e, err := sovereign.New(cl, election, "a", electorOpts(m))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Start(t.Context()); err != nil {
		e.Close()
		t.Fatal(err)
	}
	return e
}

const el = `election="jobs"`

// A leader shows is_leader 1, its term, the seconds left to its renew
// deadline (decreasing between scrapes, back up after a renewal) and one
// "acquired" transition; a follower of the same store, with Init, shows 0.
func TestLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t, nil)
		store := memorybackend.NewStore()
		cl := store.Client()
		defer cl.Close()
		e := startElector(t, cl, "jobs", m)
		defer e.Close()
		synctest.Wait()
		if !e.IsLeader() {
			t.Fatal("the only candidate does not lead")
		}
		s := scrape(t, reg)
		wantValue(t, s, "sovereign_is_leader", el, 1)
		wantValue(t, s, "sovereign_term", el, float64(e.Term()))
		if e.Term() == 0 {
			t.Error("Term: got 0 while leading")
		}
		// Acquired just now, in the bubble's time: the full renew deadline.
		wantValue(t, s, "sovereign_lease_seconds_left", el, 0.7)
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="acquired"`, 1)
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="renew deadline passed"`, 0)
		wantValue(t, s, "sovereign_renew_failures_total", el, 0)
		wantValue(t, s, "sovereign_events_dropped_total", el, 0)
		if _, ok := s["leader_election_master_status"]; ok {
			t.Error("leader_election_master_status exported without ClientGoCompat")
		}

		time.Sleep(100 * time.Millisecond) // before the first renewal (at 200 ms)
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_lease_seconds_left", el, 0.6)

		time.Sleep(150 * time.Millisecond) // renewed at 200 ms: deadline 900 ms
		s = scrape(t, reg)
		if got := value(t, s, "sovereign_lease_seconds_left", el); math.Abs(got-0.65) > 1e-9 {
			t.Errorf("lease_seconds_left 50 ms after a renewal: got %v, want 0.65", got)
		}
		wantValue(t, s, "sovereign_is_leader", el, 1)
	})
}

// A partitioned leader counts its failed renewals, and at its renew deadline
// reads is_leader 0, term 0, no seconds left, with one "renew deadline
// passed" transition; the client-go gauge follows.
func TestPartitionedLeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t, &sovereignprom.Options{ClientGoCompat: true})
		store := memorybackend.NewStore()
		cl := store.Client()
		defer cl.Close()
		e := startElector(t, cl, "jobs", m)
		defer e.Close()
		synctest.Wait()
		wantValue(t, scrape(t, reg), "leader_election_master_status", `name="jobs"`, 1)

		cl.Partition()
		// The deadline is 700 ms after the acquisition; the first renewal
		// (200 ms) and its retries every 50 ms fail.
		time.Sleep(500 * time.Millisecond)
		s := scrape(t, reg)
		wantValue(t, s, "sovereign_is_leader", el, 1)
		failures := value(t, s, "sovereign_renew_failures_total", el)
		if failures < 2 {
			t.Errorf("renew_failures_total 300 ms into a partition: got %v, want at least 2", failures)
		}
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="renew deadline passed"`, 0)

		time.Sleep(300 * time.Millisecond) // past the deadline (700 ms)
		synctest.Wait()
		if e.IsLeader() {
			t.Fatal("a partitioned leader leads past its renew deadline")
		}
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_is_leader", el, 0)
		wantValue(t, s, "sovereign_term", el, 0)
		wantValue(t, s, "sovereign_lease_seconds_left", el, 0)
		wantValue(t, s, "leader_election_master_status", `name="jobs"`, 0)
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="renew deadline passed"`, 1)
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="acquired"`, 1)
		if got := value(t, s, "sovereign_renew_failures_total", el); got <= failures {
			t.Errorf("renew_failures_total: got %v at the deadline, want more than %v", got, failures)
		}
	})
}

// is_leader is checked against the deadline at scrape time: a leader whose
// deadline passed reads 0 even if nothing told the Metrics it stepped down.
func TestScrapeTimeDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t, &sovereignprom.Options{ClientGoCompat: true})
		m.LeadershipAcquired("jobs", 7, time.Now().Add(time.Second))
		time.Sleep(999 * time.Millisecond)
		s := scrape(t, reg)
		wantValue(t, s, "sovereign_is_leader", el, 1)
		wantValue(t, s, "leader_election_master_status", `name="jobs"`, 1)
		time.Sleep(time.Millisecond)
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_is_leader", el, 0)
		wantValue(t, s, "sovereign_term", el, 0)
		wantValue(t, s, "sovereign_lease_seconds_left", el, 0)
		wantValue(t, s, "leader_election_master_status", `name="jobs"`, 0)
	})
}

// Each reason of LeadershipLost is its own series, by LossReason.String; a
// resigning leader's client-go gauge turns 0.
func TestResignAndClientGoCompat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t, &sovereignprom.Options{ClientGoCompat: true})
		store := memorybackend.NewStore()
		ca, cb := store.Client(), store.Client()
		defer ca.Close()
		defer cb.Close()
		a, err := sovereign.New(ca, "jobs", "a", electorOpts(m))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		// b reports to its own Metrics: one process per replica.
		mb, regb := newMetrics(t, &sovereignprom.Options{ClientGoCompat: true})
		b, err := sovereign.New(cb, "jobs", "b", electorOpts(mb))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		mb.Init("jobs")
		if err := a.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if err := b.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		wantValue(t, scrape(t, reg), "leader_election_master_status", `name="jobs"`, 1)
		wantValue(t, scrape(t, regb), "leader_election_master_status", `name="jobs"`, 0)
		wantValue(t, scrape(t, regb), "sovereign_is_leader", el, 0)
		termA := a.Term()

		if err := a.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if !b.IsLeader() {
			t.Fatal("b does not lead after a resigned")
		}
		s := scrape(t, reg)
		wantValue(t, s, "leader_election_master_status", `name="jobs"`, 0)
		wantValue(t, s, "sovereign_is_leader", el, 0)
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="resigned"`, 1)
		sb := scrape(t, regb)
		wantValue(t, sb, "leader_election_master_status", `name="jobs"`, 1)
		wantValue(t, sb, "sovereign_is_leader", el, 1)
		wantValue(t, sb, "sovereign_term", el, float64(b.Term()))
		if b.Term() <= termA {
			t.Errorf("b's term: got %d, want above a's %d", b.Term(), termA)
		}
	})
}

// Without Init a replica that never led exports no gauges; with it, zeros,
// and every counter starts at 0 for every known reason.
func TestInit(t *testing.T) {
	m, reg := newMetrics(t, nil)
	if s := scrape(t, reg); len(s["sovereign_is_leader"]) != 0 {
		t.Fatalf("is_leader before Init: got %v, want no series", s["sovereign_is_leader"])
	}
	m.Init("jobs")
	m.Init("jobs")
	s := scrape(t, reg)
	wantValue(t, s, "sovereign_is_leader", el, 0)
	wantValue(t, s, "sovereign_term", el, 0)
	wantValue(t, s, "sovereign_lease_seconds_left", el, 0)
	wantValue(t, s, "sovereign_renew_failures_total", el, 0)
	wantValue(t, s, "sovereign_events_dropped_total", el, 0)
	for _, r := range []sovereign.LossReason{sovereign.ReasonResigned, sovereign.ReasonClosed,
		sovereign.ReasonReturned, sovereign.ReasonDeadline, sovereign.ReasonLeaseLost} {
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="`+r.String()+`"`, 0)
	}
	wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="acquired"`, 0)
}

// The hooks called directly: terms of Redis magnitude are exact, a loss of
// an older term (another elector of the same election in this process) does
// not clear a newer one, renewals after a step-down are ignored, counters
// add up, and Forget removes an election's series.
func TestHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t, nil)
		const redisTerm = 1_763_000_000_000_123 // microseconds since 1970, ~1.7e15
		dl := time.Now().Add(5 * time.Second)
		m.LeadershipAcquired("jobs", redisTerm, dl)
		s := scrape(t, reg)
		if got := value(t, s, "sovereign_term", el); uint64(got) != redisTerm {
			t.Errorf("term: got %d, want %d", uint64(got), uint64(redisTerm))
		}

		m.LeadershipAcquired("jobs", redisTerm+1, dl)
		m.LeadershipLost("jobs", redisTerm, sovereign.ReasonLeaseLost)
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_is_leader", el, 1)
		if got := value(t, s, "sovereign_term", el); uint64(got) != redisTerm+1 {
			t.Errorf("term after the loss of an older term: got %d, want %d", uint64(got), uint64(redisTerm+1))
		}
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="lease lost"`, 1)
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="acquired"`, 2)

		m.LeaseRenewed("jobs", dl.Add(time.Second))
		wantValue(t, scrape(t, reg), "sovereign_lease_seconds_left", el, 6)
		m.LeaseRenewed("jobs", dl) // an earlier deadline never moves it back
		wantValue(t, scrape(t, reg), "sovereign_lease_seconds_left", el, 6)

		m.LeadershipLost("jobs", redisTerm+1, sovereign.ReasonClosed)
		m.LeaseRenewed("jobs", dl.Add(time.Minute)) // raced with the step-down
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_is_leader", el, 0)
		wantValue(t, s, "sovereign_lease_seconds_left", el, 0)
		wantValue(t, s, "sovereign_leadership_transitions_total", el+`,reason="closed"`, 1)

		m.RenewFailed("jobs")
		m.RenewFailed("jobs")
		m.EventsDropped("jobs", 3)
		m.EventsDropped("other", 1)
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_renew_failures_total", el, 2)
		wantValue(t, s, "sovereign_events_dropped_total", el, 3)
		wantValue(t, s, "sovereign_events_dropped_total", `election="other"`, 1)
		wantValue(t, s, "sovereign_is_leader", `election="other"`, 0)

		m.Forget("jobs")
		s = scrape(t, reg)
		for name, series := range s {
			for labels := range series {
				if strings.Contains(labels, el) {
					t.Errorf("%s{%s} still exported after Forget", name, labels)
				}
			}
		}
		wantValue(t, s, "sovereign_events_dropped_total", `election="other"`, 1)
	})
}

// One Metrics serves electors of several elections, each with its series.
func TestSeveralElections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t, nil)
		store := memorybackend.NewStore()
		var electors []*sovereign.Elector
		for _, name := range []string{"jobs", "billing"} {
			cl := store.Client()
			defer cl.Close()
			e := startElector(t, cl, name, m)
			defer e.Close()
			electors = append(electors, e)
		}
		synctest.Wait()
		s := scrape(t, reg)
		for i, name := range []string{"jobs", "billing"} {
			l := `election="` + name + `"`
			wantValue(t, s, "sovereign_is_leader", l, 1)
			wantValue(t, s, "sovereign_term", l, float64(electors[i].Term()))
		}
		if electors[0].Term() == electors[1].Term() {
			t.Fatal("the two elections got the same term; the test cannot tell their series apart")
		}
		electors[1].Close()
		synctest.Wait()
		s = scrape(t, reg)
		wantValue(t, s, "sovereign_is_leader", `election="jobs"`, 1)
		wantValue(t, s, "sovereign_is_leader", `election="billing"`, 0)
		wantValue(t, s, "sovereign_leadership_transitions_total", `election="billing",reason="closed"`, 1)
	})
}

// allowedLabels are the only label names the package exports: bounded
// values, never a lock key or an instance ID.
var allowedLabels = []string{"election", "reason", "name", "class", "result", "le"}

// No series carries a label outside allowedLabels, whatever was recorded.
func TestLabelsBounded(t *testing.T) {
	m, reg := newMetrics(t, &sovereignprom.Options{ClientGoCompat: true})
	m.LeadershipAcquired("jobs", 1, time.Now().Add(time.Minute))
	m.LeaseRenewed("jobs", time.Now().Add(time.Minute))
	m.RenewFailed("jobs")
	m.EventsDropped("jobs", 1)
	m.LeadershipLost("jobs", 1, sovereign.ReasonDeadline)
	m.Acquired("tally", "acquired", time.Second)
	m.Lost("tally", "deadline")
	m.Released("tally", time.Minute)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "sovereign_") && mf.GetName() != "leader_election_master_status" {
			t.Errorf("unexpected metric %s", mf.GetName())
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if !slices.Contains(allowedLabels, l.GetName()) {
					t.Errorf("%s has label %s=%q; want only %v", mf.GetName(), l.GetName(), l.GetValue(), allowedLabels)
				}
			}
		}
	}
}

// The exposition: names, types and help, checked by the text format and the
// pedantic registry's consistency checks.
func TestExposition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reg := newMetrics(t, nil)
		m.LeadershipAcquired("jobs", 3, time.Now().Add(2500*time.Millisecond))
		m.RenewFailed("jobs")
		want := `
# HELP sovereign_is_leader 1 while this process leads the election (checked against its renew deadline at scrape time), else 0.
# TYPE sovereign_is_leader gauge
sovereign_is_leader{election="jobs"} 1
# HELP sovereign_lease_seconds_left Seconds until this leader's renew deadline, computed at scrape time; 0 when not leading.
# TYPE sovereign_lease_seconds_left gauge
sovereign_lease_seconds_left{election="jobs"} 2.5
# HELP sovereign_renew_failures_total Failed lease renewals (each retried until the renew deadline).
# TYPE sovereign_renew_failures_total counter
sovereign_renew_failures_total{election="jobs"} 1
# HELP sovereign_term The fencing term while this process leads the election, else 0 (exact up to 2^53).
# TYPE sovereign_term gauge
sovereign_term{election="jobs"} 3
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
			"sovereign_is_leader", "sovereign_term", "sovereign_lease_seconds_left", "sovereign_renew_failures_total"); err != nil {
			t.Error(err)
		}
		if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
			t.Errorf("lint: %v %v", problems, err)
		}
	})
}

// Registering twice with one registry fails with AlreadyRegisteredError; a
// nil registerer registers nothing.
func TestNewRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := sovereignprom.New(reg, nil); err != nil {
		t.Fatal(err)
	}
	_, err := sovereignprom.New(reg, nil)
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Errorf("second New on one registry: got %v, want an AlreadyRegisteredError", err)
	}
	m, err := sovereignprom.New(nil, &sovereignprom.Options{ClientGoCompat: true})
	if err != nil {
		t.Fatal(err)
	}
	other := prometheus.NewRegistry()
	if err := other.Register(m); err != nil {
		t.Fatalf("registering a Metrics made with a nil registerer: %v", err)
	}
	m.Init("jobs")
	if got := testutil.CollectAndCount(m, "leader_election_master_status"); got != 1 {
		t.Errorf("leader_election_master_status series: got %d, want 1", got)
	}
}

// Hooks called from many goroutines while scrapes run lose no count (and
// the race detector sees no race).
func TestConcurrentHooks(t *testing.T) {
	m, reg := newMetrics(t, &sovereignprom.Options{ClientGoCompat: true})
	const workers, rounds = 8, 200
	done := make(chan struct{})
	scraped := make(chan struct{})
	go func() {
		defer close(scraped)
		for {
			select {
			case <-done:
				return
			default:
				if _, err := reg.Gather(); err != nil {
					t.Errorf("Gather: %v", err)
					return
				}
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			election := []string{"a", "b"}[w%2]
			for i := range rounds {
				term := uint64(w*rounds + i + 1)
				m.LeadershipAcquired(election, term, time.Now().Add(time.Minute))
				m.LeaseRenewed(election, time.Now().Add(2*time.Minute))
				m.RenewFailed(election)
				m.EventsDropped(election, 1)
				m.LeadershipLost(election, term, sovereign.ReasonResigned)
				m.Acquired("tally", "acquired", time.Millisecond)
				m.Lost("tally", "deadline")
				m.Released("tally", time.Second)
			}
		})
	}
	wg.Wait()
	close(done)
	<-scraped
	s := scrape(t, reg)
	per := float64(workers / 2 * rounds)
	for _, e := range []string{`election="a"`, `election="b"`} {
		wantValue(t, s, "sovereign_leadership_transitions_total", e+`,reason="acquired"`, per)
		wantValue(t, s, "sovereign_leadership_transitions_total", e+`,reason="resigned"`, per)
		wantValue(t, s, "sovereign_renew_failures_total", e, per)
		wantValue(t, s, "sovereign_events_dropped_total", e, per)
		wantValue(t, s, "sovereign_is_leader", e, 0) // every term acquired was lost
	}
	wantValue(t, s, "sovereign_lock_acquisitions_total", tally+`,result="acquired"`, workers*rounds)
	wantValue(t, s, "sovereign_locks_lost_total", tally+`,reason="deadline"`, workers*rounds)
	wantValue(t, s, "sovereign_locks_held", tally, 0)
	wantValue(t, s, "sovereign_lock_hold_seconds", tally, workers*rounds)
}
