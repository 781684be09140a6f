package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	sovereign "github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/backend/backendtest"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// The tests of this file run the backend over redis.NewFailoverClient
// against a real Sentinel (testredis.StartSentinel: a primary, a replica
// and a Sentinel), and fail over for real (SENTINEL FAILOVER).

// sentinelWaitTimeout is the WaitTimeout of the tests with WaitReplicas:
// longer than the default, so that a loaded machine fails no WAIT that a
// replica answers.
const sentinelWaitTimeout = 2 * time.Second

// failoverClient returns a failover client of s with the options the README
// shows, closed at the end of the test.
func failoverClient(t testing.TB, s *testredis.Sentinel) *redis.Client {
	t.Helper()
	return s.NewFailoverClient(t, &redis.FailoverOptions{ContextTimeoutEnabled: true})
}

// switchBound bounds how long a call is retried while the client follows
// the new primary.
const switchBound = 15 * time.Second

// transient reports whether err may come from the switch to a new primary
// (a connection the old primary closed, a write it refused as a replica, a
// WAIT it could not satisfy as a primary without replicas) rather than be
// the backend's answer about the lease.
func transient(err error) bool {
	return err != nil &&
		!errors.Is(err, backend.ErrLeaseLost) && !errors.Is(err, backend.ErrHeld) &&
		!errors.Is(err, backend.ErrNotHeld) && !errors.Is(err, backend.ErrInvalid) &&
		!errors.Is(err, backend.ErrClosed)
}

// acrossSwitch calls fn until it returns nil or an error that is not
// transient, for at most switchBound, and returns its last error; it logs
// the transient errors it retried.
func acrossSwitch(t testing.TB, what string, fn func() error) error {
	t.Helper()
	deadline := time.Now().Add(switchBound)
	var retried []string
	for {
		err := fn()
		if !transient(err) || time.Now().After(deadline) {
			if len(retried) > 0 {
				t.Logf("%s: retried %d transient errors of the switch: %v", what, len(retried), retried)
			}
			return err
		}
		retried = append(retried, err.Error())
		time.Sleep(20 * time.Millisecond) // retrying a call that raced the switch
	}
}

// TestConformanceSentinel runs the conformance suite over a FailoverClient.
// Env.Restart is a real failover: with loseData the primary is emptied
// first (FLUSHALL), so the promoted replica comes up empty; without, the
// failover waits until the replica has every write (WaitSynced).
func TestConformanceSentinel(t *testing.T) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{})
	admin := failoverClient(t, s) // follows the primary across the failovers
	var n atomic.Int64
	backendtest.Run(t, func(t *testing.T) backendtest.Env {
		ctx := context.Background()
		prefix := fmt.Sprintf("conformance:%d:", n.Add(1))
		opts := &redisbackend.Options{Prefix: prefix, TermRetention: conformanceRetention}
		return backendtest.Env{
			Open: func() backend.Backend {
				b, err := redisbackend.New(failoverClient(t, s), opts)
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return b
			},
			Size: func() int { // the keys under this Env's prefix
				var keys []string
				err := acrossSwitch(t, "KEYS", func() error {
					var err error
					keys, err = admin.Keys(ctx, prefix+"*").Result() // test code on a test server
					return err
				})
				if err != nil {
					t.Fatalf("KEYS: %v", err)
				}
				return len(keys)
			},
			Retention: conformanceRetention,
			Restart: func(loseData bool) {
				if loseData {
					if err := acrossSwitch(t, "FLUSHALL", func() error { return admin.FlushAll(ctx).Err() }); err != nil {
						t.Fatalf("FLUSHALL: %v", err)
					}
				}
				if err := s.WaitSynced(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := s.Failover(ctx); err != nil {
					t.Fatal(err)
				}
			},
			TermsSurviveDataLoss: true,
		}
	})
}

// TestSentinelFailoverKeepsLease: with WaitReplicas 1, a lease acquired
// before a failover is still held on the new primary (keepsLeaseAcrossFailover).
func TestSentinelFailoverKeepsLease(t *testing.T) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{})
	opts := &redisbackend.Options{Prefix: "fk:", WaitReplicas: 1, WaitTimeout: sentinelWaitTimeout}
	a := newBackend(t, failoverClient(t, s), opts)
	b := newBackend(t, failoverClient(t, s), opts)
	keepsLeaseAcrossFailover(t, a, b, "fk:", func(ctx context.Context) string {
		old, err := s.Primary(ctx)
		if err != nil {
			t.Fatal(err)
		}
		primary, err := s.Failover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("failover: %s -> %s", old, primary)
		return primary
	}, func(addr string) *redis.Client { return s.Node(addr).NewClient(t, nil) })
}

// keepsLeaseAcrossFailover: a takes the lease of key "k" (and its term
// counter, two terms earlier) through backends with WaitReplicas, then
// failover moves the primary and returns its address, whose client direct
// makes. The holder's Renew succeeds once its client follows the new
// primary, and lands there (the token, the full TTL again); a competitor
// (b) is told who holds it, under the same term; Release frees it; and the
// next term is greater than every earlier one.
func keepsLeaseAcrossFailover(t *testing.T, a, b *redisbackend.Backend, prefix string,
	failover func(ctx context.Context) string, direct func(addr string) *redis.Client) {
	t.Helper()
	ctx := ctxBound(t)
	req := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}
	var terms []uint64
	for range 2 {
		l, err := a.Acquire(ctx, req)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		terms = append(terms, l.Term)
		if err := a.Release(ctx, l); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	l, err := a.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire before the failover: %v", err)
	}
	terms = append(terms, l.Term)

	primary := failover(ctx)
	ctx = ctxBound(t) // a failover may take most of a bound on a loaded machine

	if err := acrossSwitch(t, "Renew", func() error { return a.Renew(ctx, l) }); err != nil {
		t.Fatalf("Renew after the failover: got %v, want nil", err)
	}
	// The renewal reached the new primary: it holds the lease, with the
	// full TTL again.
	c := direct(primary)
	lease := prefix + "{k}"
	if got := c.HGet(ctx, lease, "token").Val(); got != l.Token {
		t.Errorf("token on the new primary %s: got %q, want %q", primary, got, l.Token)
	}
	if pttl := c.PTTL(ctx, lease).Val(); pttl < req.TTL-10*time.Second {
		t.Errorf("PTTL of the lease on the new primary after Renew: got %v, want about %v", pttl, req.TTL)
	}

	err = acrossSwitch(t, "competitor's Acquire", func() error {
		_, err := b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: time.Minute})
		return err
	})
	var held *backend.HeldError
	if !errors.As(err, &held) {
		t.Fatalf("competitor's Acquire after the failover: got %v, want a *backend.HeldError", err)
	}
	if held.Holder.HolderID != "a" || held.Holder.Term != l.Term || held.Holder.Token != l.Token {
		t.Errorf("HeldError after the failover: got holder %q term %d token %q, want a, %d, %q",
			held.Holder.HolderID, held.Holder.Term, held.Holder.Token, l.Term, l.Token)
	}

	if err := acrossSwitch(t, "Release", func() error { return a.Release(ctx, l) }); err != nil {
		t.Fatalf("Release after the failover: got %v, want nil", err)
	}
	var lb backend.Lease
	if err := acrossSwitch(t, "Acquire after Release", func() error {
		var err error
		lb, err = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: time.Minute})
		return err
	}); err != nil {
		t.Fatalf("Acquire after Release: got %v, want nil", err)
	}
	if last := slices.Max(terms); lb.Term <= last {
		t.Errorf("term after the failover: got %d, want > %d (terms before: %v)", lb.Term, last, terms)
	}
}

// TestSentinelWatchAcrossFailover: a watch open across a failover is closed
// (the backend's contract for a broken subscription: the caller watches
// again and re-reads), or gets EventReset; a watch opened afterwards, on
// the new primary, sees a release.
func TestSentinelWatchAcrossFailover(t *testing.T) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{})
	ctx := ctxBound(t)
	w := newBackend(t, failoverClient(t, s), &redisbackend.Options{Prefix: "fw:"})
	b := newBackend(t, failoverClient(t, s), &redisbackend.Options{Prefix: "fw:"})
	events, err := w.Watch(ctx, "k")
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if _, err := s.Failover(ctx); err != nil {
		t.Fatal(err)
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for done := false; !done; {
		select {
		case e, ok := <-events:
			done = !ok || e.Type == backend.EventReset
			switch {
			case !ok:
				t.Log("watch open across the failover: closed")
			case done:
				t.Log("watch open across the failover: EventReset")
			default:
				t.Logf("watch open across the failover: %v before the reset", e.Type)
			}
		case <-timer.C:
			t.Fatalf("watch open across the failover: neither closed nor EventReset within %v", bound)
		}
	}

	again := watchThenRelease(t, ctx, w, b, "k")
	timer.Reset(bound)
	for {
		select {
		case e, ok := <-again:
			if !ok {
				t.Fatal("watch opened after the failover: channel closed, want the release")
			}
			if e.Type == backend.EventReleased {
				return
			}
		case <-timer.C:
			t.Fatalf("watch opened after the failover: no EventReleased within %v", bound)
		}
	}
}

// sentinelElectors is three candidates campaigning over FailoverClients of
// one Sentinel setup, with WaitReplicas 1, recorded by rec.
type sentinelElectors struct {
	s      *testredis.Sentinel
	es     []*sovereign.Elector
	rec    *electortest.Recorder
	reader *redisbackend.Backend // reads the record through the Sentinel too
}

// sentinelElectorTTL is the TTL of the elector tests over Sentinel:
// RenewDeadline 1.4 s, RenewInterval 667 ms, RequestTimeout 400 ms, which
// leaves room for a WAIT of 300 ms.
const sentinelElectorTTL = 2 * time.Second

// sentinelElectorName is their election.
const sentinelElectorName = "sentinel-daemon"

func startSentinelElectors(t *testing.T, s *testredis.Sentinel, waitReplicas int) *sentinelElectors {
	t.Helper()
	opts := &redisbackend.Options{WaitReplicas: waitReplicas, WaitTimeout: 300 * time.Millisecond}
	se := &sentinelElectors{s: s, rec: &electortest.Recorder{}, reader: newBackend(t, failoverClient(t, s), nil)}
	for _, id := range []string{"s1", "s2", "s3"} {
		bk := newBackend(t, failoverClient(t, s), opts)
		e, err := sovereign.New(bk, sentinelElectorName, id, &sovereign.Options{
			TTL: sentinelElectorTTL, NoStartupJitter: true, Logger: electortest.Logger(),
		})
		if err != nil {
			t.Fatalf("sovereign.New: %v", err)
		}
		se.rec.Campaign(t, e)
		se.es = append(se.es, e)
	}
	return se
}

// waitLeaderOn waits until one candidate leads, the store (through the
// Sentinel) holds its lease under its term, and so does the node at
// primary, and returns the leader.
func (se *sentinelElectors) waitLeaderOn(t *testing.T, ctx context.Context, what, primary string) *sovereign.Elector {
	t.Helper()
	direct := se.s.Node(primary).NewClient(t, nil)
	var leader *sovereign.Elector
	electortest.Eventually(t, what, func() bool {
		ls := electortest.Leaders(se.es...)
		if len(ls) != 1 {
			return false
		}
		leader = ls[0]
		rec, err := se.reader.Get(ctx, sentinelElectorName)
		if err != nil || rec.HolderID != leader.ID() || rec.Term != leader.Term() {
			return false
		}
		term, err := direct.HGet(ctx, "sovereign:{"+sentinelElectorName+"}", "term").Uint64()
		return err == nil && term == leader.Term()
	})
	return leader
}

// closeAndCheck stops every candidate and checks that no two terms
// overlapped and that terms increased.
func (se *sentinelElectors) closeAndCheck(t *testing.T) []electortest.Interval {
	t.Helper()
	return closeAndCheckElectors(t, se.es, se.rec)
}

// TestSentinelElectorFailover: three candidates over FailoverClients with
// WaitReplicas 1 and a failover while one leads. At no moment do two lead
// (terms recorded by the leader functions), and after the failover the
// election has a leader again whose lease is on the new primary.
func TestSentinelElectorFailover(t *testing.T) { electorFailover(t, 1) }

// TestSentinelElectorFailoverTwoReplicas: with two replicas, WaitReplicas
// must count both. After the promotion of one, the old primary keeps the
// other as its replica until the Sentinel reconfigures it, so a WAIT for
// one replica still succeeds there; the renewal it confirms is then lost,
// because the reconfigured replica resyncs from the new primary. With
// WaitReplicas 1 this test saw the old leader outlive its lease on the new
// primary in 8 of 16 runs (the six overlaps logged: 2-76 ms). With
// WaitReplicas 2 no write is confirmed on the old primary after the promotion: no overlap,
// and a leader again on the new primary.
func TestSentinelElectorFailoverTwoReplicas(t *testing.T) { electorFailover(t, 2) }

// electorFailover starts a Sentinel with replicas replicas and three
// candidates with WaitReplicas replicas, waits for a leader on the primary,
// fails over, and checks that a leader leads again on the new primary and
// that no two terms overlapped.
func electorFailover(t *testing.T, replicas int) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{Replicas: replicas})
	ctx := ctxBound(t)
	se := startSentinelElectors(t, s, replicas)
	old, err := s.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := se.waitLeaderOn(t, ctx, "a leader before the failover", old)
	t.Logf("leader before the failover: %s, term %d", before.ID(), before.Term())
	primary, err := s.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	after := se.waitLeaderOn(t, ctx, "a leader whose lease is on the new primary", primary)
	t.Logf("leader after the failover: %s, term %d, %v after the failover completed", after.ID(), after.Term(), time.Since(done))
	se.closeAndCheck(t)
}

// TestSentinelElectorHeldReplication: with WaitReplicas 1, a leader whose
// renewals stop reaching the replica (its replication stream is held) steps
// down at its renew deadline, and nobody leads while no write can reach the
// replica. After the failover to that replica, whose copy of the lease is
// older, the election has a leader again; never two at once. (Without
// WaitReplicas the leader would go on leading on the old primary, and the
// failover would lose its renewals.)
func TestSentinelElectorHeldReplication(t *testing.T) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{HoldableReplication: true})
	ctx := ctxBound(t)
	se := startSentinelElectors(t, s, 1)
	old, err := s.Primary(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := se.waitLeaderOn(t, ctx, "a leader before the hold", old)
	term := leader.Term()

	s.HoldReplication(t)
	held := time.Now()
	iv := se.rec.Ended(t, leader.ID(), term)
	t.Logf("leader %s (term %d) stepped down %v after the replication was held", leader.ID(), term, iv.End.Sub(held))
	if ls := electortest.Leaders(se.es...); len(ls) != 0 {
		t.Errorf("leaders while the replication is held: got %d, want none", len(ls))
	}

	failoverStart := time.Now()
	primary, err := s.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	failoverDone := time.Now()
	after := se.waitLeaderOn(t, ctx, "a leader whose lease is on the new primary", primary)
	t.Logf("failover took %v; leader after it: %s, term %d, %v after it completed",
		failoverDone.Sub(failoverStart), after.ID(), after.Term(), time.Since(failoverDone))
	for _, iv := range se.closeAndCheck(t) {
		if iv.Start.After(held) && iv.Start.Before(failoverStart) {
			t.Errorf("term %d of %s began while no write could reach the replica, want no acquisition without a replica", iv.Term, iv.ID)
		}
	}
}

// TestSentinelFailoverLosesUnreplicatedLease: without WaitReplicas, a lease
// the primary acknowledged but the replica never received (its replication
// stream is held) is gone after the failover, as the README says: the key
// is free and the holder's Renew reports the loss. Yet the next term is
// greater than the lost one, though the new primary's term counter never
// saw it: terms follow the server clock.
func TestSentinelFailoverLosesUnreplicatedLease(t *testing.T) {
	s := testredis.StartSentinel(t, testredis.SentinelConfig{HoldableReplication: true})
	ctx := ctxBound(t)
	a := newBackend(t, failoverClient(t, s), &redisbackend.Options{Prefix: "fl:"})
	b := newBackend(t, failoverClient(t, s), &redisbackend.Options{Prefix: "fl:"})
	req := backend.AcquireRequest{Key: "k", HolderID: "a", TTL: time.Minute}
	l0, err := a.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if err := a.Release(ctx, l0); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if err := s.WaitSynced(ctx); err != nil { // the replica has term l0.Term
		t.Fatal(err)
	}

	s.HoldReplication(t)
	l, err := a.Acquire(ctx, req)
	if err != nil {
		t.Fatalf("Acquire after the hold: %v", err)
	}
	replica := s.Nodes()[1]
	rc := replica.NewClient(t, nil)
	if n := rc.Exists(ctx, "fl:{k}").Val(); n != 0 {
		t.Fatalf("EXISTS fl:{k} on the held replica: got %d, want 0", n)
	}
	if got, err := rc.Get(ctx, "fl:{k}:term").Uint64(); err != nil || got != l0.Term {
		t.Fatalf("term counter on the held replica: got %d, %v; want %d", got, err, l0.Term)
	}

	primary, err := s.Failover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if primary != replica.Addr() {
		t.Fatalf("new primary: got %s, want the held replica %s", primary, replica.Addr())
	}
	err = acrossSwitch(t, "Get", func() error { _, err := b.Get(ctx, "k"); return err })
	if !errors.Is(err, backend.ErrNotHeld) {
		t.Errorf("Get after the failover: got %v, want ErrNotHeld (the unreplicated lease is lost)", err)
	}
	if err := acrossSwitch(t, "Renew", func() error { return a.Renew(ctx, l) }); !errors.Is(err, backend.ErrLeaseLost) {
		t.Errorf("Renew of the lost lease: got %v, want ErrLeaseLost", err)
	}
	var lb backend.Lease
	if err := acrossSwitch(t, "Acquire", func() error {
		var err error
		lb, err = b.Acquire(ctx, backend.AcquireRequest{Key: "k", HolderID: "b", TTL: time.Minute})
		return err
	}); err != nil {
		t.Fatalf("Acquire after the failover: got %v, want nil", err)
	}
	if lb.Term <= l.Term {
		t.Errorf("term after the failover: got %d, want > %d (the lost lease's term; the counter held %d)", lb.Term, l.Term, l0.Term)
	}
	t.Logf("terms: before the hold %d, lost %d, after the failover %d", l0.Term, l.Term, lb.Term)
}
