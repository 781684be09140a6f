package sovereign_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/memorybackend"
)

func TestStartupJitterBounds(t *testing.T) {
	for _, tc := range []struct {
		name       string
		opts       sovereign.Options
		maxJitter  time.Duration
		wantSpread bool
	}{
		{"default", sovereign.Options{Logger: quiet}, sovereign.DefaultStartupJitter, true},
		{"custom", sovereign.Options{StartupJitter: 3 * time.Second, Logger: quiet}, 3 * time.Second, true},
		{"disabled", sovereign.Options{NoStartupJitter: true, Logger: quiet}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				store := memorybackend.NewStore()
				start := time.Now()
				var mu sync.Mutex
				var first []time.Duration
				for i := range 20 {
					h := &hooked{Backend: store.Client()}
					var once sync.Once
					h.onAcquire = func(context.Context, backend.AcquireRequest) {
						once.Do(func() {
							mu.Lock()
							first = append(first, time.Since(start))
							mu.Unlock()
						})
					}
					e, err := sovereign.New(h, "election", string(rune('a'+i)), &tc.opts)
					if err != nil {
						t.Fatal(err)
					}
					defer h.Close()
					defer e.Close()
					if err := e.Start(t.Context()); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(tc.maxJitter + time.Second)
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				if len(first) != 20 {
					t.Fatalf("%d of 20 electors attempted, want all", len(first))
				}
				lo, hi := first[0], first[0]
				for _, d := range first {
					lo, hi = min(lo, d), max(hi, d)
				}
				if hi > tc.maxJitter {
					t.Errorf("first attempt after %v, want <= max jitter %v", hi, tc.maxJitter)
				}
				if spread := hi - lo; tc.wantSpread && spread < tc.maxJitter/4 {
					t.Errorf("first attempts spread over %v, want the jitter to spread them (>= %v)", spread, tc.maxJitter/4)
				} else if !tc.wantSpread && spread != 0 {
					t.Errorf("first attempts spread over %v with no jitter, want 0", spread)
				}
			})
		})
	}
}

func TestDoubleVerificationFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		h := &hooked{Backend: mem}
		var lied atomic.Bool
		h.onGet = func(ctx context.Context, key string) (backend.Record, error, bool) {
			if lied.Swap(true) {
				return backend.Record{}, nil, false
			}
			r, err := mem.Get(ctx, key)
			r.Token = "somebody-else"
			return r, err, true
		}
		e, err := sovereign.New(h, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		rec := &electortest.Recorder{}
		rec.Attach(e)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		var failed, acquired []string
		for _, s := range rec.Events() {
			switch ev := s.Event.(type) {
			case sovereign.ElectionFailed:
				if errors.Is(ev.Err, sovereign.ErrVerificationFailed) {
					failed = append(failed, ev.Err.Error())
				}
			case sovereign.LeadershipAcquired:
				acquired = append(acquired, "term"+string(rune('0'+ev.Term)))
				if len(failed) == 0 {
					t.Fatal("became leader before the failed verification was reported")
				}
			}
		}
		if len(failed) != 1 {
			t.Fatalf("verification failures = %v, want exactly 1", failed)
		}
		if !e.IsLeader() || e.Term() != 2 {
			t.Errorf("after the retry: IsLeader %v, term %d; want leader with term 2 (term 1 released, not used)", e.IsLeader(), e.Term())
		}
		if len(acquired) != 1 {
			t.Errorf("acquisitions = %v, want only the verified one", acquired)
		}
	})
}

func TestSameIDNeverTwoLeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		var es []*sovereign.Elector
		var clients []*memorybackend.Backend
		rec := &electortest.Recorder{}
		for range 2 {
			cl := store.Client()
			e, err := sovereign.New(cl, "election", "same-host", fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			rec.Attach(e)
			defer cl.Close()
			defer e.Close()
			es, clients = append(es, e), append(clients, cl)
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		var li int
		for range 5 { // five crash-and-failover rounds
			for len(electortest.Leaders(es...)) == 0 {
				time.Sleep(time.Millisecond)
			}
			li = 0
			if es[1].IsLeader() {
				li = 1
			}
			for range 100 {
				if n := len(electortest.Leaders(es...)); n > 1 {
					t.Fatalf("%d leaders with the same ID", n)
				}
				time.Sleep(10 * time.Millisecond)
			}
			clients[li].Partition()
			for es[li].IsLeader() {
				time.Sleep(time.Millisecond)
			}
			for !es[1-li].IsLeader() {
				if es[li].IsLeader() {
					t.Fatal("partitioned elector leads")
				}
				time.Sleep(time.Millisecond)
			}
			clients[li].Heal()
		}
		synctest.Wait()
		ivs := rec.Intervals()
		if len(ivs) < 5 {
			t.Fatalf("%d terms, want >= 5", len(ivs))
		}
		electortest.CheckNoOverlap(t, ivs)
	})
}

// A release retried by a leader cut off from the store, once it is back,
// spares the lease a same-ID twin took meanwhile: release is owner-checked by
// the token of each acquisition, never by the instance ID (two processes on
// one host, both configured with the hostname).
func TestStaleReleaseSparesASameIDTwin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		rec := &electortest.Recorder{}
		start := func(id string) (*sovereign.Elector, *memorybackend.Backend) {
			cl := store.Client()
			e, err := sovereign.New(cl, "election", id, fastOpts())
			if err != nil {
				t.Fatal(err)
			}
			rec.Attach(e)
			t.Cleanup(func() { e.Close(); cl.Close() })
			if err := e.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			return e, cl
		}
		old, oldClient := start("same-host")
		waitLeader(t, old, time.Second)
		twin, _ := start("same-host")
		time.Sleep(100 * time.Millisecond)
		oldClient.Partition() // its release fails, and is retried until the store answers
		waitLeader(t, twin, 2*time.Second)
		if old.IsLeader() {
			t.Fatal("the cut-off leader still leads beside its twin")
		}
		term := twin.Term()
		other, _ := start("other-host") // heard from the store: takes a released key at once
		time.Sleep(100 * time.Millisecond)
		oldClient.Heal()
		time.Sleep(3 * time.Second) // the old leader's retried release reaches the store
		if !twin.IsLeader() || twin.Term() != term {
			t.Errorf("twin: leads %v with term %d, want still leading with term %d (its lease spared by the old leader's release)",
				twin.IsLeader(), twin.Term(), term)
		}
		if other.IsLeader() || old.IsLeader() {
			t.Errorf("other leads %v, old leads %v: want neither", other.IsLeader(), old.IsLeader())
		}
		synctest.Wait()
		electortest.CheckNoOverlap(t, rec.Intervals())
	})
}

func TestListenerMisuseNeverDelaysStepDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, fastOpts())
		unblock := make(chan struct{})
		var panics, lost atomic.Int32
		for _, e := range c.es {
			e.Subscribe(func(ev sovereign.Event) { <-unblock })                    // blocks
			e.Subscribe(func(ev sovereign.Event) { panics.Add(1); panic("boom") }) // panics
			e.Subscribe(func(ev sovereign.Event) {                                 // misbehaves, then unsubscribes itself
				if _, ok := ev.(sovereign.LeadershipLost); ok {
					lost.Add(1)
				}
			})
		}
		c.start(t)
		li := c.leader(t, time.Second)
		c.clients[li].Partition()
		partitioned := time.Now()
		for c.es[li].IsLeader() {
			time.Sleep(time.Millisecond)
		}
		if d := time.Since(partitioned); d > 700*time.Millisecond {
			t.Errorf("step-down took %v with a blocked listener, want <= RenewDeadline", d)
		}
		c.leader(t, 2*time.Second)
		synctest.Wait()
		if lost.Load() != 1 {
			t.Errorf("well-behaved listener saw %d LeadershipLost, want 1", lost.Load())
		}
		if panics.Load() < 4 {
			t.Errorf("panicking listener called %d times, want it to keep receiving", panics.Load())
		}
		close(unblock)
	})
}

func TestEventsDroppedForSlowListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		mem.Partition() // every attempt fails: a stream of ElectionFailed
		o := fastOpts()
		e, err := sovereign.New(mem, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		gate := make(chan struct{})
		var got []sovereign.Event
		var mu sync.Mutex
		e.Subscribe(func(ev sovereign.Event) {
			<-gate
			mu.Lock()
			got = append(got, ev)
			mu.Unlock()
		})
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour) // far more than 1024 failures
		close(gate)
		e.Close()
		mu.Lock()
		defer mu.Unlock()
		var dropped int
		for _, ev := range got {
			if d, ok := ev.(sovereign.EventsDropped); ok {
				dropped += d.Count
			}
		}
		if dropped == 0 {
			t.Fatalf("no EventsDropped after %d events queued behind a blocked listener", len(got))
		}
		// The queue holds 1024; add the event in flight when the gate closed,
		// the markers and the few events Close publishes.
		if len(got) > 1024+8 {
			t.Errorf("listener received %d events, want at most the 1024 queued plus a few", len(got))
		}
		// The oldest events are the ones lost: the newest, Close's step
		// down to follower, is delivered last.
		if last, ok := got[len(got)-1].(sovereign.StateChanged); !ok || last.To != sovereign.Follower {
			t.Errorf("last event: got %#v, want Close's StateChanged to follower (the newest are kept)", got[len(got)-1])
		}
	})
}

// limited is a backend with etcd's limits: whole-second TTLs and no
// "/heartbeat/" in keys.
type limited struct{ *memorybackend.Backend }

func (limited) MinTTL() time.Duration { return time.Second }

func (l limited) ValidateKey(key string) error {
	if strings.Contains(key, "/heartbeat/") {
		return fmt.Errorf("%w: key %q contains %q", backend.ErrInvalid, key, "/heartbeat/")
	}
	return l.Backend.ValidateKey(key)
}

func TestBadOptions(t *testing.T) {
	mem := memorybackend.New()
	defer mem.Close()
	for _, tc := range []struct {
		name     string
		b        backend.Backend
		elect    string
		id       string
		opts     *sovereign.Options
		contains string
	}{
		{"nil backend", nil, "e", "a", nil, "nil backend"},
		{"empty name", mem, "", "a", nil, "empty election name"},
		{"empty id", mem, "e", "", nil, "empty instance ID"},
		{"negative TTL", mem, "e", "a", &sovereign.Options{TTL: -time.Second}, "TTL is negative"},
		{"deadline not below TTL", mem, "e", "a", &sovereign.Options{TTL: time.Second, RenewDeadline: time.Second}, "RenewDeadline (1s) must be less than TTL (1s)"},
		{"interval not below deadline", mem, "e", "a", &sovereign.Options{RenewDeadline: 2 * time.Second, RenewInterval: 2 * time.Second}, "RenewInterval (2s) must be less than RenewDeadline (2s)"},
		{"request timeout not below deadline", mem, "e", "a", &sovereign.Options{RequestTimeout: 8 * time.Second}, "RequestTimeout (8s) must be less than RenewDeadline (7s)"},
		{"negative jitter", mem, "e", "a", &sovereign.Options{StartupJitter: -time.Millisecond}, "StartupJitter is negative"},
		{"heartbeat too slow", mem, "e", "a", &sovereign.Options{HeartbeatInterval: 16 * time.Second}, "HeartbeatInterval (16s) must be less than HeartbeatTTL (15s)"},
		{"name reserved for locks", mem, "lock/x", "a", nil, `names beginning with "lock/" are reserved`},
		{"TTL below the backend's minimum", limited{mem}, "e", "a", &sovereign.Options{TTL: 500 * time.Millisecond}, "TTL (500ms) is below the backend's minimum of 1s"},
		{"name the backend cannot store", limited{mem}, "jobs/heartbeat/x", "a", nil, `election name "jobs/heartbeat/x" cannot be stored by this backend`},
		{"TTL far too short", mem, "e", "a", &sovereign.Options{TTL: 100 * time.Microsecond}, "RenewInterval (50µs) must be at least 100µs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := sovereign.New(tc.b, tc.elect, tc.id, tc.opts)
			if !errors.Is(err, sovereign.ErrInvalidOptions) {
				t.Fatalf("New = %v, %v; want ErrInvalidOptions", e, err)
			}
			if !strings.Contains(err.Error(), tc.contains) {
				t.Errorf("error %q, want it to say %q", err, tc.contains)
			}
		})
	}
	t.Run("defaults", func(t *testing.T) {
		e, err := sovereign.New(mem, "e", "a", nil)
		if err != nil {
			t.Fatal(err)
		}
		o := e.Options()
		want := sovereign.Options{TTL: 10 * time.Second, RenewDeadline: 7 * time.Second, RenewInterval: 5 * time.Second,
			RequestTimeout: 2 * time.Second, HeartbeatInterval: 5 * time.Second, HeartbeatTTL: 15 * time.Second,
			StartupJitter: 250 * time.Millisecond, ResignSitOut: 2 * time.Second}
		o.Logger = nil
		if o.TTL != want.TTL || o.RenewDeadline != want.RenewDeadline || o.RenewInterval != want.RenewInterval ||
			o.RequestTimeout != want.RequestTimeout || o.HeartbeatInterval != want.HeartbeatInterval ||
			o.HeartbeatTTL != want.HeartbeatTTL || o.StartupJitter != want.StartupJitter || o.ResignSitOut != want.ResignSitOut {
			t.Errorf("defaults = %+v, want %+v", o, want)
		}
	})
	// The README: "Setting only TTL scales every other default with it"
	// (StartupJitter aside), RequestTimeout and ResignSitOut are "at most
	// RenewInterval".
	for _, tc := range []struct {
		name string
		opts sovereign.Options
		want sovereign.Options
	}{
		{"only TTL", sovereign.Options{TTL: time.Second}, sovereign.Options{TTL: time.Second,
			RenewDeadline: 700 * time.Millisecond, RenewInterval: time.Second / 2, RequestTimeout: 200 * time.Millisecond,
			HeartbeatInterval: 500 * time.Millisecond, HeartbeatTTL: 6 * time.Second,
			StartupJitter: 250 * time.Millisecond, ResignSitOut: 200 * time.Millisecond}},
		{"short RenewInterval", sovereign.Options{RenewInterval: time.Second}, sovereign.Options{TTL: 10 * time.Second,
			RenewDeadline: 7 * time.Second, RenewInterval: time.Second, RequestTimeout: time.Second,
			HeartbeatInterval: 5 * time.Second, HeartbeatTTL: 15 * time.Second,
			StartupJitter: 250 * time.Millisecond, ResignSitOut: time.Second}},
	} {
		t.Run("defaults/"+tc.name, func(t *testing.T) {
			e, err := sovereign.New(mem, "e", "a", &tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			o := e.Options()
			o.Logger, o.Metrics = nil, nil
			if !reflect.DeepEqual(o, tc.want) {
				t.Errorf("options: got %+v, want %+v", o, tc.want)
			}
		})
	}
}

// A holder that renews but never heartbeats (its heartbeat record lost, or a
// foreign leader) keeps its lease: only the lease's TTL ends it.
func TestNoTakeoverOfARenewingHolderWithoutHeartbeat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		stale, err := raw.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "zombie", TTL: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		go func() { // keeps renewing, never heartbeats
			for {
				select {
				case <-stop:
					return
				case <-time.After(200 * time.Millisecond):
					raw.Renew(context.Background(), stale)
				}
			}
		}()
		defer close(stop)
		cl := store.Client()
		defer cl.Close()
		e, err := sovereign.New(cl, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Second) // many heartbeat TTLs
		if e.IsLeader() {
			t.Fatalf("IsLeader true: a renewing holder's lease (term %d) was taken over", stale.Term)
		}
		if err := raw.Renew(t.Context(), stale); err != nil {
			t.Errorf("holder's renew after 30s: got %v, want nil (its lease must stand)", err)
		}
	})
}

// A leader whose heartbeats fail reports it and keeps leading while its
// renewals succeed; a follower that finds the leader's heartbeat record
// missing reports LeaderStale and never takes the lease.
func TestHeartbeatFailureIsReportedNotActedOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		ha := &hooked{Backend: store.Client()}
		defer ha.Close()
		o := fastOpts()
		a, err := sovereign.New(ha, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		var failed atomic.Int64
		a.Subscribe(func(ev sovereign.Event) {
			if _, ok := ev.(sovereign.ElectionFailed); ok {
				failed.Add(1)
			}
		})
		if err := a.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		if !a.IsLeader() {
			t.Fatal("a does not lead")
		}
		term := a.Term()
		ha.set(func(h *hooked) {
			h.onHB = func(ctx context.Context) (error, bool) { return errors.New("heartbeat refused"), true }
		})
		// The record expires; then someone deletes what is left by hand.
		time.Sleep(a.Options().HeartbeatTTL)
		raw := store.Client()
		defer raw.Close()
		if err := raw.RemoveMember(t.Context(), "election", "a"); err != nil {
			t.Fatal(err)
		}

		cb := store.Client()
		defer cb.Close()
		b, err := sovereign.New(cb, "election", "b", o)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		var stale atomic.Pointer[sovereign.LeaderStale]
		b.Subscribe(func(ev sovereign.Event) {
			if ls, ok := ev.(sovereign.LeaderStale); ok {
				stale.Store(&ls)
			}
		})
		if err := b.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		full := a.Options()
		o = &full
		for range 3 * int(o.HeartbeatTTL/time.Millisecond) {
			time.Sleep(time.Millisecond)
			if !a.IsLeader() || a.Term() != term {
				t.Fatalf("a: IsLeader %v term %d, want still leading term %d while its renewals succeed", a.IsLeader(), a.Term(), term)
			}
			if b.IsLeader() {
				t.Fatal("b leads: it took over a live lease whose heartbeat record was missing")
			}
		}
		synctest.Wait()
		if failed.Load() == 0 {
			t.Error("no ElectionFailed for the failing heartbeats")
		}
		ls := stale.Load()
		if ls == nil {
			t.Fatal("b published no LeaderStale for a leader whose heartbeat record was missing")
		}
		if ls.Leader.HolderID != "a" || ls.Leader.Term != term || ls.Age <= o.HeartbeatTTL {
			t.Errorf("LeaderStale = %+v, want leader a term %d missing for more than %v", *ls, term, o.HeartbeatTTL)
		}
		if st := b.Status(); !st.LeaderStale || st.Leader.HolderID != "a" {
			t.Errorf("b.Status() = %+v, want LeaderStale for a", st)
		}
	})
}

func TestObserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, fastOpts())
		ctx, cancel := context.WithCancel(t.Context())
		obs := c.es[0].Observe(ctx)
		if r := <-obs; r.HolderID != "" {
			t.Fatalf("first observed leader = %q, want none before the election", r.HolderID)
		}
		c.start(t)
		li := c.leader(t, time.Second)
		synctest.Wait()
		if r := <-obs; r.HolderID != c.es[li].ID() {
			t.Fatalf("observed leader %q, want %q", r.HolderID, c.es[li].ID())
		}
		c.es[li].Resign(t.Context())
		synctest.Wait()
		if r := <-obs; r.HolderID != c.es[1-li].ID() {
			t.Fatalf("after resign observed %q, want the latest leader %q", r.HolderID, c.es[1-li].ID())
		}
		cancel()
		synctest.Wait()
		if _, ok := <-obs; ok {
			t.Error("Observe channel open after its context ended")
		}
	})
}

func TestResignFromInsideLeaderFunction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		e, err := sovereign.New(mem, "election", "a", fastOpts())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		resigned := make(chan error, 1)
		var n atomic.Int32
		go e.Run(ctx, func(lctx context.Context) error {
			if n.Add(1) == 1 {
				resigned <- e.Resign(lctx) // must not deadlock
				if lctx.Err() == nil {
					t.Error("leader context alive after Resign returned")
				}
			}
			<-lctx.Done()
			return nil
		})
		if err := <-resigned; err != nil {
			t.Fatalf("Resign from inside fn = %v", err)
		}
		time.Sleep(5 * time.Second) // sit-out, then it leads again (alone)
		if n.Load() != 2 {
			t.Errorf("fn called %d times, want 2 (campaigns again after the sit-out)", n.Load())
		}
		cancel()
		e.Close()
	})
}

func TestNewLeaderRemovesStaleHeartbeatRecords(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		raw := store.Client()
		defer raw.Close()
		// ghost heartbeated once with a long TTL and then went silent; fresh
		// heartbeated just now.
		if err := raw.Heartbeat(t.Context(), "election", "ghost", time.Hour); err != nil {
			t.Fatal(err)
		}
		o := fastOpts()
		time.Sleep(10 * time.Second) // older than HeartbeatTTL - (TTL - RenewDeadline)
		if err := raw.Heartbeat(t.Context(), "election", "fresh", time.Hour); err != nil {
			t.Fatal(err)
		}
		cl := store.Client()
		defer cl.Close()
		e, err := sovereign.New(cl, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		if !e.IsLeader() {
			t.Fatal("a does not lead")
		}
		ms, err := e.Members(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range ms {
			ids = append(ids, m.ID)
		}
		if got, want := strings.Join(ids, ","), "a,fresh"; got != want {
			t.Errorf("members after the new leader's clean-up = %s, want %s (ghost removed)", got, want)
		}
	})
}

func TestUnsubscribeStopsDelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := newCluster(t, 2, fastOpts())
		var before, after atomic.Int32
		unsubscribe := c.es[0].Subscribe(func(ev sovereign.Event) {
			if _, ok := ev.(sovereign.StateChanged); ok {
				before.Add(1)
			}
		})
		c.start(t)
		li := c.leader(t, time.Second)
		synctest.Wait()
		unsubscribe()
		c.es[0].Subscribe(func(ev sovereign.Event) {
			if _, ok := ev.(sovereign.StateChanged); ok {
				after.Add(1)
			}
		})
		n := before.Load()
		if n == 0 {
			t.Fatal("no StateChanged before unsubscribing")
		}
		c.es[li].Resign(t.Context())
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if got := before.Load(); got != n {
			t.Errorf("unsubscribed listener got %d more events", got-n)
		}
		if after.Load() == 0 {
			t.Error("the other listener got no StateChanged after the resign: the test proves nothing")
		}
	})
}

// lagging reports every held key as expiring (TTL 0) for as long as it stays
// held, as etcd does in a lease's last second before its expiry scan runs.
type lagging struct {
	*memorybackend.Backend
	attempts atomic.Int32
}

func (l *lagging) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	l.attempts.Add(1)
	lease, err := l.Backend.Acquire(ctx, req)
	var held *backend.HeldError
	if errors.As(err, &held) {
		held.Holder.TTL = 0
	}
	return lease, err
}

func TestExpiringLeaseDoesNotCauseRetryStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := memorybackend.NewStore()
		holder := store.Client()
		defer holder.Close()
		if _, err := holder.Acquire(t.Context(), backend.AcquireRequest{Key: "election", HolderID: "other", TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if err := holder.Heartbeat(t.Context(), "election", "other", time.Hour); err != nil {
			t.Fatal(err)
		}
		l := &lagging{Backend: store.Client()}
		defer l.Close()
		e, err := sovereign.New(l, "election", "a", fastOpts()) // RenewInterval 200ms
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		// Backing off from 20ms to RenewInterval/2 = 100ms: about 100 attempts
		// in 10s; without the backoff, one every 20ms: 500.
		if n := l.attempts.Load(); n > 110 {
			t.Errorf("%d attempts in 10s on a lease reported as expiring, want <= 110 (backoff to RenewInterval/2)", n)
		}
	})
}

// confirming is a memory backend whose Acquire reply confirms the lease
// (backend.AcquireConfirmer), and whose first successful reply is damaged by
// damage, as a store or client bug would return it.
type confirming struct {
	*memorybackend.Backend
	damage func(*backend.Lease)
	once   atomic.Bool
	gets   atomic.Int64
}

func (c *confirming) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Lease, error) {
	l, err := c.Backend.Acquire(ctx, req)
	if err == nil && !c.once.Swap(true) {
		c.damage(&l)
	}
	return l, err
}

func (c *confirming) Get(ctx context.Context, key string) (backend.Record, error) {
	c.gets.Add(1)
	return c.Backend.Get(ctx, key)
}

// On a backend whose Acquire reply confirms the lease, the double
// verification checks that reply, without reading the record back: a reply
// that is not the lease asked for (another key or holder, no token, no term
// or no TTL) fails the verification before the elector leads, and it leads
// only on a later, sound acquisition.
func TestDoubleVerificationOfAConfirmedReply(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(*backend.Lease)
	}{
		{"another key", func(l *backend.Lease) { l.Key = "other" }},
		{"another holder", func(l *backend.Lease) { l.HolderID = "b" }},
		{"no token", func(l *backend.Lease) { l.Token = "" }},
		{"no term", func(l *backend.Lease) { l.Term = 0 }},
		{"no TTL", func(l *backend.Lease) { l.TTL = 0 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memorybackend.New()
				defer mem.Close()
				c := &confirming{Backend: mem, damage: tc.damage}
				e, err := sovereign.New(c, "election", "a", fastOpts())
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				rec := &electortest.Recorder{}
				rec.Attach(e)
				if err := e.Start(t.Context()); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * time.Second)
				synctest.Wait()
				failed := 0
				for _, s := range rec.Events() {
					switch ev := s.Event.(type) {
					case sovereign.ElectionFailed:
						if errors.Is(ev.Err, sovereign.ErrVerificationFailed) {
							failed++
						}
					case sovereign.LeadershipAcquired:
						if failed == 0 {
							t.Fatalf("became leader (term %d) on the damaged reply, before a failed verification", ev.Term)
						}
					}
				}
				if failed != 1 {
					t.Errorf("verification failures: got %d, want 1", failed)
				}
				if !e.IsLeader() {
					t.Error("not leader after the damaged reply's retry")
				}
				if n := c.gets.Load(); n != 0 {
					t.Errorf("Get called %d times: want the confirmed reply checked, not read back", n)
				}
			})
		})
	}
}

// An elector that resigned sits out for ResignSitOut before it campaigns
// again: alone, it leads again once that has passed, not before.
func TestResignSitsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memorybackend.New()
		defer mem.Close()
		o := fastOpts()
		o.ResignSitOut = 300 * time.Millisecond
		o.RenewInterval = 330 * time.Millisecond
		e, err := sovereign.New(mem, "election", "a", o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		rec := &electortest.Recorder{}
		rec.Attach(e)
		if err := e.Start(t.Context()); err != nil {
			t.Fatal(err)
		}
		rec.Started(t, "a", 1)
		resigned := time.Now()
		if err := e.Resign(t.Context()); err != nil {
			t.Fatal(err)
		}
		iv := rec.Started(t, "a", 2)
		if d := iv.Start.Sub(resigned); d < 300*time.Millisecond || d > 310*time.Millisecond {
			t.Errorf("led again %v after resigning, want just after ResignSitOut (300ms)", d)
		}
	})
}
