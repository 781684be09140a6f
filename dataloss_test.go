package sovereign_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// latency is the one-way delay of every call in the data-loss tests, so that
// the window between a follower's acquisition and the old leader's failed
// renewal has a length to measure.
const latency = 2 * time.Millisecond

// TestRestartWithoutPersistence restarts the store four times, losing every
// lease and heartbeat record (terms kept, as Redis keeps them through its
// server clock). Each restart must cause exactly one new leadership (no
// cascade), an overlap only inside the documented data-loss window (the old
// leader renews at once when its watch breaks, so the window is about one
// round trip), and strictly increasing terms.
func TestRestartWithoutPersistence(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d candidates", n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := newCluster(t, n, fastOpts())
				for _, cl := range c.clients {
					cl.SetLatency(latency)
				}
				c.start(t)
				c.leader(t, 2*time.Second)
				const restarts = 4
				var at []time.Time
				for range restarts {
					time.Sleep(1500 * time.Millisecond)
					at = append(at, time.Now())
					c.store.Restart(nil)
					// A leader again within TTL + 1 s of the store being back.
					c.leader(t, 2*time.Second)
				}
				time.Sleep(time.Second)
				synctest.Wait()
				ivs := c.rec.Intervals()
				checkDataLoss(t, ivs, at, dataLossWindow)
				if got, want := len(ivs), 1+restarts; got != want {
					t.Errorf("leadership terms: got %d, want %d (one first term and one per restart, no cascade): %v", got, want, ivs)
				}
			})
		})
	}
}

// dataLossWindow bounds an overlap after a restart that lost the leader's
// lease: a follower's acquisition and the old leader's renewal both start
// when their watches break; the old leader steps down when its renewal's
// answer (ErrLeaseLost) arrives, one round trip later.
const dataLossWindow = 2*latency + time.Millisecond

// checkDataLoss fails t unless every overlap of two intervals begins within
// window of a restart in at and lasts at most window, and terms strictly
// increase in order of start.
func checkDataLoss(t *testing.T, ivs []electortest.Interval, at []time.Time, window time.Duration) {
	t.Helper()
	ivs = slices.Clone(ivs)
	slices.SortStableFunc(ivs, func(a, b electortest.Interval) int { return a.Start.Compare(b.Start) })
	for i, a := range ivs {
		if i > 0 && a.Term <= ivs[i-1].Term {
			t.Errorf("term %d of %s began after term %d: want a higher term", a.Term, a.ID, ivs[i-1].Term)
		}
		for _, b := range ivs[i+1:] {
			if !a.End.IsZero() && !b.Start.Before(a.End) {
				continue
			}
			if a.End.IsZero() {
				t.Errorf("term %d of %s began while term %d of %s never ended", b.Term, b.ID, a.Term, a.ID)
				continue
			}
			overlap := a.End.Sub(b.Start)
			near := slices.ContainsFunc(at, func(r time.Time) bool {
				return !b.Start.Before(r) && b.Start.Sub(r) <= window
			})
			if !near || overlap > window {
				t.Errorf("term %d of %s overlapped term %d of %s by %v, starting %v after the nearest restart: want only overlaps within %v of a restart",
					b.Term, b.ID, a.Term, a.ID, overlap, sinceNearest(b.Start, at), window)
			} else {
				t.Logf("data-loss overlap: term %d of %s and term %d of %s overlapped by %v", a.Term, a.ID, b.Term, b.ID, overlap)
			}
		}
	}
}

func sinceNearest(tm time.Time, at []time.Time) time.Duration {
	best := time.Duration(-1)
	for _, r := range at {
		if d := tm.Sub(r); d >= 0 && (best < 0 || d < best) {
			best = d
		}
	}
	return best
}

// TestSameIDInstanceStopping: two instances configured with the same ID
// share one heartbeat record; when the one that does not lead stops, its
// RemoveMember deletes that record. The leader keeps its lease, and a third
// instance never takes it over.
func TestSameIDInstanceStopping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		rec := &electortest.Recorder{}
		o := fastOpts()
		var es []*sovereign.Elector
		var cls []*memorybackend.Backend
		for _, id := range []string{"twin", "twin", "other"} {
			cl := store.Client()
			e, err := sovereign.New(cl, "election", id, o)
			if err != nil {
				t.Fatal(err)
			}
			rec.Attach(e)
			es, cls = append(es, e), append(cls, cl)
		}
		defer func() {
			for i, e := range es {
				e.Close()
				cls[i].Close()
			}
		}()
		if err := es[0].Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if !es[0].IsLeader() {
			t.Fatal("the first twin does not lead")
		}
		term := es[0].Term()
		for _, e := range es[1:] {
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(3 * time.Second)
		es[1].Close() // removes the twins' shared heartbeat record
		if ms, _ := cls[2].Members(t.Context(), "election"); slices.ContainsFunc(ms, func(m backend.Member) bool { return m.ID == "twin" }) {
			t.Log("the leading twin re-heartbeated before the check; fine")
		}
		for range 20_000 { // 20 s, many heartbeat TTLs
			time.Sleep(time.Millisecond)
			if !es[0].IsLeader() || es[0].Term() != term || es[2].IsLeader() {
				t.Fatalf("after the other twin stopped: leader twin IsLeader %v term %d, other IsLeader %v; want the twin leading term %d throughout",
					es[0].IsLeader(), es[0].Term(), es[2].IsLeader(), term)
			}
		}
		electortest.CheckNoOverlap(t, rec.Intervals())
	})
}

// TestDeletedHeartbeatRecord: an operator deletes the leader's heartbeat
// record by hand. Nobody takes the lease over, and the leader's next
// heartbeat writes the record again.
func TestDeletedHeartbeatRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 3, fastOpts())
		c.start(t)
		li := c.leader(t, 2*time.Second)
		leader := c.es[li]
		term := leader.Term()
		raw := c.store.Client()
		defer raw.Close()
		if err := raw.RemoveMember(context.Background(), "election", leader.ID()); err != nil {
			t.Fatal(err)
		}
		for range 10_000 {
			time.Sleep(time.Millisecond)
			if ls := electortest.Leaders(c.es...); len(ls) != 1 || ls[0] != leader || leader.Term() != term {
				t.Fatalf("after the record was deleted: leaders %d, want %s alone with term %d", len(ls), leader.ID(), term)
			}
		}
		ms, err := raw.Members(context.Background(), "election")
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(ms, func(m backend.Member) bool { return m.ID == leader.ID() }) {
			t.Errorf("members %v: want the leader's record written again by its next heartbeat", ms)
		}
		electortest.CheckNoOverlap(t, c.rec.Intervals())
	})
}

// The leader context's cause is ErrLeadershipLost for every way a term ends,
// Close and the end of Run's context included, and the LeadershipLost
// event's reason is the one that came first.
func TestLeaderContextCauseOnClose(t *testing.T) {
	for _, how := range []string{"Close", "Run's context", "Resign"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				cl := store.Client()
				defer cl.Close()
				e, err := sovereign.New(cl, "election", "a", fastOpts())
				if err != nil {
					t.Fatal(err)
				}
				var lost []sovereign.LeadershipLost
				e.Subscribe(func(ev sovereign.Event) {
					if l, ok := ev.(sovereign.LeadershipLost); ok {
						lost = append(lost, l)
					}
				})
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				causes := make(chan error, 1)
				led := make(chan struct{})
				done := make(chan error, 1)
				go func() {
					done <- e.Run(ctx, func(lctx context.Context) error {
						close(led)
						<-lctx.Done()
						causes <- context.Cause(lctx)
						return nil
					})
				}()
				<-led
				want := sovereign.ReasonClosed
				switch how {
				case "Close":
					e.Close()
				case "Run's context":
					cancel()
				case "Resign":
					want = sovereign.ReasonResigned
					if err := e.Resign(t.Context()); err != nil {
						t.Fatal(err)
					}
					cancel()
				}
				if cause := <-causes; !errors.Is(cause, sovereign.ErrLeadershipLost) || errors.Is(cause, context.Canceled) {
					t.Errorf("leader context cause: got %v, want ErrLeadershipLost (not context.Canceled)", cause)
				}
				<-done
				e.Close()
				synctest.Wait()
				if len(lost) != 1 || lost[0].Reason != want {
					t.Errorf("LeadershipLost events: got %+v, want one with reason %v", lost, want)
				}
			})
		})
	}
}

// When the renew deadline has passed and the elector is then closed, the
// reason is the deadline, whatever order the elector notices them in.
func TestLossReasonIsTheFirstCause(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			cl := store.Client()
			defer cl.Close()
			e, err := sovereign.New(cl, "election", "a", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			var lost []sovereign.LeadershipLost
			e.Subscribe(func(ev sovereign.Event) {
				if l, ok := ev.(sovereign.LeadershipLost); ok {
					lost = append(lost, l)
				}
			})
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if err := e.Start(ctx); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
			cl.Hang()
			time.Sleep(700 * time.Millisecond) // past the deadline: both ready at once
			cancel()
			cl.Heal()
			e.Close()
			synctest.Wait()
			if len(lost) != 1 || lost[0].Reason != sovereign.ReasonDeadline {
				t.Fatalf("LeadershipLost events: got %+v, want one with reason %v", lost, sovereign.ReasonDeadline)
			}
		})
	}
}
