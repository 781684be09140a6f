package sovereign_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// Tests of the follower's use of renewal events (backend.RenewalWatcher):
// the README's "When the store's clock is stepped". They run in a synctest
// bubble on electortest.Renewals, a memory store whose watches tell of
// renewals as Redis's do and whose Drop ends a lease with no event, as a
// forward step of the Redis server's clock does. A mutation survey (X42)
// found each behaviour checked here unchecked by the tests on a real
// redis-server, or checked only by chance.

// renewalRig is an election "election" on a Renewals store: z, a holder
// the test drives by hand (zc, its lease zl), and the elector a, a
// follower with fastOpts (TTL 1 s) on client ac.
type renewalRig struct {
	store *memorybackend.Store
	rn    *electortest.Renewals
	zc    *electortest.Renewing
	ac    *electortest.Renewing
	zl    backend.Lease
	a     *sovereign.Elector
}

// newRenewalRig acquires the key for z with zTTL, then starts a; cleanup
// closes everything inside the bubble.
func newRenewalRig(t *testing.T, zTTL time.Duration, hook func(ac *electortest.Renewing)) *renewalRig {
	t.Helper()
	r := &renewalRig{store: memorybackend.NewStore(), rn: &electortest.Renewals{}}
	r.zc = r.rn.Client(r.store.Client())
	r.ac = r.rn.Client(r.store.Client())
	if hook != nil {
		hook(r.ac)
	}
	var err error
	r.zl, err = r.zc.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: zTTL})
	if err != nil {
		t.Fatal(err)
	}
	r.a, err = sovereign.New(r.ac, "election", "a", fastOpts())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.a.Close()
		r.ac.Close()
		r.zc.Close()
	})
	if err := r.a.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	synctest.Wait() // a's first attempt found z
	return r
}

// at sleeps until d after start and lets the bubble settle.
func at(start time.Time, d time.Duration) {
	time.Sleep(time.Until(start.Add(d)))
	synctest.Wait()
}

// TestSurveyFollowerWaitsOutRenewal: z renews at 0.5 s (TTL 1 s), and at
// 0.6 s the store loses the lease with no event. a's own look was due at
// 1 s (a TTL after its first attempt); it must not lead before the
// renewal's TTL is up (1.5 s), and must lead soon after.
func TestSurveyFollowerWaitsOutRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newRenewalRig(t, time.Second, nil)
		at(start, 500*time.Millisecond)
		if err := r.zc.Renew(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		at(start, 600*time.Millisecond)
		if !r.zc.Drop(t.Context(), "election") {
			t.Fatal("Drop: no lease")
		}
		at(start, 1499*time.Millisecond)
		if r.a.IsLeader() {
			t.Fatalf("a leads at 1.499 s: z renewed at 0.5 s for 1 s, want no acquisition before 1.5 s")
		}
		at(start, 1600*time.Millisecond)
		if !r.a.IsLeader() {
			t.Fatalf("a does not lead at 1.6 s: z's last renewal (0.5 s, TTL 1 s) is up, want a to take the free key")
		}
	})
}

// TestSurveyNoAttemptBeforeRenewalAfterReset: z's TTL (3 s) is longer than
// a's (1 s). z renews at 0.5 s (z's lease lives until 3.5 s at least), the
// store loses it at 0.6 s, and a's watch breaks at 0.7 s. a's wait after
// the reset (a TTL of its own: until 1.7 s) finds the key free and ends
// before z's renewal is up: the check before every attempt must hold a
// back until 3.5 s, and the reset must not clear what the renewal told.
func TestSurveyNoAttemptBeforeRenewalAfterReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newRenewalRig(t, 3*time.Second, nil)
		at(start, 500*time.Millisecond)
		if err := r.zc.Renew(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		at(start, 600*time.Millisecond)
		if !r.zc.Drop(t.Context(), "election") {
			t.Fatal("Drop: no lease")
		}
		at(start, 700*time.Millisecond)
		r.rn.Break("election")
		at(start, 3490*time.Millisecond)
		if r.a.IsLeader() {
			t.Fatalf("a leads at 3.49 s: z renewed at 0.5 s for 3 s, want no acquisition before 3.5 s")
		}
		at(start, 3600*time.Millisecond)
		if !r.a.IsLeader() {
			t.Fatalf("a does not lead at 3.6 s: z's last renewal is up, want a to take the free key")
		}
	})
}

// TestSurveyNoAttemptBeforeRenewalAfterFailures: as
// TestSurveyNoAttemptBeforeRenewalAfterReset, but a's reads fail from the
// reset (0.6 s) until 1.65 s, after its wait after the reset (a TTL of its
// own) has ended: its next attempt comes after a failed read's backoff, and
// must still wait for z's renewal (3.5 s).
func TestSurveyNoAttemptBeforeRenewalAfterFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var failUntil atomic.Pointer[time.Time]
		r := newRenewalRig(t, 3*time.Second, func(ac *electortest.Renewing) {
			ac.BeforeGet = func(string) error {
				if u := failUntil.Load(); u != nil && time.Now().Before(*u) {
					return errors.New("store hiccup")
				}
				return nil
			}
		})
		at(start, 500*time.Millisecond)
		if err := r.zc.Renew(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		at(start, 600*time.Millisecond)
		if !r.zc.Drop(t.Context(), "election") {
			t.Fatal("Drop: no lease")
		}
		until := start.Add(1650 * time.Millisecond)
		failUntil.Store(&until)
		r.rn.Break("election")
		at(start, 3490*time.Millisecond)
		if r.a.IsLeader() {
			t.Fatalf("a leads at 3.49 s: z renewed at 0.5 s for 3 s, want no acquisition before 3.5 s")
		}
		at(start, 3600*time.Millisecond)
		if !r.a.IsLeader() {
			t.Fatalf("a does not lead at 3.6 s: z's last renewal is up, want a to take the free key")
		}
	})
}

// TestSurveyChangeClearsRenewalBound: z (TTL 3 s) renews at 0.5 s, the
// store loses its lease at 0.6 s and y takes the key at once (TTL 1 s),
// then stops. y's acquisition ends what z's renewal told: a takes over a
// TTL after y's acquisition (1.6 s), not when z's renewal would be up
// (3.5 s).
func TestSurveyChangeClearsRenewalBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newRenewalRig(t, 3*time.Second, nil)
		yc := r.store.Client()
		defer yc.Close()
		at(start, 500*time.Millisecond)
		if err := r.zc.Renew(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		at(start, 600*time.Millisecond)
		if !r.zc.Drop(t.Context(), "election") {
			t.Fatal("Drop: no lease")
		}
		if _, err := yc.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "y", TTL: time.Second}); err != nil {
			t.Fatal(err)
		}
		at(start, 1700*time.Millisecond)
		if !r.a.IsLeader() {
			t.Fatalf("a does not lead at 1.7 s: y took the key at 0.6 s for 1 s and never renewed, want a to take over after y's TTL")
		}
	})
}

// TestSurveyReleaseClearsRenewalBound: z (TTL 3 s) renews at 0.5 s and
// releases at 0.6 s: a takes the key at once, not when the renewal would
// be up.
func TestSurveyReleaseClearsRenewalBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newRenewalRig(t, 3*time.Second, nil)
		at(start, 500*time.Millisecond)
		if err := r.zc.Renew(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		at(start, 600*time.Millisecond)
		if err := r.zc.Release(t.Context(), r.zl); err != nil {
			t.Fatal(err)
		}
		at(start, 610*time.Millisecond)
		if !r.a.IsLeader() {
			t.Fatalf("a does not lead 10 ms after z released: want a to take the key at once")
		}
	})
}

// TestSurveyFollowerQuietWhileRenewed: while z renews every 300 ms, a
// makes no attempt (a renewal is no reason to look); its first attempt
// only.
func TestSurveyFollowerQuietWhileRenewed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := newRenewalRig(t, time.Second, nil)
		before := r.ac.Acquires.Load()
		for i := 1; i <= 10; i++ {
			at(start, time.Duration(i)*300*time.Millisecond)
			if err := r.zc.Renew(t.Context(), r.zl); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if n := r.ac.Acquires.Load() - before; n != 0 {
			t.Errorf("a made %d attempts in 3 s while z renewed every 300 ms, want 0", n)
		}
	})
}

// TestSurveyLeaderIgnoresRenewalEvents: a leader's own renewals come back
// on its watch; they are no reason to renew (each renewal would tell of
// another). With 1 ms of latency per call, 3 s of leading at
// RenewInterval 500 ms take about 6 renewals.
func TestSurveyLeaderIgnoresRenewalEvents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		rn := &electortest.Renewals{}
		raw := store.Client()
		raw.SetLatency(time.Millisecond) // a loop of renewals takes time, so the test ends
		ac := rn.Client(raw)
		defer ac.Close()
		a, err := sovereign.New(ac, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if err := a.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if !a.IsLeader() {
			t.Fatal("a does not lead on a free key")
		}
		before := ac.Renews.Load()
		time.Sleep(3 * time.Second)
		if n := ac.Renews.Load() - before; n > 8 {
			t.Errorf("the leader renewed %d times in 3 s at RenewInterval 500 ms, want about 6: it renews on its own renewal events", n)
		}
	})
}

// crossRig starts a renewalRig with z's TTL 3 s; at 0.5 s a change of the
// key wakes a, and while a's attempt is in flight z renews (TTL 3 s) and
// then does what during does. It fails t unless a made that attempt.
func crossRig(t *testing.T, start time.Time, during func(r *renewalRig)) *renewalRig {
	t.Helper()
	var cross atomic.Bool
	var r *renewalRig
	r = newRenewalRig(t, 3*time.Second, func(ac *electortest.Renewing) {
		ac.BeforeAcquire = func(backend.AcquireRequest) error {
			if cross.CompareAndSwap(true, false) {
				r.rn.Publish("election", backend.Event{Type: backend.EventRenewed, TTL: 3 * time.Second, Term: r.zl.Term})
				during(r)
			}
			return nil
		}
	})
	at(start, 500*time.Millisecond)
	cross.Store(true)
	r.rn.Publish("election", backend.Event{Type: backend.EventChanged})
	at(start, 600*time.Millisecond)
	if cross.Load() {
		t.Fatal("a made no attempt at the change: the test tests nothing")
	}
	return r
}

// TestFollowerGivesUpAcquisitionCrossedByRenewal: while a's attempt at
// 0.5 s is in flight, z renews (TTL 3 s) and the store then loses z's lease
// with no event (a forward step of its clock), so the attempt finds the key
// free. The renewal crossed the acquisition: a must give it up and not lead
// before the renewal's TTL is up (3.5 s), then lead, z being gone.
func TestFollowerGivesUpAcquisitionCrossedByRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := crossRig(t, start, func(r *renewalRig) {
			if !r.zc.Drop(t.Context(), "election") {
				t.Error("Drop: no lease")
			}
		})
		for _, d := range []time.Duration{600 * time.Millisecond, 2 * time.Second, 3490 * time.Millisecond} {
			at(start, d)
			if r.a.IsLeader() {
				t.Fatalf("a leads at %v: z renewed at 0.5 s for 3 s while a's acquisition was in flight, want no leadership before 3.5 s", d)
			}
		}
		at(start, 3700*time.Millisecond)
		if !r.a.IsLeader() {
			t.Fatal("a does not lead at 3.7 s: z's last renewal (0.5 s, TTL 3 s) is up, want a to take the free key")
		}
	})
}

// TestFollowerKeepsAcquisitionAfterRenewalThenRelease: while a's attempt
// is in flight, z renews and then releases, and both events reach a before
// the attempt's reply (electortest.Renewing tells a release, with its term,
// before Release returns, as Redis tells it before its reply): a plain
// hand-over, which the release explains. a keeps the acquisition and leads
// at once. (A release told after the reply does not count: a then gives the
// acquisition up and waits out the renewal, as when the store lost the
// lease; see crossedRenewal.)
func TestFollowerKeepsAcquisitionAfterRenewalThenRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		r := crossRig(t, start, func(r *renewalRig) {
			if err := r.zc.Release(t.Context(), r.zl); err != nil {
				t.Errorf("z: Release: %v", err)
			}
		})
		if !r.a.IsLeader() {
			t.Fatal("a does not lead at 0.6 s: z released after its renewal, want a's acquisition kept")
		}
	})
}
