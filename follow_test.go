package sovereign_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/memorybackend"
)

// noWatch is a backend that cannot watch: only the methods of
// backend.Backend, so a follower learns of the holder by its attempts.
type noWatch struct{ backend.Backend }

// leaders records the LeaderChanged events of an elector.
type leaders struct {
	mu  sync.Mutex
	got []string // "holder/term", "" for no leader
}

func (l *leaders) attach(e *sovereign.Elector) {
	e.Subscribe(func(ev sovereign.Event) {
		if lc, ok := ev.(sovereign.LeaderChanged); ok {
			l.mu.Lock()
			defer l.mu.Unlock()
			s := ""
			if lc.HasLeader() {
				s = lc.Leader.HolderID + "/" + string(rune('0'+lc.Leader.Term))
			}
			l.got = append(l.got, s)
		}
	})
}

func (l *leaders) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// A follower publishes LeaderChanged once for each holder and term it
// learns of: not again for a holder and term it already knows (here it looks
// every TTL, without a watch), and again for the same holder in a new term.
func TestLeaderChangedOncePerHolderAndTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		z1, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cl := store.Client()
		defer cl.Close()
		e, err := sovereign.New(noWatch{cl}, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		var l leaders
		l.attach(e)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3500 * time.Millisecond) // three more looks at z's term 1
		synctest.Wait()
		if got, want := l.list(), []string{"z/1"}; !slices.Equal(got, want) {
			t.Fatalf("LeaderChanged while z holds term 1: got %q, want %q", got, want)
		}
		// z hands over to itself between two looks: same holder, new term.
		if err := raw.Release(t.Context(), z1); err != nil {
			t.Fatal(err)
		}
		if _, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if got, want := l.list(), []string{"z/1", "z/2"}; !slices.Equal(got, want) {
			t.Errorf("LeaderChanged after z took term 2: got %q, want %q", got, want)
		}
		if st := e.Status(); st.Leader.HolderID != "z" || st.Leader.Term != 2 {
			t.Errorf("Status().Leader: got %s term %d, want z term 2", st.Leader.HolderID, st.Leader.Term)
		}
	})
}

// A follower on a backend that cannot watch learns of a release only by
// looking, and it looks at least once a TTL (its own), even when the holder
// took its lease with a much longer TTL: it leads within a TTL of the
// release, not when the holder's lease would have expired.
func TestFollowerWithoutWatchLooksEveryTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		z, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cl := store.Client()
		defer cl.Close()
		e, err := sovereign.New(noWatch{cl}, "election", "a", fastOpts()) // TTL 1s
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond)
		if err := raw.Release(t.Context(), z); err != nil {
			t.Fatal(err)
		}
		released := time.Now()
		for !e.IsLeader() {
			if d := time.Since(released); d > time.Second+50*time.Millisecond {
				t.Fatalf("not leader %v after the release, want within the TTL (1s): a follower without a watch must look every TTL", d)
			}
			time.Sleep(time.Millisecond)
		}
	})
}

// A follower that sees the key released or expired knows that nobody
// leads: it publishes LeaderChanged with no leader (and Status shows none)
// even when it cannot acquire at once (here it sits out after resigning),
// and, when it can, it becomes a candidate before it attempts, also when
// another candidate wins.
func TestFollowerSeesTheKeyFree(t *testing.T) {
	t.Run("sitting out", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			cl := store.Client()
			defer cl.Close()
			o := fastOpts()
			o.ResignSitOut = 300 * time.Millisecond
			e, err := sovereign.New(cl, "election", "a", o)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			var l leaders
			l.attach(e)
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			waitLeader(t, e, time.Second)
			if err := e.Resign(t.Context()); err != nil {
				t.Fatal(err)
			}
			raw := store.Client()
			defer raw.Close()
			z, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // a, sitting out, learns that z leads
			if got := e.Status().Leader.HolderID; got != "z" {
				t.Fatalf("Status().Leader while z leads: got %q, want z", got)
			}
			if err := raw.Release(t.Context(), z); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if got := e.Status().Leader; got.HolderID != "" {
				t.Errorf("Status().Leader after z released, a still sitting out: got %s term %d, want none", got.HolderID, got.Term)
			}
			if got, want := l.list(), []string{"a/1", "", "z/2", ""}; !slices.Equal(got, want) {
				t.Errorf("LeaderChanged: got %q, want %q", got, want)
			}
		})
	})
	t.Run("sitting out, the store lost the key", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			store := memorybackend.NewStore()
			cl, raw := store.Client(), store.Client()
			defer cl.Close()
			defer raw.Close()
			o := fastOpts()
			o.ResignSitOut = 300 * time.Millisecond
			e, err := sovereign.New(cl, "election", "a", o)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			waitLeader(t, e, time.Second)
			if err := e.Resign(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if got := e.Status().Leader.HolderID; got != "z" {
				t.Fatalf("Status().Leader while z leads: got %q, want z", got)
			}
			store.Restart(nil) // loses z's lease; a's watch breaks and comes back
			synctest.Wait()
			if got := e.Status().Leader; got.HolderID != "" {
				t.Errorf("Status().Leader after the store lost z's lease, a still sitting out: got %s term %d, want none", got.HolderID, got.Term)
			}
		})
	})
	t.Run("losing candidate", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCluster(t, 3, fastOpts())
			c.start(t)
			li := c.leader(t, time.Second)
			synctest.Wait()
			var mu sync.Mutex
			states := make(map[string][]string)
			for i, e := range c.es {
				if i == li {
					continue
				}
				e.Subscribe(func(ev sovereign.Event) {
					if sc, ok := ev.(sovereign.StateChanged); ok {
						mu.Lock()
						states[e.ID()] = append(states[e.ID()], sc.From.String()+">"+sc.To.String())
						mu.Unlock()
					}
				})
			}
			if err := c.es[li].Resign(t.Context()); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			ni := c.leader(t, time.Second)
			mu.Lock()
			defer mu.Unlock()
			for i, e := range c.es {
				if i == li {
					continue
				}
				want := []string{"follower>candidate", "candidate>follower"}
				if i == ni {
					want = []string{"follower>candidate", "candidate>leader"}
				}
				if got := states[e.ID()]; !slices.Equal(got, want) {
					t.Errorf("%s's state changes after the release: got %q, want %q", e.ID(), got, want)
				}
			}
		})
	})
}

// An instance's heartbeat record, sent by the elector itself (the memory
// backend takes no batches; hbsched.go's scheduler has tests of its own),
// lives HeartbeatTTL.
func TestHeartbeatRecordLivesHeartbeatTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		cl, raw := store.Client(), store.Client()
		defer cl.Close()
		defer raw.Close()
		o := fastOpts()
		o.HeartbeatTTL = 4 * time.Second
		e, err := sovereign.New(cl, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		ms, err := raw.Members(t.Context(), "election")
		if err != nil {
			t.Fatal(err)
		}
		if len(ms) != 1 || ms[0].ID != "a" || ms[0].TTL != o.HeartbeatTTL {
			t.Errorf("Members just after the first heartbeat: got %+v, want a with TTL %v", ms, o.HeartbeatTTL)
		}
	})
}

// watchOnce is a memory client whose first subscription works and every
// later one fails: a watch that broke stays down.
type watchOnce struct {
	*memorybackend.Backend
	n atomic.Int32
}

func (w *watchOnce) WatchNotify(ctx context.Context, key string, notify func()) (<-chan backend.Event, error) {
	if w.n.Add(1) > 1 {
		return nil, errors.New("test: watch refused")
	}
	return w.Backend.WatchNotify(ctx, key, notify)
}

// A follower whose watch broke and cannot be established again no longer
// counts on it to report the holder's expiry: it looks again when the
// holder's lease expires, not ten TTLs later.
func TestFollowerPollsWhileItsWatchIsDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		// z crashes at once: its lease expires 5s from now.
		if _, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "z", TTL: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
		expires := time.Now().Add(5 * time.Second)
		w := &watchOnce{Backend: store.Client()}
		defer w.Close()
		e, err := sovereign.New(w, "election", "a", fastOpts()) // TTL 1s: looks every 10s while watching
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		store.Restart(&memorybackend.RestartOptions{KeepLeases: true}) // breaks every watch, keeps z's lease
		for !e.IsLeader() {
			if time.Now().After(expires.Add(100 * time.Millisecond)) {
				t.Fatalf("not leader %v after z's lease expired, with the watch down: want the follower to look at the expiry", time.Since(expires))
			}
			time.Sleep(time.Millisecond)
		}
	})
}
