package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sovereign-go/sovereign"
)

// idleRates is the requests per minute of an idle leader and an idle
// follower.
type idleRates struct {
	leader, follower float64
}

// idle measures, at lease TTL ttl for every implementation (Sovereign's
// other options at their defaults), the backend requests per minute of an
// idle leader and an idle follower of one election: Sovereign on Redis
// (counted at the server with MONITOR, so pub/sub health-check pings count
// too), Sovereign on etcd and etcd concurrency.Election (counted with gRPC
// interceptors: unary calls plus messages sent on streams). All three run
// at once over the same window, after settle.
//
// renew, if not zero, is Sovereign's RenewInterval (see electionCadence).
func (e *env) idle(ttl, renew, settle, window time.Duration) (map[string]idleRates, error) {
	name := e.name(fmt.Sprintf("idle%d", int(ttl/time.Second)))
	var sov []*sovCandidate
	var els []*elCandidate
	defer func() {
		for _, c := range sov {
			c.close()
		}
		for _, c := range els {
			c.close()
		}
	}()
	for _, k := range []kind{kindRedis, kindEtcd} {
		for _, id := range []string{"a", "b"} {
			c, err := e.newSovCandidate(k, name+"-"+string(k), fmt.Sprintf("%s-%s-%s", name, k, id), sovereign.Options{TTL: ttl, RenewInterval: renew})
			if err != nil {
				return nil, err
			}
			sov = append(sov, c)
		}
	}
	pfx := name + "-election"
	for _, id := range []string{"a", "b"} {
		c, err := e.newElCandidate(pfx, id, int(ttl/time.Second))
		if err != nil {
			return nil, err
		}
		els = append(els, c)
		if id == "a" {
			if err := waitElected(c, 10*time.Second); err != nil {
				return nil, err
			}
		}
	}
	if err := waitCampaigners(els[0].cli, pfx, 2, 10*time.Second); err != nil {
		return nil, err
	}
	roles := func(pair []*sovCandidate) (l, f *sovCandidate, err error) {
		l, err = waitSovLeader(pair, 15*time.Second)
		if err != nil {
			return nil, nil, err
		}
		f = pair[0]
		if f == l {
			f = pair[1]
		}
		return l, f, nil
	}
	rl, rf, err := roles(sov[0:2])
	if err != nil {
		return nil, err
	}
	el, ef, err := roles(sov[2:4])
	if err != nil {
		return nil, err
	}
	time.Sleep(settle) // let start-up traffic pass

	mon, err := startMonitor(e.redis.Addr())
	if err != nil {
		return nil, err
	}
	e0l, e0f := el.etcdCtr.requests(), ef.etcdCtr.requests()
	c0l, c0f := els[0].ctr.requests(), els[1].ctr.requests()
	t0 := time.Now()
	time.Sleep(window)
	wall := time.Since(t0)
	counts := mon.stop()
	e1l, e1f := el.etcdCtr.requests(), ef.etcdCtr.requests()
	c1l, c1f := els[0].ctr.requests(), els[1].ctr.requests()

	admin := newRedisClient(e.redis.Addr(), "bench-admin", nil)
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	names, err := clientNames(ctx, admin)
	if err != nil {
		return nil, err
	}
	var redisL, redisF int64
	for addr, n := range counts {
		switch names[addr] {
		case rl.id:
			redisL += n
		case rf.id:
			redisF += n
		}
	}
	if !rl.e.IsLeader() || !el.e.IsLeader() {
		return nil, fmt.Errorf("idle: a leader lost its leadership during the window")
	}
	perMin := func(n int64) float64 { return float64(n) * float64(time.Minute) / float64(wall) }
	return map[string]idleRates{
		colSovRedis: {perMin(redisL), perMin(redisF)},
		colSovEtcd:  {perMin(e1l - e0l), perMin(e1f - e0f)},
		colElection: {perMin(c1l - c0l), perMin(c1f - c0f)},
	}, nil
}

// electionCadence is how often an etcd concurrency.Session sends its
// keep-alive at lease TTL ttl: the client schedules the next one TTL/3
// after a reply and sends it on the first tick of its 500 ms ticker after
// that, so about every TTL/3 rounded up to 500 ms (3.5 s at TTL 10 s, 1 s
// at TTL 2 s).
func electionCadence(ttl time.Duration) time.Duration {
	const tick = 500 * time.Millisecond
	return (ttl/3 + tick - 1) / tick * tick
}
