package redisbackend_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/lock"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// guardTTL is the TTL of the RestartGuard tests: the server refuses a free
// key until it has been up for guardTTL (counted in whole seconds, so up to
// a second more).
const guardTTL = time.Second

// guarded returns a Backend with Options.RestartGuard on srv, as user (the
// default user when empty).
func guarded(t *testing.T, srv *testredis.Server, user string) *redisbackend.Backend {
	t.Helper()
	o := &redis.Options{}
	if user != "" {
		o.Username, o.Password = user, "pw"
	}
	return newBackend(t, srv.NewClient(t, o), &redisbackend.Options{RestartGuard: true})
}

// uptime returns the server's uptime in whole seconds (INFO server).
func uptime(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatalf("INFO server: %v", err)
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "uptime_in_seconds:"); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("INFO server: uptime_in_seconds %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatalf("INFO server: no uptime_in_seconds in %q", info)
	return 0
}

// mayBeHeld fails the test unless err is a refusal of the RestartGuard for
// key, to an acquisition of TTL guardTTL, and returns how long it lasts.
func mayBeHeld(t *testing.T, err error, key string) time.Duration {
	t.Helper()
	return mayBeHeldTTL(t, err, key, guardTTL)
}

// mayBeHeldTTL is mayBeHeld for an acquisition of TTL ttl.
func mayBeHeldTTL(t *testing.T, err error, key string, ttl time.Duration) time.Duration {
	t.Helper()
	var held *backend.HeldError
	if !errors.As(err, &held) || !held.MayBeHeld || !errors.Is(err, backend.ErrHeld) {
		t.Fatalf("acquire %q: got %v, want a *backend.HeldError with MayBeHeld (the server restarted less than a TTL ago)", key, err)
	}
	if h := held.Holder; h.Key != key || h.HolderID != "" || h.Term != 0 || h.TTL <= 0 || h.TTL > ttl+time.Second {
		t.Fatalf("acquire %q: refusal's record %+v, want only Key %q and a TTL in (0, %v]", key, h, key, ttl+time.Second)
	}
	if len(held.Holders) != 0 {
		t.Fatalf("acquire %q: refusal names holders %+v, want none", key, held.Holders)
	}
	return held.Holder.TTL
}

// acquireOnceRefusalsEnd acquires req on b, attempting again when each
// refusal of the RestartGuard says it ends, for at most bound.
func acquireOnceRefusalsEnd(t *testing.T, b *redisbackend.Backend, req backend.AcquireRequest, bound time.Duration) backend.Lease {
	t.Helper()
	ctx := context.Background()
	deadline := time.After(bound)
	for {
		l, err := b.Acquire(ctx, req)
		if err == nil {
			return l
		}
		wait := mayBeHeldTTL(t, err, req.Key, req.TTL)
		select {
		case <-time.After(wait):
		case <-deadline:
			t.Fatalf("acquire %q: still refused after %v", req.Key, bound)
		}
	}
}

// A server that has just started hands out no free key to a backend with
// RestartGuard until it has been up for the TTL: it cannot tell a fresh
// start from a restart that lost live leases. A backend without the option
// acquires at once, as before.
func TestRestartGuardRefusesAFreshServer(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	admin := srv.NewClient(t, nil)
	b := guarded(t, srv, "")
	req := backend.AcquireRequest{Key: "job", HolderID: "a", TTL: guardTTL}
	_, err := b.Acquire(ctx, req)
	if up := uptime(t, admin); up*1000 >= int(guardTTL/time.Millisecond) {
		t.Skipf("the server was up for %d s before the first attempt (a loaded machine): nothing to refuse", up)
	}
	mayBeHeld(t, err, "job")
	_, err = b.AcquireMode(ctx, backend.ModeRequest{AcquireRequest: backend.AcquireRequest{Key: "jobs", HolderID: "a", TTL: guardTTL},
		Mode: backend.Shared, Limit: 2})
	mayBeHeld(t, err, "jobs")
	if _, err := b.Get(ctx, "job"); !errors.Is(err, backend.ErrNotHeld) {
		t.Fatalf("Get after the refusal: got %v, want ErrNotHeld: a refusal writes nothing", err)
	}

	plain := newBackend(t, srv.NewClient(t, nil), nil)
	if _, err := plain.Acquire(ctx, backend.AcquireRequest{Key: "other", HolderID: "p", TTL: guardTTL}); err != nil {
		t.Fatalf("a backend without RestartGuard: got %v, want the free key at once", err)
	}

	l := acquireOnceRefusalsEnd(t, b, req, guardTTL+5*time.Second)
	if up := uptime(t, admin); up < int(guardTTL/time.Second) {
		t.Errorf("acquired when the server had been up %d s, want at least the TTL (%v)", up, guardTTL)
	}
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// The data-loss window, closed: a restart without persistence loses a live
// lease while its holder still holds it. A backend without the guard hands
// the free key to a new process at once (the window the README describes);
// with RestartGuard the server refuses it until a TTL after it started,
// when the lost lease has expired wherever it was held, to every plain
// acquisition, the old holder's too, and lets through only a reclaim (the
// old holder's own, which the elector sends); the next term is above the
// lost one.
func TestRestartGuardClosesTheDataLossWindow(t *testing.T) {
	srv := testredis.Start(t) // no persistence
	ctx := context.Background()
	old := guarded(t, srv, "")
	req := backend.AcquireRequest{Key: "job", HolderID: "old", TTL: guardTTL}
	lost := acquireOnceRefusalsEnd(t, old, req, guardTTL+5*time.Second)

	srv.Restart(t) // every key is gone
	fresh := guarded(t, srv, "")
	_, err := fresh.Acquire(ctx, backend.AcquireRequest{Key: "job", HolderID: "fresh", TTL: guardTTL})
	mayBeHeld(t, err, "job")
	_, err = old.Acquire(ctx, req)
	mayBeHeld(t, err, "job")
	// A reclaim (the caller's own lease was lost) goes through; released
	// again so that the rest of the test sees the key free.
	rq := req
	rq.Reclaim = true
	rl, err := old.Acquire(ctx, rq)
	if err != nil {
		t.Fatalf("a reclaim during the refusal: got %v, want it let through", err)
	}
	if err := old.Release(ctx, rl); err != nil {
		t.Fatal(err)
	}
	if err := old.Renew(ctx, lost); !errors.Is(err, backend.ErrLeaseLost) {
		t.Fatalf("the old holder's renewal: got %v, want ErrLeaseLost (the lease is gone)", err)
	}

	plain := newBackend(t, srv.NewClient(t, nil), nil)
	l, err := plain.Acquire(ctx, backend.AcquireRequest{Key: "job", HolderID: "plain", TTL: guardTTL})
	if err != nil {
		t.Fatalf("without RestartGuard: got %v, want the free key at once (the window the guard closes)", err)
	}
	if err := plain.Release(ctx, l); err != nil {
		t.Fatal(err)
	}

	next := acquireOnceRefusalsEnd(t, fresh, backend.AcquireRequest{Key: "job", HolderID: "fresh", TTL: guardTTL}, guardTTL+5*time.Second)
	if next.Term <= lost.Term {
		t.Errorf("term after the refusal %d, want above the lost lease's %d", next.Term, lost.Term)
	}
}

// A restart from a snapshot loses only what was written after it: a lease
// in the snapshot is there again under its holder (HELD, not a refusal),
// and a lease acquired after the snapshot is lost, so its key is refused
// for a TTL.
func TestRestartGuardAfterSnapshotRestart(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	admin := srv.NewClient(t, nil)
	b := newBackend(t, srv.NewClient(t, nil), nil) // the holder's backend needs no guard here
	saved, err := b.Acquire(ctx, backend.AcquireRequest{Key: "saved", HolderID: "a", TTL: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Save(ctx).Err(); err != nil {
		t.Fatalf("SAVE: %v", err)
	}
	// The snapshot ages past the TTL before the kill: after a restart
	// LASTSAVE must be the start, not the snapshot's time, or the guard
	// would let the key go without asking INFO.
	saveAged(t, admin, guardTTL+time.Second)
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "unsaved", HolderID: "a", TTL: 30 * time.Second}); err != nil {
		t.Fatal(err)
	}
	srv.Kill(t) // the snapshot is on disk; "unsaved" is not
	srv.Start(t)

	fresh := guarded(t, srv, "")
	_, err = fresh.Acquire(ctx, backend.AcquireRequest{Key: "saved", HolderID: "b", TTL: guardTTL})
	var held *backend.HeldError
	if !errors.As(err, &held) || held.MayBeHeld || held.Holder.HolderID != "a" || held.Holder.Term != saved.Term {
		t.Fatalf("the lease in the snapshot: got %v, want HELD by %q under term %d", err, "a", saved.Term)
	}
	_, err = fresh.Acquire(ctx, backend.AcquireRequest{Key: "unsaved", HolderID: "b", TTL: guardTTL})
	mayBeHeld(t, err, "unsaved")
}

// saveAged waits, for at most 10 s, until the server's last save is more
// than age ago by its own clock (LASTSAVE and TIME).
func saveAged(t *testing.T, c *redis.Client, age time.Duration) {
	t.Helper()
	ctx := context.Background()
	last, err := c.LastSave(ctx).Result()
	if err != nil {
		t.Fatalf("LASTSAVE: %v", err)
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	bound := time.After(10 * time.Second)
	for {
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatalf("TIME: %v", err)
		}
		if now.Sub(time.Unix(last+1, 0)) > age {
			return
		}
		select {
		case <-tick.C:
		case <-bound:
			t.Fatalf("the last save (%d) is not %v old after 10 s", last, age)
		}
	}
}

// A save makes LASTSAVE recent, as a start does: the server then asks INFO
// whether it started recently, and a server up for longer than the TTL
// hands out the free key.
func TestRestartGuardIgnoresASave(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	admin := srv.NewClient(t, nil)
	b := guarded(t, srv, "")
	l := acquireOnceRefusalsEnd(t, b, backend.AcquireRequest{Key: "warm", HolderID: "a", TTL: guardTTL}, guardTTL+5*time.Second)
	if err := b.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := admin.Save(ctx).Err(); err != nil {
		t.Fatalf("SAVE: %v", err)
	}
	if _, err := b.Acquire(ctx, backend.AcquireRequest{Key: "after-save", HolderID: "a", TTL: guardTTL}); err != nil {
		t.Fatalf("acquire right after a save on a server up for %d s: got %v, want it (a save is no restart)", uptime(t, admin), err)
	}
}

// The guard needs INFO from the ACL user when LASTSAVE cannot settle it: a
// user without INFO gets an error that says so (never the key), and a user
// without LASTSAVE is still refused, through INFO.
func TestRestartGuardACL(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	admin := srv.NewClient(t, nil)
	for user, rule := range map[string]string{"noinfo": "-info", "nolastsave": "-lastsave"} {
		if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", rule).Err(); err != nil {
			t.Fatalf("ACL SETUSER: %v", err)
		}
	}
	_, err := guarded(t, srv, "nolastsave").Acquire(ctx, backend.AcquireRequest{Key: "job", HolderID: "a", TTL: guardTTL})
	if up := uptime(t, admin); up*1000 >= int(guardTTL/time.Millisecond) {
		t.Skipf("the server was up for %d s before the first attempt (a loaded machine): nothing to refuse", up)
	}
	mayBeHeld(t, err, "job")
	_, err = guarded(t, srv, "noinfo").Acquire(ctx, backend.AcquireRequest{Key: "job", HolderID: "a", TTL: guardTTL})
	if err == nil || errors.Is(err, backend.ErrHeld) || !strings.Contains(err.Error(), "an ACL user allowed INFO") {
		t.Fatalf("a user without INFO: got %v, want an error asking for INFO", err)
	}
}

// Through package lock and the elector: TryAcquire reports the refusal as
// a HeldError with MayBeHeld and says why; Acquire waits it out and gets
// the lock once the server has been up for the TTL; an elector leads only
// then.
func TestRestartGuardLockAndElector(t *testing.T) {
	srv := testredis.Start(t)
	ctx := context.Background()
	admin := srv.NewClient(t, nil)
	lk, err := lock.New(guarded(t, srv, ""), "a", &lock.Options{TTL: guardTTL, Logger: electortest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lk.Close() })
	_, err = lk.TryAcquire(ctx, "tally/42", nil)
	if up := uptime(t, admin); up*1000 >= int(guardTTL/time.Millisecond) {
		t.Skipf("the server was up for %d s before the first attempt (a loaded machine): nothing to refuse", up)
	}
	var held *lock.HeldError
	if !errors.As(err, &held) || !held.MayBeHeld || !errors.Is(err, lock.ErrHeld) || held.Holder.Key != "tally/42" ||
		!strings.Contains(err.Error(), `lock "tally/42" may be held: the store restarted`) {
		t.Fatalf("TryAcquire on a fresh server: got %v, want a *lock.HeldError with MayBeHeld that says why", err)
	}

	e, err := sovereign.New(guarded(t, srv, ""), "guarded", "e1", &sovereign.Options{TTL: guardTTL, Logger: electortest.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	led := make(chan int, 1)
	e.Subscribe(func(ev sovereign.Event) {
		if _, ok := ev.(sovereign.LeadershipAcquired); ok {
			select {
			case led <- uptime(t, admin):
			default:
			}
		}
	})
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })

	actx, cancel := context.WithTimeout(ctx, guardTTL+10*time.Second)
	defer cancel()
	l, err := lk.Acquire(actx, "tally/42", nil)
	if err != nil {
		t.Fatalf("Acquire: got %v, want the lock once the refusal ends", err)
	}
	if up := uptime(t, admin); up < int(guardTTL/time.Second) {
		t.Errorf("Acquire got the lock when the server had been up %d s, want at least the TTL (%v)", up, guardTTL)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case up := <-led:
		if up < int(guardTTL/time.Second) {
			t.Errorf("the elector led when the server had been up %d s, want at least the TTL (%v)", up, guardTTL)
		}
	case <-time.After(guardTTL + 10*time.Second):
		t.Fatal("the elector did not lead within TTL + 10 s")
	}
}

// With RestartGuard, a restart without persistence costs an election no
// failover: the leader's renewal finds its lease gone before its deadline,
// so its next attempt is a reclaim (backend.AcquireRequest.Reclaim), which
// the server lets through while it refuses the others. Three electors, TTL
// 4 s: the old leader leads again under a new term while the server has
// been up for less than the TTL, and nobody else leads. The followers saw
// the restart (their watches broke), so they wait a TTL by themselves; a
// candidate started just after the restart did not, and only the guard
// stops it: the old leader's link is made slow (100 ms a command) from the
// restart on, so that the late candidate reaches the free key first.
// Without the guard it leads (as on a Cluster:
// TestRestartGuardClusterOldLeaderLeadsOn).
func TestRestartGuardOldLeaderLeadsOn(t *testing.T) {
	srv := testredis.Start(t) // no persistence
	admin := srv.NewClient(t, nil)
	oldLeaderLeadsOn(t, oldLeaderRun{
		ttl:   4 * time.Second, // the renew deadline (2.8 s) leaves the slowed leader room to reclaim
		delay: 100 * time.Millisecond,
		client: func() redis.UniversalClient {
			return srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
		},
		restart: func() { srv.Restart(t) },
		uptime:  func() int { return uptime(t, admin) },
	})
}

// oldLeaderRun describes a run of oldLeaderLeadsOn.
type oldLeaderRun struct {
	ttl, delay    time.Duration
	renewInterval time.Duration // zero: the default
	client        func() redis.UniversalClient
	restart       func()     // without persistence, the election's key's server
	uptime        func() int // seconds, of that server
}

// oldLeaderLeadsOn runs three electors of election "daemon" with
// RestartGuard at r.ttl, each over a client of its own (r.client), until
// one leads; then it slows the leader's link (r.delay a command), restarts
// the server without its data, and starts a fourth candidate, which has no
// restart to wait out. The old leader must lead again, under a new term,
// while the server has been up for less than the TTL (a reclaim), and
// nobody else may ever lead.
func oldLeaderLeadsOn(t *testing.T, r oldLeaderRun) {
	t.Helper()
	rec := &electortest.Recorder{}
	var es []*sovereign.Elector
	slow := make(map[*sovereign.Elector]*slowHook)
	start := func(id string) {
		cl := r.client()
		h := &slowHook{delay: r.delay}
		cl.AddHook(h)
		b := newBackend(t, cl, &redisbackend.Options{RestartGuard: true})
		e, err := sovereign.New(b, "daemon", id, &sovereign.Options{
			TTL: r.ttl, RenewInterval: r.renewInterval, NoStartupJitter: true, Logger: electortest.Logger(),
		})
		if err != nil {
			t.Fatal(err)
		}
		rec.Campaign(t, e)
		es = append(es, e)
		slow[e] = h
	}
	for _, id := range []string{"r1", "r2", "r3"} {
		start(id)
	}
	leader := func(after uint64, within time.Duration) *sovereign.Elector {
		t.Helper()
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			if ls := electortest.Leaders(es...); len(ls) == 1 && ls[0].Term() > after {
				return ls[0]
			}
			time.Sleep(5 * time.Millisecond) // polling the electors' state, bounded
		}
		t.Fatalf("no leader with a term above %d within %v", after, within)
		return nil
	}
	first := leader(0, r.ttl+15*time.Second)
	term := first.Term()
	slow[first].on.Store(true)
	r.restart()
	start("late")
	again := leader(term, r.ttl+10*time.Second)
	up := r.uptime()
	if again != first {
		t.Fatalf("%s leads after the restart, want the old leader %s to lead on", again.ID(), first.ID())
	}
	if up >= int(r.ttl/time.Second) {
		t.Errorf("the old leader led again when the server had been up %d s, want during the refusal (TTL %v): a reclaim", up, r.ttl)
	}
	t.Logf("%s leads on under term %d (was %d), the server up %d s", again.ID(), again.Term(), term, up)
	for _, e := range es {
		_ = e.Close()
	}
	ivs := rec.Intervals()
	electortest.CheckNoOverlap(t, ivs)
	for _, iv := range ivs {
		if iv.ID != first.ID() {
			t.Errorf("%s led term %d, want only the old leader %s", iv.ID, iv.Term, first.ID())
		}
	}
}
