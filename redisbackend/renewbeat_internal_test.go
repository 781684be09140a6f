package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/testredis"
)

// scriptCounter counts the commands a client sends, pipelined or not.
type scriptCounter struct{ sent atomic.Int64 }

func (*scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.sent.Add(1); return next(ctx, cmd) }
}
func (h *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.sent.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func (h *scriptCounter) n() int64 { return h.sent.Load() }

// age moves every time beats knows of back by d, as if d had passed.
func (s *beats) age(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, bt := range s.m {
		bt.written = bt.written.Add(-d)
		bt.asked = bt.asked.Add(-d)
		if !bt.renewed.IsZero() {
			bt.renewed = bt.renewed.Add(-d)
		}
		s.m[k] = bt
	}
}

// renewBeatClients are a single real server and a real server in cluster
// mode, each with a script counter.
func renewBeatClients(t *testing.T) map[string]struct {
	c Client
	h *scriptCounter
} {
	out := map[string]struct {
		c Client
		h *scriptCounter
	}{}
	single := testredis.Start(t)
	sc := single.NewClient(t, nil)
	sh := &scriptCounter{}
	sc.AddHook(sh)
	out["server"] = struct {
		c Client
		h *scriptCounter
	}{sc, sh}
	cluster := testredis.StartConfig(t, testredis.Config{Cluster: true})
	cc := cluster.NewClusterClient(t, nil)
	ch := &scriptCounter{}
	cc.AddHook(ch)
	out["cluster"] = struct {
		c Client
		h *scriptCounter
	}{cc, ch}
	return out
}

func newTestBackend(t *testing.T, c Client) *Backend {
	t.Helper()
	b, err := New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// TestRenewalCoversHeartbeat: a leader renewing its lease every 5 s (the
// elector's default at TTL 10 s; also every 3.3 s) and asking for its
// heartbeat every 5 s (records of 15 s: the elector's defaults at TTL 10 s)
// sends no heartbeat command over six batches, its renewals refreshing the
// record on the server (every 3.3 s, only some of them); a follower's
// heartbeat on the
// same key is written on its own schedule as before. Time is moved by
// ageing what the Backend knows of its records, so the test does not
// depend on the clock.
func TestRenewalCoversHeartbeat(t *testing.T) {
	for name, cl := range renewBeatClients(t) {
		for _, renewEvery := range []time.Duration{5 * time.Second, 10 * time.Second / 3} {
			name := name + "/" + renewEvery.String()
			t.Run(name, func(t *testing.T) {
				b := newTestBackend(t, cl.c)
				ctx := context.Background()
				const hbTTL = 15 * time.Second
				key := "covered-" + strings.ReplaceAll(name, "/", "-")
				l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "leader", TTL: 10 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				leader := []backend.HeartbeatRequest{{Key: key, ID: "leader", TTL: hbTTL}}
				follower := []backend.HeartbeatRequest{{Key: key, ID: "follower", TTL: hbTTL}}
				for _, reqs := range [][]backend.HeartbeatRequest{leader, follower} {
					if errs := b.HeartbeatBatch(ctx, reqs); errs[0] != nil {
						t.Fatal(errs[0])
					}
				}
				hbKey := b.keyBase(key) + ":heartbeat:leader"
				followerWrites, refreshes := 0, 0
				// 30 s of the elector at TTL 10 s: a renewal every renewEvery,
				// a heartbeat batch every 5 s, in one timeline.
				const batchEvery = 5 * time.Second
				var at, nextRenew, nextBatch time.Duration = 0, renewEvery, batchEvery
				renewals := 0
				for i := 0; nextBatch <= 30*time.Second; i++ {
					if nextRenew < nextBatch {
						b.beats.age(nextRenew - at)
						at, nextRenew = nextRenew, nextRenew+renewEvery
						renewals++
						// Shortened, the record shows whether the renewal refreshed it.
						if err := cl.c.(redis.UniversalClient).PExpire(ctx, hbKey, 5*time.Second).Err(); err != nil {
							t.Fatal(err)
						}
						if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
							t.Fatalf("at %v: renew: %v", at, errs[0])
						}
						pttl, err := pttlOf(ctx, cl.c, hbKey)
						if err != nil {
							t.Fatal(err)
						}
						if pttl > 10*time.Second {
							refreshes++
						}
						continue
					}
					b.beats.age(nextBatch - at)
					at, nextBatch = nextBatch, nextBatch+batchEvery
					before := cl.h.n()
					if errs := b.HeartbeatBatch(ctx, leader); errs[0] != nil {
						t.Fatalf("at %v: leader's heartbeat: %v", at, errs[0])
					}
					if sent := cl.h.n() - before; sent != 0 {
						t.Fatalf("at %v: the leader's heartbeat batch sent %d commands, want none (its renewals cover it)", at, sent)
					}
					before = cl.h.n()
					if errs := b.HeartbeatBatch(ctx, follower); errs[0] != nil {
						t.Fatalf("at %v: follower's heartbeat: %v", at, errs[0])
					}
					followerWrites += int(cl.h.n() - before)
				}
				// Every 3.3 s, a renewal refreshes the record only when the
				// next would come too late; every 5 s (the heartbeat's own
				// pace), each renewal is the last before the record would
				// be due.
				switch {
				case renewEvery == 5*time.Second && refreshes != renewals:
					t.Errorf("%d of %d renewals refreshed the leader's record, want all", refreshes, renewals)
				case renewEvery < 5*time.Second && (refreshes == 0 || refreshes >= renewals):
					t.Errorf("%d of %d renewals refreshed the leader's record, want some but not all", refreshes, renewals)
				}
				// A follower's record of 15 s, asked for every 5 s, is written
				// every other batch (see TestBeatsWriteOnlyWhatNeedsIt).
				if followerWrites != 3 {
					t.Errorf("the follower's heartbeat batches sent %d commands over 6 batches, want 3", followerWrites)
				}
				ms, err := b.Members(ctx, key)
				if err != nil || len(ms) != 2 {
					t.Fatalf("Members = %+v, %v; want leader and follower", ms, err)
				}
			})
		}
	}
}

func pttlOf(ctx context.Context, c Client, key string) (time.Duration, error) {
	return c.(redis.UniversalClient).PTTL(ctx, key).Result()
}

// TestRenewalLeavesOthersRecords: the renewal refreshes only a record that
// is there and is ours, of a lease it renewed: a missing record is not
// created (the next heartbeat batch writes it), foreign data at the record
// or the members set is left as it is (the heartbeat batch reports it), a
// lease that is not ours refreshes nothing, and a holder whose heartbeats
// stopped is not kept alive by its renewals.
func TestRenewalLeavesOthersRecords(t *testing.T) {
	srv := testredis.Start(t)
	c := srv.NewClient(t, nil)
	h := &scriptCounter{}
	c.AddHook(h)
	b := newTestBackend(t, c)
	ctx := context.Background()
	const hbTTL = 15 * time.Second
	setup := func(t *testing.T, key string) (backend.Lease, string) {
		t.Helper()
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "me", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if errs := b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: key, ID: "me", TTL: hbTTL}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		return l, b.keyBase(key) + ":heartbeat:me"
	}

	t.Run("missing", func(t *testing.T) {
		l, hk := setup(t, "missing")
		if err := c.Del(ctx, hk).Err(); err != nil { // as another instance's RemoveMember would
			t.Fatal(err)
		}
		if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if n := c.Exists(ctx, hk).Val(); n != 0 {
			t.Fatal("the renewal created a missing heartbeat record")
		}
		// The renewal told the heartbeat batch, which writes it at once.
		before := h.n()
		if errs := b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: "missing", ID: "me", TTL: hbTTL}}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if h.n() == before || c.Exists(ctx, hk).Val() != 1 {
			t.Error("the heartbeat batch after a renewal that found the record missing did not write it")
		}
	})

	t.Run("foreign record", func(t *testing.T) {
		l, hk := setup(t, "foreign")
		if err := c.Set(ctx, hk, "someone else's", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
			t.Fatalf("renewal of a lease whose heartbeat record is foreign: %v", errs[0])
		}
		if v := c.Get(ctx, hk).Val(); v != "someone else's" {
			t.Errorf("foreign record changed to %q", v)
		}
		if p := c.PTTL(ctx, hk).Val(); p > time.Hour || p < 59*time.Minute {
			t.Errorf("foreign record's TTL changed to %v", p)
		}
		errs := b.HeartbeatBatch(ctx, []backend.HeartbeatRequest{{Key: "foreign", ID: "me", TTL: hbTTL}})
		if !errors.Is(errs[0], ErrWrongType) {
			t.Errorf("heartbeat batch after the renewal: got %v, want ErrWrongType", errs[0])
		}
	})

	// shorten leaves the record at hk 5 s to live, so that a refresh
	// (back to 15 s) shows.
	shorten := func(t *testing.T, hk string) {
		t.Helper()
		if err := c.PExpire(ctx, hk, 5*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	refreshed := func(hk string) bool { return c.PTTL(ctx, hk).Val() > 10*time.Second }

	// Foreign data at the members set is left as it is: without an expiry
	// (the refresh would have to extend the set), the record is not
	// refreshed either; with an expiry longer than the record's TTL, the
	// refresh leaves the set alone.
	for _, foreignTTL := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprintf("foreign members set with TTL %v", foreignTTL), func(t *testing.T) {
			key := fmt.Sprintf("foreignset%d", foreignTTL)
			l, hk := setup(t, key)
			mk := b.keyBase(key) + ":members"
			if err := c.Set(ctx, mk, "someone else's", foreignTTL).Err(); err != nil {
				t.Fatal(err)
			}
			shorten(t, hk)
			if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
				t.Fatal(errs[0])
			}
			if v := c.Get(ctx, mk).Val(); v != "someone else's" {
				t.Errorf("foreign members set changed to %q", v)
			}
			p := c.PTTL(ctx, mk).Val()
			if foreignTTL == 0 && p != -1 || foreignTTL > 0 && (p > foreignTTL || p < foreignTTL-time.Minute) {
				t.Errorf("foreign members set's TTL changed to %v", p)
			}
			if foreignTTL == 0 && refreshed(hk) {
				t.Error("the renewal refreshed a record whose members set is foreign and would need extending")
			}
		})
	}

	t.Run("lease not ours", func(t *testing.T) {
		l, hk := setup(t, "notours")
		shorten(t, hk)
		stale := l
		stale.Token = backend.NewToken()
		if errs := b.RenewBatch(ctx, []backend.Lease{stale}); !errors.Is(errs[0], backend.ErrLeaseLost) {
			t.Fatalf("renewal with another token: got %v, want ErrLeaseLost", errs[0])
		}
		if refreshed(hk) {
			t.Error("a renewal that failed its owner check refreshed the heartbeat record")
		}
	})

	t.Run("heartbeats stopped", func(t *testing.T) {
		l, hk := setup(t, "stopped")
		shorten(t, hk)
		b.beats.age(10 * time.Second) // no batch asked for it since
		if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if refreshed(hk) {
			t.Error("a renewal refreshed the record of a holder whose heartbeats stopped")
		}
	})

	t.Run("refreshes", func(t *testing.T) { // the positive case of the above
		l, hk := setup(t, "refreshes")
		shorten(t, hk)
		mk := b.keyBase("refreshes") + ":members"
		if err := c.PExpire(ctx, mk, 5*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
		if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if !refreshed(hk) {
			t.Error("the renewal did not refresh its holder's record")
		}
		if p := c.PTTL(ctx, mk).Val(); p < hbTTL || p > 2*hbTTL {
			t.Errorf("the members set has %v left after the renewal refreshed a record of %v, want up to twice that", p, hbTTL)
		}
		if !c.SIsMember(ctx, mk, "me").Val() {
			t.Error("the members set lost the holder")
		}
	})

	t.Run("lock holder without heartbeats", func(t *testing.T) {
		l, err := b.Acquire(ctx, backend.AcquireRequest{Key: "lock/plain", HolderID: "me", TTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if errs := b.RenewBatch(ctx, []backend.Lease{l}); errs[0] != nil {
			t.Fatal(errs[0])
		}
		if n := c.Exists(ctx, b.keyBase("lock/plain")+":heartbeat:me", b.keyBase("lock/plain")+":members").Val(); n != 0 {
			t.Errorf("renewing a lease without heartbeats created %d heartbeat keys", n)
		}
	})
}
