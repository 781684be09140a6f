package electortest

import (
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeTB records failures instead of failing the test. Fatalf panics with
// errFatal, which run recovers.
type fakeTB struct {
	testing.TB
	errs []string
}

type fatal struct{}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	panic(fatal{})
}

// run calls fn with f and reports whether fn ended by Fatalf.
func (f *fakeTB) run(fn func(tb testing.TB)) (fataled bool) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(fatal); !ok {
				panic(r)
			}
			fataled = true
		}
	}()
	fn(f)
	return false
}

func TestCheckNoOverlap(t *testing.T) {
	at := func(ms int) time.Time {
		return time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(ms) * time.Millisecond)
	}
	iv := func(id string, term uint64, start, end int) Interval {
		v := Interval{ID: id, Term: term, Start: at(start)}
		if end >= 0 {
			v.End = at(end)
		}
		return v
	}
	tests := []struct {
		name string
		ivs  []Interval
		want []string // substrings of the errors, in order
	}{
		{"none", nil, nil},
		{"one still leading", []Interval{iv("a", 1, 0, -1)}, nil},
		{"hand-over at the same instant", []Interval{iv("a", 1, 0, 10), iv("b", 2, 10, 20), iv("a", 3, 30, -1)}, nil},
		{"out of order input", []Interval{iv("b", 2, 10, 20), iv("a", 1, 0, 10)}, nil},
		{"overlap", []Interval{iv("a", 1, 0, 10), iv("b", 2, 5, 20)},
			[]string{"term 2 of b began at 00:00:00.005 while term 1 of a (00:00:00.000..00:00:00.010) still led"}},
		{"overlap with a term still led", []Interval{iv("a", 1, 0, -1), iv("b", 2, 50, 60)},
			[]string{"term 2 of b began at 00:00:00.050 while term 1 of a (00:00:00.000..now) still led"}},
		{"overlap beyond the next term", []Interval{iv("a", 1, 0, 100), iv("b", 2, 10, 20), iv("c", 3, 30, 40)},
			[]string{"term 2 of b began", "term 3 of c began"}},
		{"same term", []Interval{iv("a", 4, 0, 10), iv("b", 4, 10, 20)},
			[]string{"term 4 of b began after term 4 of a: got no increase"}},
		{"lower term later", []Interval{iv("a", 5, 0, 10), iv("b", 3, 20, 30)},
			[]string{"term 3 of b began after term 5 of a: got no increase"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeTB{}
			CheckNoOverlap(f, tt.ivs)
			if len(f.errs) != len(tt.want) {
				t.Fatalf("errors: got %q, want %d matching %q", f.errs, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(f.errs[i], w) {
					t.Errorf("error %d: got %q, want it to contain %q", i, f.errs[i], w)
				}
			}
		})
	}
}

func TestEventually(t *testing.T) {
	calls := 0
	Eventually(t, "third call", func() bool { calls++; return calls == 3 })
	if calls != 3 {
		t.Errorf("calls: got %d, want 3", calls)
	}
	f := &fakeTB{}
	start := time.Now()
	if !f.run(func(tb testing.TB) { eventuallyWithin(tb, "never", 50*time.Millisecond, func() bool { return false }) }) {
		t.Fatal("a condition that never holds: got no Fatalf, want one")
	}
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("gave up after %v, want at least the bound 50ms", d)
	}
	if want := "never: not reached within 50ms"; len(f.errs) != 1 || f.errs[0] != want {
		t.Errorf("errors: got %q, want [%q]", f.errs, want)
	}
}

// cand is a Candidate for WaitLeader.
type cand struct{ e *sovereign.Elector }

func (c *cand) Elector() *sovereign.Elector { return c.e }

// newElector returns an elector of election name on a client of store,
// closed when the test ends.
func newElector(t *testing.T, store *memorybackend.Store, name, id string) *sovereign.Elector {
	t.Helper()
	cl := store.Client()
	e, err := sovereign.New(cl, name, id, &sovereign.Options{TTL: time.Second, NoStartupJitter: true, Logger: Logger()})
	if err != nil {
		t.Fatalf("sovereign.New: %v", err)
	}
	t.Cleanup(func() {
		e.Close()
		cl.Close()
	})
	return e
}

// TestRecorderAttach records, from events in virtual time, a term that ends
// by Resign and the term of the other elector that follows.
func TestRecorderAttach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		var rec Recorder
		es := []*sovereign.Elector{newElector(t, store, "election", "a"), newElector(t, store, "election", "b")}
		for _, e := range es {
			rec.Attach(e)
			if err := e.Start(t.Context()); err != nil {
				t.Fatalf("Start: %v", err)
			}
		}
		for len(Leaders(es...)) == 0 {
			time.Sleep(time.Millisecond)
		}
		old := Leaders(es...)[0]
		oldTerm := old.Term()
		time.Sleep(time.Second)
		if err := old.Resign(t.Context()); err != nil {
			t.Fatalf("Resign: %v", err)
		}
		for ls := Leaders(es...); len(ls) == 0 || ls[0] == old; ls = Leaders(es...) {
			time.Sleep(time.Millisecond)
		}
		synctest.Wait()
		ivs := rec.Intervals()
		if len(ivs) != 2 {
			t.Fatalf("intervals: got %+v, want 2", ivs)
		}
		if ivs[0].ID != old.ID() || ivs[0].Term != oldTerm || ivs[0].Reason != sovereign.ReasonResigned {
			t.Errorf("first interval: got %+v, want %s's term %d, resigned", ivs[0], old.ID(), oldTerm)
		}
		if d := ivs[0].End.Sub(ivs[0].Start); d < time.Second {
			t.Errorf("first term lasted %v, want at least 1s", d)
		}
		if ivs[1].ID == old.ID() || !ivs[1].End.IsZero() || ivs[1].Start.Before(ivs[0].End) {
			t.Errorf("second interval: got %+v, want the other elector's, still led, after %v", ivs[1], ivs[0].End)
		}
		CheckNoOverlap(t, ivs)
		f := &fakeTB{}
		CheckNoOverlap(f, append(ivs, Interval{ID: old.ID(), Term: ivs[1].Term + 1, Start: ivs[1].Start.Add(time.Millisecond)}))
		if len(f.errs) != 1 {
			t.Errorf("a third term while the second is led: got errors %q, want 1", f.errs)
		}
		var acquired int
		for _, ev := range rec.Events() {
			if _, ok := ev.Event.(sovereign.LeadershipAcquired); ok {
				acquired++
			}
			if ev.ID != "a" && ev.ID != "b" {
				t.Errorf("event of %q, want a or b", ev.ID)
			}
		}
		if acquired != 2 {
			t.Errorf("LeadershipAcquired events: got %d, want 2", acquired)
		}
	})
}

// TestRecorderCampaign records terms from the leader function in real time,
// and WaitLeader, Started and Ended find them.
func TestRecorderCampaign(t *testing.T) {
	store := memorybackend.NewStore()
	var rec Recorder
	var cands []*cand
	var stops []func()
	for _, id := range []string{"a", "b"} {
		c := &cand{newElector(t, store, "election", id)}
		cands = append(cands, c)
		stops = append(stops, rec.Campaign(t, c.e))
	}
	old := WaitLeader(t, nil, cands)
	oldTerm := old.e.Term()
	if got := rec.Started(t, old.e.ID(), oldTerm); !got.End.IsZero() {
		t.Errorf("started term: got %+v, want it still led", got)
	}
	if err := old.e.Resign(t.Context()); err != nil {
		t.Fatalf("Resign: %v", err)
	}
	next := WaitLeader(t, old, cands)
	ended := rec.Ended(t, old.e.ID(), oldTerm)
	started := rec.Started(t, next.e.ID(), next.e.Term())
	if started.Start.Before(ended.End) {
		t.Errorf("next term began at %v, want after the old ended at %v", started.Start, ended.End)
	}
	if next.e.Term() <= oldTerm {
		t.Errorf("term after hand-over: got %d, want > %d", next.e.Term(), oldTerm)
	}
	for _, stop := range stops {
		stop()
	}
	ivs := rec.Intervals()
	if len(ivs) < 2 {
		t.Fatalf("intervals: got %+v, want at least 2", ivs)
	}
	for _, iv := range ivs {
		if iv.End.IsZero() {
			t.Errorf("interval %+v still open after stop, want ended", iv)
		}
	}
	CheckNoOverlap(t, ivs)
}

// TestWaitLeaderTwoLeaders: two electors of different elections both lead,
// which WaitLeader reports at once.
func TestWaitLeaderTwoLeaders(t *testing.T) {
	store := memorybackend.NewStore()
	var rec Recorder
	var cands []*cand
	for _, name := range []string{"one", "two"} {
		c := &cand{newElector(t, store, name, "a-"+name)}
		cands = append(cands, c)
		rec.Campaign(t, c.e)
	}
	Eventually(t, "both lead", func() bool { return len(Leaders(cands[0].e, cands[1].e)) == 2 })
	f := &fakeTB{}
	if !f.run(func(tb testing.TB) { WaitLeader(tb, nil, cands) }) {
		t.Fatal("two leaders at once: got no Fatalf, want one")
	}
	if want := "a-one and a-two lead at once"; len(f.errs) != 1 || f.errs[0] != want {
		t.Errorf("errors: got %q, want [%q]", f.errs, want)
	}
}
