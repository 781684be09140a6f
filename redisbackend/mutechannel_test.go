package redisbackend_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sovereign-go/sovereign"
	"github.com/sovereign-go/sovereign/backend"
	"github.com/sovereign-go/sovereign/internal/electortest"
	"github.com/sovereign-go/sovereign/internal/testredis"
	"github.com/sovereign-go/sovereign/redisbackend"
)

// muteEnv is a server for the mute tests: a client to open Backends on,
// and the subscriber count of a channel as the server reports it (PUBSUB
// NUMSUB, or SHARDNUMSUB for sharded pub/sub on Cluster).
type muteEnv struct {
	client  func(t *testing.T) redisbackend.Client
	numsub  func(t *testing.T, channel string) int64
	publish func(t *testing.T, channel, payload string) // (S)PUBLISH
}

func muteEnvs(t *testing.T) map[string]func(t *testing.T) muteEnv {
	numsub := func(admin *redis.Client, sharded bool) func(t *testing.T, channel string) int64 {
		return func(t *testing.T, channel string) int64 {
			t.Helper()
			if !sharded {
				return numSub(t, admin, channel)
			}
			m, err := admin.PubSubShardNumSub(context.Background(), channel).Result()
			if err != nil {
				t.Fatalf("PUBSUB SHARDNUMSUB %s: %v", channel, err)
			}
			return m[channel]
		}
	}
	publish := func(admin *redis.Client, sharded bool) func(t *testing.T, channel, payload string) {
		return func(t *testing.T, channel, payload string) {
			t.Helper()
			var err error
			if sharded {
				err = admin.SPublish(context.Background(), channel, payload).Err()
			} else {
				err = admin.Publish(context.Background(), channel, payload).Err()
			}
			if err != nil {
				t.Fatalf("PUBLISH %s: %v", channel, err)
			}
		}
	}
	return map[string]func(t *testing.T) muteEnv{
		"miniredis": func(t *testing.T) muteEnv {
			mr := miniredis.RunT(t)
			admin := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { _ = admin.Close() })
			return muteEnv{
				client: func(t *testing.T) redisbackend.Client {
					c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
					t.Cleanup(func() { _ = c.Close() })
					return c
				},
				numsub:  numsub(admin, false),
				publish: publish(admin, false),
			}
		},
		"redis-server": func(t *testing.T) muteEnv {
			srv := testredis.Start(t)
			admin := srv.NewClient(t, nil)
			return muteEnv{
				client: func(t *testing.T) redisbackend.Client {
					return srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true})
				},
				numsub:  numsub(admin, false),
				publish: publish(admin, false),
			}
		},
		"cluster": func(t *testing.T) muteEnv {
			srv := testredis.StartConfig(t, testredis.Config{Cluster: true}) // one node: SHARDNUMSUB asks it
			admin := srv.NewClient(t, nil)
			return muteEnv{
				client: func(t *testing.T) redisbackend.Client {
					return srv.NewClusterClient(t, &redis.ClusterOptions{ContextTimeoutEnabled: true})
				},
				numsub:  numsub(admin, true),
				publish: publish(admin, true),
			}
		},
	}
}

// TestMutedWatchLeavesRenewalsChannel: a muted renewal watch is not
// subscribed to its key's renewals channel (the server counts no
// subscriber of it) and its connection receives no renewal message, while
// the key's events channel keeps its subscriber; an unmuted watch of the
// key in the same Backend keeps the renewals channel subscribed (its
// renewals reach the connection, not the muted watch), and its end
// unsubscribes it; clearing the Mute subscribes again and the next
// renewal is delivered; setting it again unsubscribes. A renewal message
// on the events channel, as a version before the renewals channel sent
// them (a rolling upgrade), is delivered by a renewal watch and dropped
// by a muted one.
func TestMutedWatchLeavesRenewalsChannel(t *testing.T) {
	for name, newEnv := range muteEnvs(t) {
		t.Run(name, func(t *testing.T) {
			env := newEnv(t)
			ctx := ctxBound(t)
			wb := newBackend(t, env.client(t), nil) // the watches
			// Without the hub's beacon, which would keep the first muted
			// watch's channel (TestMutedLeaderKeepsItsConnectionAwake).
			redisbackend.NoBeacon(wb)
			rb := newBackend(t, env.client(t), nil) // the holder, which renews
			pb := newBackend(t, env.client(t), nil) // the probe: tells when a renewal was published
			const key = "muted"
			rch, ech := redisbackend.RenewalsChannel(wb, key), redisbackend.EventsChannel(wb, key)
			probe, err := pb.WatchRenewals(ctx, key, nil)
			if err != nil {
				t.Fatal(err)
			}
			var mute backend.Mute
			mute.Store(true)
			muted, err := wb.WatchRenewalsMuted(ctx, key, nil, &mute)
			if err != nil {
				t.Fatal(err)
			}
			if n := env.numsub(t, rch); n != 1 { // the probe
				t.Fatalf("subscribers of %s with a muted watch and the probe: %d, want 1 (the probe)", rch, n)
			}
			if n := env.numsub(t, ech); n != 2 {
				t.Fatalf("subscribers of %s: %d, want 2 (the muted watch's connection and the probe's)", ech, n)
			}
			l, err := rb.Acquire(ctx, backend.AcquireRequest{Key: key, HolderID: "a", TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			nextEventType(t, probe, backend.EventChanged)
			nextEventType(t, muted, backend.EventChanged)
			// renew renews n times, by Renew and RenewBatch in turn, and
			// waits for the probe to hear each.
			renew := func(n int) {
				t.Helper()
				for i := range n {
					var err error
					if i%2 == 0 {
						err = rb.Renew(ctx, l)
					} else {
						err = rb.RenewBatch(ctx, []backend.Lease{l})[0]
					}
					if err != nil {
						t.Fatal(err)
					}
					nextEventType(t, probe, backend.EventRenewed)
				}
			}
			renew(5)
			if n := redisbackend.RenewalMessages(wb); n != 0 {
				t.Errorf("the muted watch's connection received %d renewal messages over 5 renewals, want 0", n)
			}

			// A follower in the same Backend wants them: the connection
			// subscribes; the muted watch still gets none.
			fctx, fcancel := context.WithCancel(ctx)
			defer fcancel()
			follower, err := wb.WatchRenewalsMuted(fctx, key, nil, new(backend.Mute))
			if err != nil {
				t.Fatal(err)
			}
			if n := env.numsub(t, rch); n != 2 {
				t.Errorf("subscribers of %s with a follower in the muted watch's Backend: %d, want 2", rch, n)
			}
			renew(3)
			for range 3 {
				nextEventType(t, follower, backend.EventRenewed)
			}
			if n := redisbackend.RenewalMessages(wb); n != 3 {
				t.Errorf("the connection with a follower received %d renewal messages over 3 renewals, want 3", n)
			}
			fcancel()
			for range follower {
			}
			eventually(t, "the renewals channel unsubscribed once the follower is gone", func() bool { return env.numsub(t, rch) == 1 })
			renew(3)
			if n := redisbackend.RenewalMessages(wb); n != 3 {
				t.Errorf("the muted watch's connection received %d renewal messages after the follower left, want none more than 3", n)
			}
			select {
			case e := <-muted:
				t.Fatalf("the muted watch delivered %+v, want nothing", e)
			default:
			}

			// Cleared: subscribed again, and the next renewal is heard.
			mute.Store(false)
			eventually(t, "the renewals channel subscribed again once the Mute is cleared", func() bool { return env.numsub(t, rch) == 2 })
			renew(1)
			if e := nextEventType(t, muted, backend.EventRenewed); e.Term != l.Term || e.TTL != time.Minute {
				t.Errorf("the renewal after the Mute was cleared: got %+v, want term %d and TTL 1m", e, l.Term)
			}
			mute.Store(true)
			eventually(t, "the renewals channel unsubscribed once the Mute is set again", func() bool { return env.numsub(t, rch) == 1 })
			if n := env.numsub(t, ech); n != 2 {
				t.Errorf("subscribers of %s at the end: %d, want 2", ech, n)
			}
			old := fmt.Sprintf("renewed:%d:60000", l.Term)
			env.publish(t, ech, old)
			if e := nextEventType(t, probe, backend.EventRenewed); e.TTL != time.Minute {
				t.Errorf("%q on the events channel: got %+v, want TTL 1m", old, e)
			}
			if err := rb.Release(ctx, l); err != nil {
				t.Fatal(err)
			}
			nextEventType(t, muted, backend.EventReleased) // not the renewal on the events channel
		})
	}
}

// nextEventType returns the next event of ch, failing unless it comes
// within a few seconds and is of type typ.
func nextEventType(t *testing.T, ch <-chan backend.Event, typ backend.EventType) backend.Event {
	t.Helper()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	select {
	case e, ok := <-ch:
		if !ok {
			t.Fatalf("watch closed, want an event %v", typ)
		}
		if e.Type != typ {
			t.Fatalf("got event %+v, want %v", e, typ)
		}
		return e
	case <-timer.C:
		t.Fatalf("no event in 5s, want %v", typ)
	}
	panic("unreachable")
}

// TestMutedLeaderLeavesRenewalsChannel: an elector that leads mutes its
// watch, so its connection leaves its key's renewals channel and receives
// none of its own renewals; a second elector of the election in the same
// process (the same Backend), a follower, keeps the channel subscribed and
// hears them; once the leader has resigned and the follower leads, the
// former leader, a follower now, subscribes again and hears the new
// leader's renewals.
func TestMutedLeaderLeavesRenewalsChannel(t *testing.T) {
	srv := testredis.Start(t)
	admin := srv.NewClient(t, nil)
	numsub := func(channel string) int64 { return numSub(t, admin, channel) }
	const renew = 100 * time.Millisecond
	newElector := func(b backend.Backend, id string) *sovereign.Elector {
		e, err := sovereign.New(b, "daemon", id, &sovereign.Options{TTL: electorTTL, RenewInterval: renew, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	b := newBackend(t, srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true}), nil)
	redisbackend.NoBeacon(b) // see TestMutedLeaderKeepsItsConnectionAwake
	rch := redisbackend.RenewalsChannel(b, "daemon")
	rec := &electortest.Recorder{}
	a := newElector(b, "a")
	rec.Campaign(t, a)
	electortest.Eventually(t, "a leads", a.IsLeader)
	eventually(t, "the leader's connection leaves the renewals channel", func() bool { return numsub(rch) == 0 })
	before := redisbackend.RenewalMessages(b)
	time.Sleep(10 * renew) // the window observed, not synchronisation
	if n := redisbackend.RenewalMessages(b) - before; n != 0 {
		t.Errorf("the leader's connection received %d renewal messages over 10 of its renewals, want 0", n)
	}

	f := newElector(b, "f")
	rec.Campaign(t, f)
	eventually(t, "a follower in the leader's process subscribes to the renewals channel", func() bool { return numsub(rch) == 1 })
	before = redisbackend.RenewalMessages(b)
	time.Sleep(10 * renew) // the window observed, not synchronisation
	if n := redisbackend.RenewalMessages(b) - before; n < 5 {
		t.Errorf("the connection with a follower received %d renewal messages over 10 renewals, want about 10", n)
	}

	if err := a.Resign(ctxBound(t)); err != nil {
		t.Fatal(err)
	}
	electortest.Eventually(t, "f leads", f.IsLeader)
	// a follows now and wants the renewals, f leads and does not: one
	// subscription of the connection.
	eventually(t, "a, a follower again, keeps the renewals channel subscribed", func() bool { return numsub(rch) == 1 })
	before = redisbackend.RenewalMessages(b)
	time.Sleep(10 * renew) // the window observed, not synchronisation
	if n := redisbackend.RenewalMessages(b) - before; n < 5 {
		t.Errorf("a, a follower again, received %d renewal messages over 10 of f's renewals, want about 10", n)
	}
	if a.IsLeader() {
		t.Error("a leads again while f renews")
	}
	electortest.CheckNoOverlap(t, rec.Intervals())
}

// TestMutedLeaderKeepsItsConnectionAwake: a process leading elections
// keeps one muted watch's renewals channel subscribed on its connection
// (the hub's beacon), so that its own renewals keep the connection from
// falling silent and it is not pinged: an idle leader at TTL 2 s sent 60
// renewals and 2 PINGs a minute. The other leaders' channels are left, so
// that the connection receives one election's renewals, not every one's;
// the beacon's leaves with its watch.
func TestMutedLeaderKeepsItsConnectionAwake(t *testing.T) {
	srv := testredis.Start(t)
	admin := srv.NewClient(t, nil)
	numsub := func(channel string) int64 { return numSub(t, admin, channel) }
	pings := func() int { return redisbackend.CommandCalls(context.Background(), admin, "ping") }
	// Silent for 300 ms, the connection is pinged; the leaders renew every
	// 100 ms.
	const renew = 100 * time.Millisecond
	b := newBackend(t, srv.NewClient(t, &redis.Options{ContextTimeoutEnabled: true}), &redisbackend.Options{HealthCheckInterval: 300 * time.Millisecond})
	var es []*sovereign.Elector
	for _, name := range []string{"daemon", "cron"} {
		e, err := sovereign.New(b, name, "a", &sovereign.Options{TTL: electorTTL, RenewInterval: renew, Logger: electortest.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		(&electortest.Recorder{}).Campaign(t, e)
		es = append(es, e)
	}
	for _, e := range es {
		electortest.Eventually(t, "both lead", e.IsLeader)
	}
	rchs := []string{redisbackend.RenewalsChannel(b, "daemon"), redisbackend.RenewalsChannel(b, "cron")}
	eventually(t, "one renewals channel kept, the other left", func() bool { return numsub(rchs[0])+numsub(rchs[1]) == 1 })
	kept := 0
	if numsub(rchs[1]) == 1 {
		kept = 1
	}
	p0, m0 := pings(), redisbackend.RenewalMessages(b)
	time.Sleep(20 * renew) // the window observed, not synchronisation
	if n := pings() - p0; n != 0 {
		t.Errorf("the leaders' connection was pinged %d times in %v of renewals every %v, want 0 (its beacon keeps it awake)", n, 20*renew, renew)
	}
	if n := redisbackend.RenewalMessages(b) - m0; n < 10 || n > 30 {
		t.Errorf("the connection received %d renewal messages over 20 renewals of each of 2 leaders, want about 20 (one election's)", n)
	}

	// The beacon's elector closes: its channel is left.
	es[kept].Close()
	eventually(t, "the beacon's channel left with its watch", func() bool { return numsub(rchs[kept]) == 0 })
	if n := numsub(rchs[1-kept]); n != 0 {
		t.Errorf("subscribers of the other leader's renewals channel: %d, want 0", n)
	}
	es[1-kept].Close()
}

// numSub returns the subscribers of channel as the server counts them
// (PUBSUB NUMSUB).
func numSub(t *testing.T, admin *redis.Client, channel string) int64 {
	t.Helper()
	m, err := admin.PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Fatalf("PUBSUB NUMSUB %s: %v", channel, err)
	}
	return m[channel]
}
