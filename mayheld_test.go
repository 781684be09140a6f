package sovereign_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// A candidate refused because the store may have lost a lease (MayBeHeld)
// has no holder whose release or expiry its watch would bring: it attempts
// again when the refusal ends, not at its rare look while watching (ten
// TTLs), and without polling meanwhile. Here it follows a holder with its
// watch up; the holder releases at 2 s, and the store refuses the free key
// from then until 5 s.
func TestCandidateRetriesWhenARefusalEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		other, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cl := store.Client()
		defer cl.Close()
		start := time.Now()
		const released, refused = 2 * time.Second, 5 * time.Second
		b := electortest.NewRefusing(cl, start.Add(released), start.Add(refused))
		e, err := sovereign.New(b, "election", "e1", &sovereign.Options{TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		led := make(chan time.Time, 1)
		e.Subscribe(func(ev sovereign.Event) {
			if _, ok := ev.(sovereign.LeadershipAcquired); ok {
				select {
				case led <- time.Now():
				default:
				}
			}
		})
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		time.Sleep(released)
		if err := raw.Release(t.Context(), other); err != nil {
			t.Fatal(err)
		}
		var at time.Time
		select {
		case at = <-led:
		case <-time.After(time.Minute):
			t.Fatal("no leadership within a minute of virtual time")
		}
		if took := at.Sub(start); took < refused || took > refused+100*time.Millisecond {
			t.Errorf("led %v after start, want when the refusal ended (%v, within 100 ms)", took, refused)
		}
		if n := b.Attempts.Load(); n > 4 {
			t.Errorf("%d attempts, want at most 4: the first (held), the one woken by the release (refused), the one when the refusal ended, and a spare", n)
		}
	})
}

// With a store that refuses free keys after a restart (RestartOptions.Guard,
// as redisbackend's RestartGuard), a restart that loses the leader's lease
// costs no failover: the old leader finds its lease gone before its
// deadline, so nobody else can have held the key since, and its next
// attempt says so (AcquireRequest.Reclaim), which the store lets through.
// The followers are refused (or wait out the data loss) and never lead
// beside it.
func TestOldLeaderReclaimsThroughTheGuard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := fastOpts()
		c := newCluster(t, 3, o)
		c.start(t)
		old := c.leader(t, 2*time.Second)
		// Between two renewals (every 500 ms from the acquisition): a
		// restart at a renewal instant lets the renewal find the lease
		// gone before the reset is delivered, and the reset, arriving
		// during the reclaim, makes the old leader give the reclaim up
		// and wait a TTL (safe, but the failover this test is about does
		// not happen).
		time.Sleep(450 * time.Millisecond)
		restart := time.Now()
		c.store.Restart(&memorybackend.RestartOptions{Guard: o.TTL})
		for time.Since(restart) < 2*o.TTL {
			time.Sleep(time.Millisecond)
			ls := electortest.Leaders(c.es...)
			if len(ls) > 1 {
				t.Fatalf("%v after the restart: %d lead at once", time.Since(restart), len(ls))
			}
			if len(ls) == 1 && ls[0] != c.es[old] {
				t.Fatalf("%s led %v after the restart, want the old leader %s to take its key again", ls[0].ID(), time.Since(restart), c.es[old].ID())
			}
		}
		synctest.Wait()
		ivs := c.rec.Intervals()
		electortest.CheckNoOverlap(t, ivs)
		if len(ivs) != 2 {
			t.Fatalf("leadership terms: got %v, want 2: the first and the old leader's again after the restart", ivs)
		}
		if ivs[1].ID != c.es[old].ID() {
			t.Fatalf("second term led by %s, want the old leader %s", ivs[1].ID, c.es[old].ID())
		}
		if took := ivs[1].Start.Sub(restart); took > 100*time.Millisecond {
			t.Errorf("the old leader led again %v after the restart, want within 100 ms (the guard refuses everyone else for %v)", took, o.TTL)
		}
	})
}

// The reclaim against a same-ID twin: only the elector that led may
// reclaim, never another process campaigning as the same ID. With the
// leader reachable, it takes its key again at once and its twin never
// leads beside it. With the leader cut off (it cannot reclaim) and the
// twin started just after the restart (it never heard from the store, so
// it has no data-loss wait of its own), only the guard stands between the
// twin and the key: the twin is refused like anyone else and leads only
// once the guard has ended.
func TestGuardReclaimSameIDTwin(t *testing.T) {
	for _, cut := range []bool{false, true} {
		t.Run(fmt.Sprintf("leader cut %v", cut), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := fastOpts()
				store := memorybackend.NewStore()
				ca, cb := store.Client(), store.Client()
				t.Cleanup(func() { ca.Close(); cb.Close() })
				rec := &electortest.Recorder{}
				a := startOn(t, ca, "a", o, rec)
				if !cut {
					time.Sleep(100 * time.Millisecond)
					twin := startOn(t, cb, "a", o, rec)
					time.Sleep(time.Second)
					synctest.Wait()
					if !a.IsLeader() || twin.IsLeader() {
						t.Fatal("want a leading and its twin following")
					}
					restart := time.Now()
					store.Restart(&memorybackend.RestartOptions{Guard: o.TTL})
					for time.Since(restart) < 2*o.TTL {
						time.Sleep(time.Millisecond)
						if twin.IsLeader() {
							t.Fatalf("the twin led %v after the restart, want the old leader to take its key again", time.Since(restart))
						}
					}
					if !a.IsLeader() {
						t.Fatal("the old leader does not lead after the restart")
					}
					electortest.CheckNoOverlap(t, rec.Intervals())
					return
				}
				time.Sleep(time.Second)
				synctest.Wait()
				if !a.IsLeader() {
					t.Fatal("want a leading")
				}
				ca.Partition()
				restart := time.Now()
				store.Restart(&memorybackend.RestartOptions{Guard: o.TTL})
				twin := startOn(t, cb, "a", o, rec)
				leadsAfterATTL(t, twin, o, restart, rec)
			})
		})
	}
}
